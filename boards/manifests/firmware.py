# The module firmware, frozen into a MicroPython image (MicroPython's manifest format:
# https://docs.micropython.org/en/latest/reference/manifest.html). Included by each
# board's manifest beside this file; built by `make firmware BOARD=<board>`.
#
# The same files `modbridge flash` copies as .mpy: boards/__init__.py,
# boards/_common.py, and every .py under device/ and protocol/ but the host-only ones
# below (host/modbridge/tools/flash.py EXCLUDE; tests/test_images.py checks that the
# two selections are equal, so a new firmware file ships in both or the test fails).
#
# Not included: MicroPython's default stm32 manifest (asyncio, dht, onewire), which the
# firmware does not use. MicroPython's manifest reader runs this file with its folder
# as the working directory: paths are relative to it.
import os

_ROOT = "../.."
_HOST_ONLY = (
    "device/calib_fit.py",  # calibration fitting runs on the host
    "protocol/catalog_doc.py",  # field descriptions, for SPEC.md
    "protocol/specgen.py",  # writes SPEC.md
    "protocol/fuzz.py",  # host fuzzing harness
    "protocol/sign_host.py",  # signing, keys (host side): the module only verifies
    "protocol/vectors",  # golden vectors for the test suite
)


def _host_only(rel):
    return any(rel == e or rel.startswith(e + "/") for e in _HOST_ONLY)


module("boards/__init__.py", base_path=_ROOT)  # noqa: F821 - the manifest reader's
module("boards/_common.py", base_path=_ROOT)  # noqa: F821
for _tree in ("device", "protocol"):
    for _dir, _subdirs, _names in sorted(os.walk(os.path.join(_ROOT, _tree))):
        for _name in sorted(_names):
            _rel = os.path.relpath(os.path.join(_dir, _name), _ROOT).replace(os.sep, "/")
            if _name.endswith(".py") and not _host_only(_rel):
                module(_rel, base_path=_ROOT)  # noqa: F821
