"""Deploy the firmware to a board with ``mpy-cross`` and the real ``mpremote``.

``deploy()`` stages everything the board runs in ``build/flash/<board>/`` (compiled
``.mpy`` files, or ``.py`` with ``compile=False``, plus ``main.py``), then runs one
``mpremote`` invocation: a small prepare script on the board (removes the previous
firmware's ``device/``, ``protocol/`` and ``boards/`` so a stale ``.py`` cannot shadow
a new ``.mpy``, and writes the default config only when the board has none), a
recursive ``fs cp``, and ``reset``. The CLI (``modbridge flash``) only parses and
prints; errors are :class:`FlashError` with a one-line message.

With a key store (``keys=``, what ``modbridge flash`` passes unless ``--no-key``) the
board is also provisioned with its signing secret (docs/pairing.md), in two mpremote
invocations: the prepare script runs alone and prints the board's unique id
(``machine.unique_id()``, the id its hello will carry); the key is the store's key
for that id, else a new one; the second invocation copies the firmware and the key
(``secret.key``, from a 0600 file beside the staging directory that is removed
afterwards) and resets. The host copy is kept as pending before the copy and becomes
``<uid>.key`` once mpremote succeeded. A board that reports no unique id is flashed
without a key (a note says to pair it: ``modbridge pair``).

**Image boards** (the stm32 ones: ``firmware/stm32.py`` ``BOARDS``) take the firmware
frozen into a MicroPython image (``make firmware BOARD=<board>``, in
``build/firmware/<board>/``): their heap cannot hold the firmware imported from .mpy
files, so the .mpy deploy is refused for them with what to do instead
(docs/boards.md). ``deploy()`` then first writes the image the way the board is
flashed (:func:`image_commands`: ``dfu-util`` for the BlackPill and the pyboard in
their ROM DFU mode; ``st-flash``, ``openocd`` or the ST-LINK's drive for the NUCLEO),
waits for the board's REPL port to come back, and runs the mpremote step above with
``main.py`` as the only staged file (plus the default config and the key).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from firmware import mpsource
from firmware.allowlist import MPY_OPT, firmware_files
from modbridge.errors import ModbridgeError
from modbridge.tools.mpy import CODE_ROOT

if TYPE_CHECKING:  # pragma: no cover
    from modbridge.link.keys import KeyStore

log = logging.getLogger(__name__)

#: Entry point on the board: ``main.py`` runs after boot.py on every hard reset.
MAIN_PY = (
    "# Written by `modbridge flash` for the {board} board. Starts the module firmware\n"
    "# (device/README.md); a `repl` command from the host hands the port back.\n"
    "from device.main import run\n"
    "\n"
    "run({board!r})\n"
)


def main_py(board: str) -> str:
    """The board's ``main.py``: run the firmware on that board's HAL."""
    return MAIN_PY.format(board=board)
PREPARE_NAME = "prepare.py"
SECRET_FILE = "secret.key"  # the firmware's signing secret (device/app.py), beside config
UID_MARK = "modbridge-uid"  # the prepare script prints "modbridge-uid <hex>|none"
_BOARD_ARCH = object()  # sentinel: use the board's arch from boards.BOARDS


class FlashError(ModbridgeError):
    """Deploying failed; the message says what to do."""


class UnknownBoard(FlashError):
    """A board name not in boards.BOARDS: a usage error."""

    exit_code = 2


#: Where ``make firmware`` (``python -m firmware.stm32``) puts each board's image:
#: build/firmware/ in a checkout, the user's build directory when installed
#: (firmware/mpsource.py BUILD_ROOT). Looked in first.
IMAGE_DIR = mpsource.BUILD_ROOT / "firmware"
#: The images a wheel built by ``make dist`` carries (modbridge/_fw/images/<board>/).
PACKAGED_IMAGES = CODE_ROOT / "images"
#: How to get an image into a wheel without one (what a missing image says).
IMAGE_HOWTO = (
    "install a modbridge wheel built with `make dist` (it carries the stm32 images), or "
    "build the image: MICROPY_DIR=<MicroPython 1.28.0 source> python -m "
    "modbridge.tools.image {board} (needs gcc-arm-none-eabi; docs/install.md)"
)
#: Flash addresses of the two parts of MicroPython's F4 images (TEXT0_ADDR, TEXT1_ADDR
#: in each board's mpconfigboard.mk): sector 0 with the vector table, then the
#: application region after the filesystem sectors.
TEXT0_ADDR = "0x08000000"
TEXT1_ADDR = "0x08020000"
DFU_ID = "0483:df11"  # the STM32 ROM bootloader in DFU mode
#: How to put each DFU board into its ROM bootloader.
ENTER_DFU = {
    "blackpill_f411": "hold BOOT0, press and release NRST, then release BOOT0",
    "pyboard_v11": "wire the DFU pin to 3V3, press RST (remove the wire after flashing)",
}
#: Image flashing methods by the board's kind (firmware/stm32.py flash_method); the
#: first is the default. tool: (executable, Debian package).
METHODS = {"dfu": ("dfu",), "stlink": ("stlink", "openocd", "drive")}
TOOLS = {
    "dfu": ("dfu-util", "dfu-util"),
    "stlink": ("st-flash", "stlink-tools"),
    "openocd": ("openocd", "openocd"),
    "drive": ("cp", "coreutils"),
}
IMAGE_FILES = {
    "dfu": ("firmware.dfu",),
    "stlink": ("firmware0.bin", "firmware1.bin"),
    "openocd": ("firmware.hex",),
    "drive": ("firmware.bin",),
}
PORT_WAIT_S = 30  # for the REPL port to come back after the image is written


def image_boards() -> dict[str, str]:
    """Board name -> its image's flash kind (``dfu`` / ``stlink``)."""
    _checkout()
    from firmware.stm32 import BOARDS

    return {name: spec.flash_method for name, spec in BOARDS.items()}


