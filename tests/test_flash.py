"""modbridge flash: staging, command lines, errors, and a real deploy with mpremote.

The real deploy follows DESIGN.md "Testing without hardware": the MicroPython unix
port runs ``-i`` on a raw pty behind a relay (host/modbridge/tools/pty_relay.py), the real
``mpremote connect <pty> resume run ... + fs cp -r ...`` copies the firmware into
its working directory, and a fresh ``micropython`` imports the deployed files.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from modbridge.cli.main import main
from modbridge.tools import flash
from modbridge.tools.mpy import micropython_path
from modbridge.tools.pty_relay import UnixPortBoard

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------- staging


def test_sources_are_the_allow_list():
    srcs = flash.firmware_sources("pico")
    assert "boards/pico.py" in srcs
    assert {"boards/__init__.py", "boards/_build.py", "boards/_common.py"} <= set(srcs)
    assert not any(s.startswith("boards/") and s.endswith("pyboard_v11.py") for s in srcs)
    assert "protocol/frame.py" in srcs and "device/__init__.py" in srcs
    assert "device/drivers/fan.py" in srcs and "device/control/pid.py" in srcs
    assert not any(s.startswith("protocol/vectors/") for s in srcs)
    assert all(s.endswith(".py") and "__pycache__" not in s for s in srcs)
    # the host-only halves live outside the firmware's packages (no deny-list)
    for name in ("specgen", "fuzz", "catalog_doc", "sign_host"):
        assert not (REPO_ROOT / "protocol" / f"{name}.py").exists(), name
    assert not (REPO_ROOT / "device" / "calib_fit.py").exists()


def test_every_firmware_package_directory_is_allowed_or_test_data():
    # a new package directory under device/ or protocol/ is named in the allow-list
    # (firmware/allowlist.py), or it would silently not ship
    from firmware import allowlist

    dirs = {p.parent.relative_to(REPO_ROOT).as_posix()
            for tree in ("device", "protocol") for p in (REPO_ROOT / tree).rglob("*.py")
            if "__pycache__" not in p.parts}  # fmt: skip
    assert dirs - {"protocol/vectors"} == set(allowlist.PACKAGES)


def test_stage_py_and_mpy(tmp_path):
    files = ["protocol/crc.py", "boards/__init__.py"]
    staged = flash.stage("pico", tmp_path / "py", files=files, compile=False)
    assert staged == ["protocol/crc.py", "boards/__init__.py", "main.py"]
    assert (tmp_path / "py/protocol/crc.py").read_bytes() == (REPO_ROOT / files[0]).read_bytes()
    main = (tmp_path / "py/main.py").read_text()
    assert "from device.main import run" in main and "run('pico')" in main, main
    staged = flash.stage("pico", tmp_path / "mpy", files=files)
    assert staged[:2] == ["protocol/crc.mpy", "boards/__init__.mpy"]
    head = (tmp_path / "mpy/protocol/crc.mpy").read_bytes()[:4]
    assert head[0] == ord("M") and head[1] == 6  # .mpy format v6


def test_prepare_script_compiles_and_keeps_an_existing_config():
    text = flash.prepare_script("/flash", "config.json", '{"a":1}\n')
    compile(text, "prepare.py", "exec")
    assert "D = '/flash'" in text and "os.stat(C)" in text
    assert "config" not in flash.prepare_script("/", None, None).split("import os")[1]


# ---------------------------------------------------------------------- dry run


def test_dry_run_command_lines(tmp_path):
    plan = flash.deploy("pico", "/dev/ttyACM0", dry_run=True, compile=False,
                        build_dir=tmp_path, mpremote_cmd=["mpremote"])
    (line,) = plan.command_lines()
    want = (f"cd {tmp_path}/pico && mpremote connect /dev/ttyACM0 run "
            f"{tmp_path}/pico.prepare.py + fs cp -r boards device main.py protocol "
            ":/ + reset")
    assert line == want
    assert (tmp_path / "pico" / "boards" / "pico.py").is_file()
    assert plan.image_commands == []
    plan = flash.deploy("pico", "/dev/ttyACM0", dry_run=True, compile=False, reset=False,
                        resume=True, build_dir=tmp_path, mpremote_cmd=["mpremote"])
    argv = plan.commands[0]
    assert argv[:4] == ["mpremote", "connect", "/dev/ttyACM0", "resume"]
    assert argv[-1] == ":/" and "reset" not in argv


def test_cli_dry_run(tmp_path):
    base = ["flash", "--board", "pico", "--port", "/dev/ttyACM0", "--dry-run", "--no-compile",
            "--no-reset", "--keys-dir", str(tmp_path / "keys")]
    res = CliRunner().invoke(main, [*base, "--no-key"])
    assert res.exit_code == 0, res.output
    cmd = [ln for ln in res.output.splitlines() if "mpremote" in ln]
    assert len(cmd) == 1 and "connect /dev/ttyACM0 run" in cmd[0] and "reset" not in cmd[0]
    # with a key (the default): prepare alone (prints the uid), then firmware + key
    res = CliRunner().invoke(main, base)
    assert res.exit_code == 0, res.output
    first, second = [ln for ln in res.output.splitlines() if "mpremote" in ln]
    assert first.endswith("pico.prepare.py") and "fs cp" not in first
    assert second.endswith("pico.secret.key :secret.key"), second
    assert f"the key is the one in {tmp_path / 'keys'}/<uid>.key, else a new one" in res.output
    assert not (tmp_path / "keys").exists()  # a dry run stores nothing


def test_prepare_script_reports_the_unique_id():
    text = flash.prepare_script("/flash", None, None, report_uid=True)
    compile(text, "prepare.py", "exec")
    assert "machine.unique_id()" in text and "modbridge-uid" in text
    assert flash.parse_uid("x\nmodbridge-uid 3600ABCD\n") == "3600abcd"
    assert flash.parse_uid("modbridge-uid none\n") is None
    assert flash.parse_uid("modbridge-uid ../../x\n") is None
    assert flash.parse_uid("") is None


FAKE_MPREMOTE = """
import shutil, sys
from pathlib import Path
argv = sys.argv[1:]
log = Path(sys.argv[0]).with_name("calls.txt")
with open(log, "a") as f:
    f.write(" ".join(argv) + "\\n")
