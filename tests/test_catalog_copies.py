"""The protocol modules' private copies of other modules' constants agree with them.

protocol.frame, protocol.message and protocol.telemetry read catalog, sign and version
constants as ``_NAME = const(value)`` copies of their own: MicroPython's compiler folds
those (a name from another module is a dict lookup at run time, and an imported one a
slot in the importing module's dict on the MCU: issue 24's boot heap). Each copy
``_X`` must equal ``X`` of protocol.catalog, protocol.sign, protocol.message,
protocol.frame, protocol.cbor or protocol (VERSION_*).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import protocol
from protocol import catalog as C
from protocol import message, sign

ROOT = Path(__file__).resolve().parent.parent
COPIERS = ("frame.py", "message.py", "telemetry.py")
# protocol.telemetry's field indexes (const()-private there; test_telemetry_field_indexes)
FIELD_INDEXES = ("UPTIME_S", "STATE", "REASON", "FAULTS", "TEMP_GPU", "TEMP_VRAM", "TEMP_MOS",
                 "TEMP_AMB", "FAN1_RPM", "FAN2_RPM", "FAN1_DUTY", "FAN2_DUTY", "V_IN", "I_IN",
                 "P_IN", "TARGET", "FLASH_WRITES", "AUTH_FAILURES", "INTERNAL_ERRORS")  # fmt: skip
# copies that are not a catalog/sign/version name with a leading underscore
LOCAL = {
    "frame.py": {"_DELIMITER", "_MINOR_MASK", "_GAP_MS", "_TICKS_MASK", "_SMALL_MIN",
                 "_SMALL_MAX", "_INT_KINDS", "_IDLE", "_FIRST", "_TEXT", "_BIN",
                 "_DISCARD", "_NL", "_LBRACE"},
    "telemetry.py": {"_KIND_PLAIN", "_KIND_ENUM", "_KIND_SCALED", "_VALUE_TEXT",
                     "_CBOR_FIELD", "_JSON_HEAD", *(f"_{n}" for n in FIELD_INDEXES)},
}  # fmt: skip


def _source_value(name: str):
    from protocol import cbor, frame

    for mod in (C, sign, message, frame, cbor, protocol):
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AssertionError(f"{name}: in none of catalog, sign, message, frame, cbor, protocol")


def _copies(path: Path) -> dict[str, object]:
    out = {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.startswith("_")
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "const"
            and isinstance(node.value.args[0], ast.Constant)
        ):
            out[node.targets[0].id] = node.value.args[0].value
    return out


@pytest.mark.parametrize("name", COPIERS)
def test_copies_agree(name):
    copies = _copies(ROOT / "protocol" / name)
    checked = 0
    for private, value in copies.items():
        if private in LOCAL.get(name, ()):
            continue
        assert value == _source_value(private[1:]), (name, private, value)
        checked += 1
    assert checked >= 7, (name, sorted(copies))


def test_frame_int_kinds():
    from protocol import frame

    assert frame._INT_KINDS == (C.K_UINT, C.K_INT, C.K_ENUM)


def test_cbor_decoder_copies_agree():
    """protocol/_cbor_rx.py (the decoder, imported on demand on the MCU) copies the
    constants protocol.cbor has too: each such ``_X`` equals cbor's ``_X`` or ``X``;
    the decoder's default depth is cbor's DEFAULT_MAX_DEPTH."""
    from protocol import cbor

    copies = _copies(ROOT / "protocol" / "_cbor_rx.py")
    checked = 0
    for private, value in copies.items():
        src = getattr(cbor, private, getattr(cbor, private[1:], None))
        if src is not None:
            assert value == src, private
            checked += 1
    assert checked >= 11, sorted(copies)
    assert copies["_DEFAULT_MAX_DEPTH"] == cbor.DEFAULT_MAX_DEPTH


def test_telemetry_json_head_names_the_version():
    from protocol import telemetry

    version = f"{protocol.VERSION_MAJOR}.{protocol.VERSION_MINOR}"
    want = '{"type":"telemetry","v":"' + version + '","seq":'
    assert telemetry._JSON_HEAD == want


def test_telemetry_field_indexes():
    """protocol.telemetry's ``_NAME`` field indexes are the catalog's (index(name)), its
    public ``NAME``s the same, and device/app.py's ``_TM_NAME`` copies agree."""
    from protocol import telemetry

    copies = _copies(ROOT / "protocol" / "telemetry.py")
    for name in FIELD_INDEXES:
        assert copies["_" + name] == telemetry.index(name.lower()), name
        assert getattr(telemetry, name) == copies["_" + name], name
    app = {k: v for k, v in _copies(ROOT / "device" / "app.py").items() if k.startswith("_TM_")}
    for private, value in app.items():
        assert value == getattr(telemetry, private[4:]), private
    assert len(app) >= 15, sorted(app)