def mpy_refusal(board: str, port: str) -> str:
    """Why ``board`` gets no .mpy deploy, and what to run instead."""
    return (
        f"{board}: the .mpy deploy does not fit this board's RAM (MicroPython leaves an "
        "STM32F4 about 90-100 KB of heap; importing the firmware from .mpy files ran out "
        "of memory at ~95 KB on ARM): flash the image with the firmware frozen in, "
        f"`make flash BOARD={board} PORT={port}` (builds it), or `make firmware "
        f"BOARD={board}` then `modbridge flash --board {board} --port {port}` "
        "(docs/boards.md)"
    )


def find_image_dir(board: str, method: str | None = None) -> Path:
    """The folder holding ``board``'s image: the one built here (:data:`IMAGE_DIR`)
    if it has the files ``method`` writes, else the wheel's (:data:`PACKAGED_IMAGES`)
    if that has them, else :data:`IMAGE_DIR` (where a build would put them)."""
    names = IMAGE_FILES[method or METHODS[image_boards()[board]][0]]
    for base in (IMAGE_DIR, PACKAGED_IMAGES):
        if all((base / board / name).is_file() for name in names):
            return base
    return IMAGE_DIR


def image_commands(
    board: str, method: str | None = None, drive: str | None = None, image_dir: Path | None = None
) -> tuple[str, list[list[str]]]:
    """(method, the commands that write ``board``'s image). ``drive``: the mount point
    of a NUCLEO's ST-LINK drive (method ``drive``)."""
    kind = image_boards()[board]
    method = method or METHODS[kind][0]
    if method not in METHODS[kind]:
        raise FlashError(
            f"{board} is flashed with {' or '.join(METHODS[kind])}, not {method!r}"
        )
    d = (image_dir or find_image_dir(board, method)) / board
    if method == "dfu":
        return method, [
            ["dfu-util", "-a", "0", "-d", DFU_ID, "-D", str(d / "firmware.dfu"), "-s", ":leave"]
        ]
    if method == "stlink":  # two writes: the filesystem sectors between them are kept
        return method, [
            ["st-flash", "write", str(d / "firmware0.bin"), TEXT0_ADDR],
            ["st-flash", "--reset", "write", str(d / "firmware1.bin"), TEXT1_ADDR],
        ]
    if method == "openocd":
        prog = f"program {d / 'firmware.hex'} verify reset exit"
        return method, [["openocd", "-f", "board/st_nucleo_f4.cfg", "-c", prog]]
    if not drive:
        raise FlashError(
            f"{board}: give the ST-LINK drive's mount point (--drive, e.g. "
            "/media/$USER/NODE_F411RE)"
        )
    return method, [["cp", str(d / "firmware.bin"), drive.rstrip("/") + "/"], ["sync"]]