board = Path(sys.argv[0]).with_name("board")
board.mkdir(exist_ok=True)
if argv[argv.index("connect") + 2] == "run":
    print("modbridge-uid " + UID)
for i, a in enumerate(argv):
    if a == "cp" and argv[i - 1] == "fs" and argv[i + 1] != "-r":
        src, dst = argv[i + 1], argv[i + 2]
        shutil.copyfile(src, board / dst.split("/")[-1].lstrip(":"))
        if FAIL:
            sys.exit("mpremote: failed mid-copy")
"""


def _fake_mpremote(tmp_path, uid="3600a1b2c3d4e5f6", fail=False):
    script = tmp_path / "fake" / "mpremote.py"
    script.parent.mkdir()
    script.write_text(f"UID = {uid!r}\nFAIL = {fail!r}\n" + FAKE_MPREMOTE)
    port = tmp_path / "ttyACM0"
    port.touch()
    return [sys.executable, str(script)], str(port), script.parent


def test_flash_provisions_a_key_and_reuses_it_on_reflash(tmp_path):
    from modbridge.link.keys import KeyStore

    mp, port, fake = _fake_mpremote(tmp_path)
    store = KeyStore(tmp_path / "keys")
    plan = flash.deploy("pico", port, compile=False, build_dir=tmp_path / "b", mpremote_cmd=mp,
                        keys=store)
    uid = "3600a1b2c3d4e5f6"
    assert plan.uid == uid and plan.key_path == str(store.path(uid))
    key = store.load(uid)
    assert key is not None and (fake / "board" / "secret.key").read_bytes() == key
    assert oct(os.stat(store.path(uid)).st_mode & 0o777) == "0o600"
    assert not (tmp_path / "b" / "pico.secret.key").exists()  # the staged copy is gone
    calls = (fake / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and calls[0].endswith("pico.prepare.py")
    assert calls[1].endswith(":secret.key + reset"), calls[1]
    assert any(f"new, kept in {store.path(uid)}" in n for n in plan.notes), plan.notes
    plan = flash.deploy("pico", port, compile=False, build_dir=tmp_path / "b", mpremote_cmd=mp,
                        keys=store)
    assert store.load(uid) == key == (fake / "board" / "secret.key").read_bytes()
    assert any(f"signing key from {store.path(uid)}" in n for n in plan.notes), plan.notes


def test_flash_without_a_unique_id_flashes_without_a_key(tmp_path):
    from modbridge.link.keys import KeyStore

    mp, port, fake = _fake_mpremote(tmp_path, uid="none")
    store = KeyStore(tmp_path / "keys")
    plan = flash.deploy("pico", port, compile=False, build_dir=tmp_path / "b", mpremote_cmd=mp,
                        keys=store, reset=False)
    assert plan.uid is None and not (fake / "board" / "secret.key").exists()
    assert any("no key provisioned" in n and "modbridge pair" in n for n in plan.notes)
    calls = (fake / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and "secret" not in calls[1] and "reset" not in calls[1]
    assert store.uids() == []


def test_flash_failure_keeps_no_host_key(tmp_path):
    from modbridge.link.keys import KeyStore

    mp, port, _fake = _fake_mpremote(tmp_path, fail=True)
    store = KeyStore(tmp_path / "keys")
    with pytest.raises(flash.FlashError, match="failed mid-copy"):
        flash.deploy("pico", port, compile=False, build_dir=tmp_path / "b", mpremote_cmd=mp,
                     keys=store)
    assert store.load("3600a1b2c3d4e5f6") is None
    assert store.load_pending("3600a1b2c3d4e5f6") is None
    assert not (tmp_path / "b" / "pico.secret.key").exists()


def test_flash_refuses_an_insecure_stored_key(tmp_path):
    from modbridge.link.keys import KeyStore

    mp, port, fake = _fake_mpremote(tmp_path)
    store = KeyStore(tmp_path / "keys")
    store.save("3600a1b2c3d4e5f6", b"k" * 32)
    store.path("3600a1b2c3d4e5f6").chmod(0o644)
    with pytest.raises(flash.FlashError, match="firmware flashed, but board .*chmod 600"):
        flash.deploy("pico", port, compile=False, build_dir=tmp_path / "b", mpremote_cmd=mp,
                     keys=store)
    assert not (fake / "board" / "secret.key").exists()
    calls = (fake / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and "fs cp -r" in calls[1] and "secret" not in calls[1], calls
    assert calls[1].endswith(" + reset")


# ---------------------------------------------------------------------- image boards

IMG = REPO_ROOT / "build" / "firmware"
MPREMOTE_PY = (
    "mpremote connect /dev/ttyACM0 run {t}/{b}.prepare.py + fs cp -r main.py :{d} + reset"
)


@pytest.mark.parametrize(
    ("board", "method", "image_lines", "fs_dir"),
    [
        ("blackpill_f411", None,
         [f"dfu-util -a 0 -d 0483:df11 -D {IMG}/blackpill_f411/firmware.dfu -s :leave"], "/flash"),
        ("pyboard_v11", "dfu",
         [f"dfu-util -a 0 -d 0483:df11 -D {IMG}/pyboard_v11/firmware.dfu -s :leave"], "/flash"),
        ("nucleo_f411re", None,
         [f"st-flash write {IMG}/nucleo_f411re/firmware0.bin 0x08000000",
          f"st-flash --reset write {IMG}/nucleo_f411re/firmware1.bin 0x08020000"], "/flash"),
        ("nucleo_f411re", "openocd",
         [f"openocd -f board/st_nucleo_f4.cfg -c 'program {IMG}/nucleo_f411re/firmware.hex "
          "verify reset exit'"], "/flash"),
    ],
)  # fmt: skip
def test_image_board_dry_run_commands(tmp_path, board, method, image_lines, fs_dir):
    plan = flash.deploy(board, "/dev/ttyACM0", dry_run=True, method=method,
                        build_dir=tmp_path, mpremote_cmd=["mpremote"])  # fmt: skip
    lines = plan.command_lines()
    assert lines[:-1] == image_lines
    assert lines[-1] == f"cd {tmp_path}/{board} && " + MPREMOTE_PY.format(t=tmp_path, b=board,
                                                                          d=fs_dir)
    assert plan.files == ["main.py"]  # the firmware itself is frozen in the image
    assert not (tmp_path / board / "device").exists()
    assert any(f"make firmware BOARD={board}" in n for n in plan.notes)
    if "dfu-util" in image_lines[0]:
        assert any(flash.ENTER_DFU[board] in n for n in plan.notes)


def test_nucleo_drive_copies_the_whole_bin_and_says_it_erases_the_filesystem(tmp_path):
    plan = flash.deploy("nucleo_f411re", "/dev/ttyACM0", dry_run=True, method="drive",
                        drive="/media/u/NODE_F411RE/", build_dir=tmp_path)  # fmt: skip
    assert plan.image_commands == [
        ["cp", f"{IMG}/nucleo_f411re/firmware.bin", "/media/u/NODE_F411RE/"], ["sync"]
    ]
    assert any("erases the filesystem" in n for n in plan.notes)
    with pytest.raises(flash.FlashError, match="ST-LINK drive's mount point"):
        flash.deploy("nucleo_f411re", "/dev/ttyACM0", dry_run=True, method="drive",
                     build_dir=tmp_path)  # fmt: skip
    with pytest.raises(flash.FlashError, match="blackpill_f411 is flashed with dfu, not 'stlink'"):
        flash.deploy("blackpill_f411", "/dev/ttyACM0", dry_run=True, method="stlink",
                     build_dir=tmp_path)  # fmt: skip


@pytest.mark.parametrize("board", ["blackpill_f411", "nucleo_f411re", "pyboard_v11"])
def test_mpy_deploy_is_refused_where_it_cannot_fit(tmp_path, board):
    with pytest.raises(flash.FlashError) as e:
        flash.deploy(board, "/dev/ttyACM0", dry_run=True, image=False, build_dir=tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{board}: the .mpy deploy does not fit this board's RAM")
    assert f"make flash BOARD={board} PORT=/dev/ttyACM0" in msg
    assert not (tmp_path / board).exists()  # refused before staging anything
    res = CliRunner().invoke(main, ["flash", "--board", board, "--port", "/dev/ttyACM0",
                                    "--mpy", "--dry-run", "--no-key"])  # fmt: skip
    assert res.exit_code == 1 and "does not fit this board's RAM" in res.output


def test_pico_has_no_image():
    with pytest.raises(flash.FlashError, match="pico has no firmware image: its RAM takes"):
        flash.deploy("pico", "/dev/ttyACM0", dry_run=True, image=True)


def test_image_boards_are_the_stm32_boards():
    from boards import BOARDS

    images = flash.image_boards()
    assert sorted(images) == ["blackpill_f411", "nucleo_f411re", "pyboard_v11"]
    assert all(BOARDS[b][1] == "armv7emsp" for b in images)
    assert set(flash.ENTER_DFU) == {b for b, kind in images.items() if kind == "dfu"}


def _fake_tool(bin_dir, name, log):
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"open({str(log)!r}, 'a').write(' '.join(sys.argv) + '\\n')\n")  # fmt: skip
    path.chmod(0o755)
    return path


def _dfu_image(tmp_path, monkeypatch, board):
    """A fake image for ``board`` in a temporary IMAGE_DIR and a bin/ first on PATH."""
    image_dir = tmp_path / "images"
    (image_dir / board).mkdir(parents=True)
    (image_dir / board / "firmware.dfu").write_bytes(b"DfuSe")
    monkeypatch.setattr(flash, "IMAGE_DIR", image_dir)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return image_dir, bin_dir


def test_image_flash_runs_the_flasher_then_mpremote(tmp_path, monkeypatch):
    image_dir, bin_dir = _dfu_image(tmp_path, monkeypatch, "blackpill_f411")
    log = tmp_path / "calls.log"
    _fake_tool(bin_dir, "dfu-util", log)
    mpremote = _fake_tool(bin_dir, "mpremote", log)
    port = tmp_path / "ttyACM0"
    port.touch()
    plan = flash.deploy("blackpill_f411", str(port), build_dir=tmp_path / "stage",
                        mpremote_cmd=[str(mpremote)])  # fmt: skip
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    assert calls[0].endswith(f"dfu-util -a 0 -d 0483:df11 -D {image_dir}/blackpill_f411/"
                             "firmware.dfu -s :leave")  # fmt: skip
    assert f"connect {port} run" in calls[1] and "fs cp -r main.py :/flash + reset" in calls[1]
    assert (plan.staging / "main.py").read_text() == flash.main_py("blackpill_f411")


def test_image_flash_errors_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(flash, "IMAGE_DIR", tmp_path / "none")
    with pytest.raises(flash.FlashError, match=r"no image for nucleo_f411re .*"
                       r"run `make firmware BOARD=nucleo_f411re`"):  # fmt: skip
        flash.deploy("nucleo_f411re", "/dev/ttyACM0", build_dir=tmp_path)
    (tmp_path / "none" / "nucleo_f411re").mkdir(parents=True)
    for name in ("firmware0.bin", "firmware1.bin"):
        (tmp_path / "none" / "nucleo_f411re" / name).write_bytes(b"\0")
    monkeypatch.setattr(flash.shutil, "which", lambda tool: None)
    with pytest.raises(flash.FlashError, match="st-flash not found.*apt-get install stlink-tools"):
        flash.deploy("nucleo_f411re", "/dev/ttyACM0", build_dir=tmp_path)


def test_a_failing_flasher_stops_before_mpremote(tmp_path, monkeypatch):
    _, bin_dir = _dfu_image(tmp_path, monkeypatch, "pyboard_v11")
    (bin_dir / "dfu-util").write_text(
        "#!/bin/sh\necho 'dfu-util: No DFU capable USB device available' >&2\nexit 74\n"
    )
    (bin_dir / "dfu-util").chmod(0o755)
    with pytest.raises(flash.FlashError) as e:
        flash.deploy("pyboard_v11", "/dev/ttyACM0", build_dir=tmp_path,
                     mpremote_cmd=["false"])  # fmt: skip
    assert str(e.value) == (
        f"dfu-util failed (exit 74) (in DFU mode? {flash.ENTER_DFU['pyboard_v11']}): "
        "dfu-util: No DFU capable USB device available"
    )


# ---------------------------------------------------------------------- errors


def test_unknown_board_lists_valid_ones():
    with pytest.raises(flash.FlashError) as e:
        flash.deploy("stm32f072", "/dev/ttyUSB0", dry_run=True)
    msg = str(e.value)
    assert "unknown board 'stm32f072'" in msg
    assert "blackpill_f411, nucleo_f411re, pico, pyboard_v11, sim" in msg
    res = CliRunner().invoke(main, ["flash", "--board", "nope", "--port", "/dev/x"])
    assert res.exit_code == 2 and "unknown board 'nope'" in res.output


def test_sim_board_is_not_flashable():
    with pytest.raises(flash.FlashError, match="virtual board.*modbridge sim"):
        flash.deploy("sim", "/dev/pts/9", dry_run=True)


def test_board_without_module_yet(tmp_path):
    (tmp_path / "boards").mkdir()
    with pytest.raises(flash.FlashError, match="no module yet"):
        flash.firmware_sources("pico", root=tmp_path)


def test_missing_port(tmp_path):
    with pytest.raises(flash.FlashError, match="not found: is the board plugged in"):
        flash.deploy("pico", "/dev/ttyNOPE9", compile=False, build_dir=tmp_path)


def test_permission_denied_says_dialout(tmp_path, monkeypatch):
    port = tmp_path / "ttyACM0"
    port.touch()
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(flash.FlashError, match="permission denied.*dialout group"):
        flash.deploy("pico", str(port), compile=False, build_dir=tmp_path)


def test_mpremote_failure_shows_its_stderr(tmp_path):
    port = tmp_path / "ttyUSB0"
    port.touch()
    fake = [sys.executable, "-c",
            "import sys; sys.stderr.write('mpremote: could not enter raw repl\\n'); sys.exit(1)"]
    with pytest.raises(flash.FlashError) as e:
        flash.deploy("pico", str(port), compile=False, build_dir=tmp_path, mpremote_cmd=fake)
    assert str(e.value) == f"mpremote failed (exit 1) on {port}: mpremote: could not enter raw repl"


def test_mpy_cross_failure_names_the_file(tmp_path):
    bad = tmp_path / "src"
    (bad / "protocol").mkdir(parents=True)
    (bad / "protocol" / "broken.py").write_text("def (:\n")
    with pytest.raises(flash.FlashError, match="mpy-cross failed on protocol/broken.py"):
        flash.stage("pico", tmp_path / "out", files=["protocol/broken.py"], root=bad)


# ---------------------------------------------------------------------- real deploy


def _deploy_to_unix_port(tmp_path, compile):
    board_dir = tmp_path / "board"
    board_dir.mkdir()
    with UnixPortBoard(board_dir, heapsize="4M") as board:
        plan = flash.deploy(
            "pico", board.path, compile=compile, march=None, reset=False, resume=True,
            remote_dir="", build_dir=tmp_path / "stage", timeout_s=60,
        )
        assert board.proc.poll() is None, "the unix port died during the deploy"
    return board_dir, plan


def _import_deployed(board_dir, tmp_path):
    code = (
        "import protocol.frame, protocol.crc, device, boards, boards.pico\n"
        "import device.app, device.main\n"  # the whole firmware: drivers, control, config
        "print(protocol.frame.MAX_FRAME, protocol.crc.crc16(b'123456789'), device.FW_VERSION,"
        " boards.BOARDS['pico'][1], boards.pico.NAME, device.app.BANNER.replace(' ', '_'))\n"
    )
    proc = subprocess.run(
        [micropython_path(), "-c", code],
        cwd=tmp_path,
        env={"MICROPYPATH": str(board_dir), "PATH": os.environ.get("PATH", "")},
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


def _expected_import_output():
    import device
    from protocol import crc, frame

    return [str(frame.MAX_FRAME), str(crc.crc16(b"123456789")), device.FW_VERSION,
            "armv6m", "pico", "MODULER_READY_v" + device.FW_VERSION]


def test_deploy_py_files_to_the_unix_port(tmp_path):
    board_dir, plan = _deploy_to_unix_port(tmp_path, compile=False)
    # Byte for byte what was staged from the repo (others may edit device/ meanwhile) ...
    assert sorted(plan.files) == sorted(flash.firmware_sources("pico") + ["main.py"])
    for rel in plan.files:
        assert (board_dir / rel).read_bytes() == (plan.staging / rel).read_bytes(), rel
    # ... and, for files that do not change under us, the repo itself.
    for rel in ("boards/__init__.py", "boards/_common.py", "boards/pico.py", "protocol/crc.py"):
        assert (board_dir / rel).read_bytes() == (REPO_ROOT / rel).read_bytes(), rel
    assert (board_dir / "main.py").read_text() == flash.main_py(plan.board)
    assert not (board_dir / "protocol" / "specgen.py").exists()
    if plan.notes[0].startswith("default config"):
        assert (board_dir / "config.json").is_file()
    assert _import_deployed(board_dir, tmp_path) == _expected_import_output()


def test_deploy_mpy_files_to_the_unix_port(tmp_path):
    board_dir, plan = _deploy_to_unix_port(tmp_path, compile=True)
    staged = [p for p in plan.files if p.endswith(".mpy")]
    assert staged and all((board_dir / p).read_bytes() == (plan.staging / p).read_bytes()
                          for p in staged)
    assert not list(board_dir.glob("protocol/*.py")), "only .mpy must be on the board"
    assert _import_deployed(board_dir, tmp_path) == _expected_import_output()


def test_redeploy_removes_stale_sources(tmp_path):
    """A .py left by a --no-compile deploy would shadow the new .mpy: prepare removes it."""
    board_dir = tmp_path / "board"
    board_dir.mkdir()
    (board_dir / "protocol").mkdir()
    (board_dir / "protocol" / "frame.py").write_text("MAX_FRAME = -1\n")
    (board_dir / "config.json").write_text("{\"keep\": true}\n")
    with UnixPortBoard(board_dir) as board:
        flash.deploy("pico", board.path, compile=True, march=None, reset=False, resume=True,
                     remote_dir="", build_dir=tmp_path / "stage", timeout_s=60)
    assert not (board_dir / "protocol" / "frame.py").exists()
    assert (board_dir / "config.json").read_text() == "{\"keep\": true}\n"
    assert _import_deployed(board_dir, tmp_path)[0] == str(_expected_import_output()[0])