def image_notes(board: str, method: str) -> list[str]:
    base = find_image_dir(board, method)
    if base == PACKAGED_IMAGES:
        notes = [f"flashes the image this modbridge carries ({base / board})"]
    elif (base / board).is_dir():
        notes = [f"flashes the image in {base / board} (make firmware BOARD={board})"]
    else:
        notes = [f"no image for {board} yet: " + _image_howto(board)]
    if method == "dfu":
        notes.append(
            f"put the board in DFU mode first: {ENTER_DFU[board]} (`dfu-util -l` lists "
            f"{DFU_ID}); a board already running MicroPython: `mpremote connect <port> "
            "bootloader`"
        )
    if method == "drive":
        notes.append(
            "firmware.bin spans the filesystem sectors (0xFF): the copy erases the "
            "filesystem, so the config is written fresh and calibration is lost "
            "(--method stlink keeps it)"
        )
    return notes


def _check_image(board: str, method: str) -> None:
    """The image files and the tool a real run needs, or a FlashError saying how."""
    base = find_image_dir(board, method)
    for name in IMAGE_FILES[method]:
        if not (base / board / name).is_file():
            raise FlashError(
                f"no image for {board} ({base / board / name} is missing): "
                + _image_howto(board)
            )
    tool, package = TOOLS[method]
    if shutil.which(tool) is None:
        raise FlashError(f"{tool} not found: install it (Debian: apt-get install {package})")


def _image_howto(board: str) -> str:
    """What to run for ``board``'s image: ``make firmware`` in a checkout, else
    :data:`IMAGE_HOWTO`."""
    if mpsource.INSTALLED:
        return IMAGE_HOWTO.format(board=board)
    return f"run `make firmware BOARD={board}`"


def _wait_for_port(port: str, timeout_s: float = PORT_WAIT_S) -> None:
    """The REPL port reappears when the new image has booted."""
    if not port.startswith("/"):
        return
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(port):
        if time.monotonic() > deadline:
            raise FlashError(
                f"image written, but {port} did not come back within {timeout_s:.0f} s: "
                "reset the board (BOOT0 released) and run the same command again"
            )
        time.sleep(0.2)


@dataclass
class Plan:
    """What ``deploy`` did or, in a dry run, would do."""

    board: str
    staging: Path
    files: list[str] = field(default_factory=list)  # paths inside staging, posix
    commands: list[list[str]] = field(default_factory=list)  # mpremote, cwd = staging
    image_commands: list[list[str]] = field(default_factory=list)  # run first (image boards)
    notes: list[str] = field(default_factory=list)
    uid: str | None = None  # the board's unique id (provisioning only; after the run)
    key_path: str | None = None  # the host's copy of its key (provisioning only)

    def command_lines(self) -> list[str]:
        cd = f"cd {shlex.quote(str(self.staging))} && "
        return [shlex.join(c) for c in self.image_commands] + [
            cd + shlex.join(c) for c in self.commands
        ]


def _checkout() -> None:
    """The firmware beside the protocol package (importing modbridge put its folder,
    modbridge/_fw/ or the checkout's root, on sys.path), or a FlashError."""
    if not (CODE_ROOT / "boards" / "__init__.py").is_file():
        raise FlashError(f"no firmware beside the protocol package ({CODE_ROOT})")


def board_names() -> list[str]:
    _checkout()
    from boards import BOARDS

    return sorted(BOARDS)


def board_entry(board: str) -> tuple[str, str | None]:
    _checkout()
    from boards import BOARDS

    if board not in BOARDS:
        raise UnknownBoard(f"unknown board {board!r}; valid boards: {', '.join(board_names())}")
    return BOARDS[board]


def firmware_sources(board: str, root: Path = CODE_ROOT) -> list[str]:
    """Every .py the board needs, relative to ``root`` (posix), sorted."""
    modname, _ = board_entry(board)
    board_file = modname.replace(".", "/") + ".py"
    if not (root / board_file).is_file():
        raise FlashError(f"board {board!r} has no module yet ({board_file} is missing)")
    return firmware_files(str(root), board_file)  # the one allow-list


def find_tool(name: str) -> str:
    """A command next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise FlashError(f"{name} not found: run `make setup` (installs it into .venv)")
    return found


def default_config(root: Path = CODE_ROOT) -> tuple[str | None, str | None, str]:
    """(file name, text, note) of the factory config from ``device.config``, if any."""
    if not (root / "device" / "config.py").is_file():
        return None, None, "device/config.py does not exist yet: no default config written"
    try:
        cfg = importlib.import_module("device.config")
    except Exception as e:  # noqa: BLE001 - a half-written module must not stop a flash
        return None, None, f"device.config failed to import ({e}): no default config written"
    defaults = getattr(cfg, "DEFAULTS", None)
    if defaults is None:
        return None, None, "device.config has no DEFAULTS: no default config written"
    name = getattr(cfg, "FILE_NAME", "config.json")
    encode = getattr(cfg, "encode_file", None)
    if encode is None:  # a file without the firmware's envelope (version, CRC) is "corrupt"
        return None, None, "device.config has no encode_file: no default config written"
    text = encode(defaults)
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode()
    return name, text, f"default config {name} is written only if the board has none"


def prepare_script(
    remote_dir: str, config_name: str | None, config_text: str | None, report_uid: bool = False
) -> str:
    """MicroPython code run on the board before copying (see module docstring).

    ``report_uid``: also print ``modbridge-uid <hex>`` (``none`` if the board has no
    ``machine.unique_id``)."""
    lines = [
        "# Generated by modbridge flash; runs on the board before the copy.",
        "import os",
        f"D = {remote_dir.rstrip('/')!r}",
        "def _j(a, b):",
        "    return a + '/' + b if a else b",
        "def _rm(p):",
        "    try:",
        "        st = os.stat(p)",
        "    except OSError:",
        "        return",
        "    if st[0] & 0x4000:",
        "        for e in os.listdir(p):",
        "            _rm(_j(p, e))",
        "        os.rmdir(p)",
        "    else:",
        "        os.remove(p)",
        "for t in ('device', 'protocol', 'boards'):",
        "    _rm(_j(D, t))",
    ]
    if config_name and config_text is not None:
        lines += [
            f"C = _j(D, {config_name!r})",
            "try:",
            "    os.stat(C)",
            "except OSError:",
            "    with open(C + '.tmp', 'w') as f:",
            f"        f.write({config_text!r})",
            "    os.rename(C + '.tmp', C)",
        ]
    if report_uid:
        lines += [
            "try:",
            "    import machine",
            "    U = ''.join(['%02x' % b for b in machine.unique_id()])",
            "except (ImportError, AttributeError):",
            "    U = 'none'",
            f"print({UID_MARK!r}, U)",
        ]
    return "\n".join(lines) + "\n"


def parse_uid(output: str) -> str | None:
    """The unique id the prepare script printed (None: the board has none)."""
    for line in (output or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == UID_MARK:
            uid = parts[1].lower()
            if uid != "none" and all(c in "0123456789abcdef" for c in uid) and 2 <= len(uid):
                return uid
            return None
    return None


def _remote(remote_dir: str, name: str) -> str:
    d = remote_dir.rstrip("/")
    return ":" + (f"{d}/{name}" if d else name)


def stage(
    board: str,
    staging: Path,
    *,
    files: Sequence[str] | None = None,
    compile: bool = True,
    march: str | None | object = _BOARD_ARCH,
    root: Path = CODE_ROOT,
) -> list[str]:
    """Fill ``staging`` with what goes on the board; returns the staged paths."""
    _, arch = board_entry(board)
    if march is _BOARD_ARCH:
        march = arch
    sources = list(files) if files is not None else firmware_sources(board, root)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    mpy_cross = find_tool("mpy-cross") if compile else None
    staged = []
    for rel in sources:
        src = root / rel
        if compile:
            out_rel = rel[:-3] + ".mpy"
            dst = staging / out_rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            argv = [mpy_cross, f"-O{MPY_OPT}"] + ([f"-march={march}"] if march else [])
            argv += ["-o", str(dst), rel]  # -O as the images freeze (firmware/allowlist.py)
            proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise FlashError(f"mpy-cross failed on {rel}: {_last_line(proc.stderr)}")
            staged.append(out_rel)
        else:
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            staged.append(rel)
    (staging / "main.py").write_text(main_py(board))
    staged.append("main.py")
    return staged


def check_port(port: str) -> None:
    """Fail early, in one line, on a missing device node or missing permission."""
    if not port.startswith("/"):
        return  # an mpremote shortcut (auto, a0, u0, id:...) or a socket
    if not os.path.exists(port):
        raise FlashError(
            f"port {port} not found: is the board plugged in? (`mpremote connect list` shows ports)"
        )
    if not os.access(port, os.R_OK | os.W_OK):
        raise FlashError(
            f"permission denied on {port}: add yourself to the dialout group "
            "(`sudo usermod -aG dialout $USER`, then log in again)"
        )


def mpremote_commands(
    mpremote: Sequence[str],
    port: str,
    staged: Sequence[str],
    prepare_path: Path,
    remote_dir: str,
    *,
    resume: bool,
    reset: bool,
) -> list[list[str]]:
    """The mpremote invocation (run with cwd = staging)."""
    tops = sorted({p.split("/", 1)[0] for p in staged})
    dest = ":" + (remote_dir or ".")
    argv = [*mpremote, "connect", port]
    if resume:
        argv.append("resume")
    argv += ["run", str(prepare_path), "+", "fs", "cp", "-r", *tops, dest]
    if reset:
        argv += ["+", "reset"]
    return [argv]


def provision_commands(
    mpremote: Sequence[str],
    port: str,
    staged: Sequence[str],
    prepare_path: Path,
    secret_path: Path | None,
    remote_dir: str,
    *,
    resume: bool,
    reset: bool,
) -> list[list[str]]:
    """The two invocations of a flash with a key: prepare (prints the unique id), then
    firmware + ``secret.key`` (+ reset; without the key if ``secret_path`` is None).
    Run with cwd = staging."""
    tops = sorted({p.split("/", 1)[0] for p in staged})
    head = [*mpremote, "connect", port] + (["resume"] if resume else [])
    first = [*head, "run", str(prepare_path)]
    second = [*head, "fs", "cp", "-r", *tops, ":" + (remote_dir or ".")]
    if secret_path is not None:
        second += ["+", "fs", "cp", str(secret_path), _remote(remote_dir, SECRET_FILE)]
    if reset:
        second += ["+", "reset"]
    return [first, second]


def deploy(
    board: str,
    port: str,
    *,
    files: Sequence[str] | None = None,
    dry_run: bool = False,
    mpremote_cmd: Sequence[str] | None = None,
    compile: bool = True,
    march: str | None | object = _BOARD_ARCH,
    reset: bool = True,
    resume: bool | None = None,
    remote_dir: str | None = None,
    build_dir: Path | None = None,
    timeout_s: float = 300,
    emit: Callable[[str], None] = log.info,
    keys: KeyStore | None = None,
    image: bool | None = None,
    method: str | None = None,
    drive: str | None = None,
) -> Plan:
    """Compile/stage the firmware for ``board`` and copy it to ``port`` with mpremote.

    ``march`` overrides the board's arch (None: no ``-march``, bytecode only, which the
    unix port loads). ``resume`` defaults to True for the ``sim`` board (a soft reset
    ends the unix port) and False otherwise. ``remote_dir`` defaults to the board
    module's ``FS_DIR`` ("" = the board's current directory). ``keys``: provision
    the board's signing key from/into that store (see the module docstring).

    ``image``: flash the board's MicroPython image with the firmware frozen in (the
    default, and the only way, for the stm32 boards: the .mpy deploy is refused there)
    with ``method`` (:data:`METHODS`; ``drive`` = the ST-LINK drive's mount point);
    False: the .mpy deploy (the Pico).
    """
    modname, _ = board_entry(board)
    if board == "sim":
        raise FlashError(
            "'sim' is the virtual board: it runs in the MicroPython unix port under "
            "`modbridge sim`; there is nothing to flash"
        )
    has_image = board in image_boards()
    if image is None:
        image = has_image
    if not image and has_image:
        raise FlashError(mpy_refusal(board, port))
    if image and not has_image:
        raise FlashError(
            f"{board} has no firmware image: its RAM takes the .mpy deploy "
            f"(modbridge flash --board {board} --port {port})"
        )
    if files is None:
        firmware_sources(board)  # fails first, and clearly, on a missing module
        files = [] if image else firmware_sources(board)  # an image: main.py only
    if resume is None:
        resume = board == "sim"
    if remote_dir is None:
        try:
            remote_dir = importlib.import_module(modname).FS_DIR
        except ImportError as e:
            raise FlashError(f"board {board!r}: cannot import {modname} ({e})") from e
    staging = (build_dir or mpsource.BUILD_ROOT / "flash") / board
    plan = Plan(board=board, staging=staging)
    staged = stage(board, staging, files=files, compile=compile, march=march)
    plan.files = staged
    cfg_name, cfg_text, note = default_config()
    plan.notes.append(note)
    prepare_path = staging.parent / f"{board}.{PREPARE_NAME}"
    prepare_path.write_text(prepare_script(remote_dir, cfg_name, cfg_text, keys is not None))
    mpremote = list(mpremote_cmd) if mpremote_cmd else [find_tool("mpremote")]
    if image:
        method, plan.image_commands = image_commands(board, method, drive)
        plan.notes += image_notes(board, method)
        if not dry_run:
            _check_image(board, method)
            hint = f" (in DFU mode? {ENTER_DFU[board]})" if method == "dfu" else ""
            for argv in plan.image_commands:
                _run_tool(argv, timeout_s, emit, hint)
            _wait_for_port(port)
    if keys is None:
        plan.commands = mpremote_commands(
            mpremote, port, staged, prepare_path, remote_dir, resume=resume, reset=reset
        )
        if dry_run:
            return plan
        check_port(port)
        for argv in plan.commands:
            _mpremote(argv, staging, port, timeout_s, emit)
        return plan
    secret_path = staging.parent / f"{board}.{SECRET_FILE}"
    plan.commands = provision_commands(
        mpremote, port, staged, prepare_path, secret_path, remote_dir, resume=resume, reset=reset
    )
    if dry_run:
        plan.notes.append(
            f"the first command prints the board's unique id; the key is the one in "
            f"{keys.dir}/<uid>.key, else a new one, written to {secret_path} (0600) for "
            f"the copy and removed after it"
        )
        return plan
    check_port(port)
    uid = parse_uid(_mpremote(plan.commands[0], staging, port, timeout_s, emit))
    if uid is None:
        plan.notes.append(
            "the board reports no unique id (machine.unique_id): no key provisioned; "
            f"pair it once the firmware runs: `modbridge pair {port}`"
        )
        plan.commands = provision_commands(
            mpremote, port, staged, prepare_path, None, remote_dir, resume=resume, reset=reset
        )
        _mpremote(plan.commands[1], staging, port, timeout_s, emit)
        return plan
    _provision(plan, uid, keys, staging, secret_path, port, timeout_s, emit)
    return plan


def _provision(plan: Plan, uid, keys, staging, secret_path, port, timeout_s, emit) -> None:
    """Copy the firmware and the board's key (the store's, else a new one)."""
    from modbridge.link.keys import KeyStoreError, write_key_file
    from protocol.sign import new_key

    plan.uid = uid
    try:
        key = keys.load(uid, "modbridge pair <port>")
        reused = key is not None
        if key is None:
            key = new_key()
        keys.save_pending(uid, key)
    except KeyStoreError as e:
        # the prepare step removed the old firmware: put the new one on all the same
        plan.commands[1] = _without_key(plan.commands[1])
        _mpremote(plan.commands[1], staging, port, timeout_s, emit)
        raise FlashError(f"firmware flashed, but board {uid} got no key: {e}") from None
    try:
        write_key_file(secret_path, key)
        _mpremote(plan.commands[1], staging, port, timeout_s, emit)
    except BaseException:
        keys.discard_pending(uid)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            secret_path.unlink()
    plan.key_path = str(keys.commit_pending(uid))
    plan.notes.append(
        f"board {uid}: signing key {'from' if reused else 'new, kept in'} {plan.key_path}"
    )
    if "reset" not in plan.commands[1]:
        plan.notes.append("the module reads its key at boot: reset it to start signing")


def _without_key(argv: list[str]) -> list[str]:
    """A copy command without its ``+ fs cp <secret> :secret.key`` part."""
    out = list(argv)
    for i in range(len(out) - 3):
        if out[i : i + 3] == ["+", "fs", "cp"] and out[i + 4].endswith(SECRET_FILE):
            del out[i : i + 5]
            break
    return out


def _mpremote(argv, cwd, port, timeout_s, emit) -> str:
    return _run(argv, cwd, timeout_s, emit, "mpremote", f" on {port}")


def _run_tool(argv: list[str], timeout_s: float, emit: Callable[[str], None], hint: str) -> None:
    """Run one image-writing command (dfu-util, st-flash, openocd, cp)."""
    _run(argv, None, timeout_s, emit, argv[0], hint)


def _run(argv, cwd, timeout_s, emit, name: str, context: str) -> str:
    """Run a command; its stdout, or a one-line FlashError naming the tool (``name``),
    ``context`` and the last line of what it said."""
    emit(shlex.join(argv))
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise FlashError(f"{name} timed out after {timeout_s:.0f} s{context}") from e
    if proc.returncode != 0:
        raise FlashError(
            f"{name} failed (exit {proc.returncode}){context}: "
            f"{_last_line(proc.stderr or proc.stdout)}"
        )
    return proc.stdout


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"
