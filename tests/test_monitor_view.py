"""The live view of `monitor` and `run --live` at 8 modules (docs/bridge.md, "monitor"):
:func:`modbridge.cli.monitor.view` as a pure function of a report dict, rendered at
80x24; the plain mode off a terminal; and `modbridge monitor --sim --sim-modules 8`
on an 80x24 pty, its screen read back through a VT emulator (pyte).
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from click.testing import CliRunner

from modbridge.cli import monitor
from modbridge.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH, HEIGHT = 80, 24


def _module(i: int, **kw) -> dict:
    """Module ``i`` (0-based) of a healthy 8-module report, as bridge.report builds it."""
    uuid = f"GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e000{i}"
    m = {
        "port": f"/tmp/modbridge-sim-x/module-{i}.tty",
        "module_id": f"{i:02d}bddcc21aff921d00d1d98{i}",
        "link_up": True,
        "last_frame_age_s": 0.1,
        "fw_version": "0.1.0",
        "protocol": "1.0",
        "board": "sim",
        "state": "HOSTED",
        "reason": "host_ok",
        "faults": [],
        "temp_gpu_c": 61.5, "temp_vram_c": 66.0, "temp_mos_c": 55.0, "temp_amb_c": 30.2,
        "fan1_rpm": 1380, "fan1_duty_pct": 40.0, "fan2_rpm": 1370, "fan2_duty_pct": 40.0,
        "v_in_v": 12.02,
        "i_in_a": 25.0,
        "p_in_w": 300.5,
        "last_error": None,
        "gpu": {
            "uuid": uuid,
            "name": "NVIDIA H200",
            "pci_bus_id": f"00000000:00:0{i}.0",
            "temp_c": 64.0,
            "memory_temp_c": 70.0,
            "power_w": 410.0,
            "limit_w": 700.0,
            "min_limit_w": 200.0,
            "max_limit_w": 700.0,
            "state": "ok",
        },
        "policy": {
            "level": "NORMAL",
            "reasons": [],
            "target_w": None,
            "original_w": 700.0,
            "limit_writes_refused": 0,
        },
    }
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(m.get(k), dict):
            m[k] = {**m[k], **v}
        else:
            m[k] = v
    return m


def eight() -> dict:
    """8 modules, the bad ones in the middle and at the end of the report's order:
    #3 FAILSAFE (fan 1 stalled), #5 CRITICAL, #6 silent (link down), #8 WARN."""
    mods = [_module(i) for i in range(8)]
    mods[2] = _module(2, state="FAILSAFE", reason="fan_stall", faults=["fan1_stall"],
                      fan1_rpm=0, fan1_duty_pct=100.0, fan2_rpm=3900, fan2_duty_pct=100.0,
                      policy={"level": "WARN", "reasons": ["fan_stall"]})  # fmt: skip
    mods[4] = _module(4, temp_gpu_c=91.0, temp_vram_c=95.5, temp_mos_c=80.0, temp_amb_c=33.0,
                      gpu={"temp_c": 92.0, "power_w": 350.0, "limit_w": 350.0},
                      policy={"level": "CRITICAL", "reasons": ["critical_temp"],
                              "target_w": 350.0})  # fmt: skip
    mods[5] = _module(5, link_up=False, last_frame_age_s=12.0, state=None,
                      last_error="read failed: device disconnected",
                      policy={"level": "CRITICAL", "reasons": ["module_silent"]})  # fmt: skip
    mods[7] = _module(7, policy={"level": "WARN", "reasons": ["over_temp", "hold"]})
    return {"backend": "virtual", "modules": mods, "gpus": [m["gpu"] for m in mods]}


def _screen_lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def _ids(text: str) -> list[str]:
    """The modules' short ids in the order the screen shows them."""
    return re.findall(r"\b(\d\dbddc)\.\.", text)


# -- the view as a pure function ----------------------------------------------------------
@pytest.mark.parametrize("opened", [None, 3, 6])
def test_eight_modules_fit_80x24_worst_first(opened):
    rep = eight()
    st = monitor.ViewState()
    if opened:
        st.opened = st.cursor = rep["modules"][opened - 1]["port"]
    text = monitor.render_text(rep, WIDTH, HEIGHT, state=st, keys=True, clock=lambda: 0)
    lines = _screen_lines(text)
    assert len(lines) <= HEIGHT - 1, text  # the last line stays free: nothing scrolls
    assert max(monitor_cells(x) for x in lines) <= WIDTH, text
    assert lines[0].startswith("modbridge monitor") and "8 modules" in lines[0]
    assert lines[1].split()[:3] == ["#", "module", "state"]
    ids = _ids("\n".join(lines[2:10]))
    assert len(ids) == 8, text
    bad = {"02bddc", "04bddc", "05bddc"}  # FAILSAFE, CRITICAL, silent
    assert set(ids[:3]) == bad and ids[3] == "07bddc", ids  # then WARN, then NORMAL
    assert ids[4:] == ["00bddc", "01bddc", "03bddc", "06bddc"]  # report order
    assert "FAILSAFE(fan" in text and "DOWN" in text and "CRITICAL" in text
    assert "q: quit" in lines[-1]
    if opened == 3:
        assert "#3 02bddc.. FAILSAFE(fan_stall)" in text and "faults fan1_stall" in text
    if opened == 6:
        assert "error: read failed: device disconnected" in text


def monitor_cells(line: str) -> int:
    from rich.cells import cell_len

    return cell_len(line)


def test_the_details_give_way_to_the_table_on_a_small_terminal():
    rep = eight()
    st = monitor.ViewState(opened=rep["modules"][0]["port"])
    text = monitor.render_text(rep, WIDTH, 16, state=st, keys=True)
    lines = _screen_lines(text)
    assert len(lines) <= 15 and len(_ids(text)) >= 8, text


def test_more_modules_than_rows_shows_the_worst_and_counts_the_rest():
    rep = eight()
    rep["modules"] += [_module(i) for i in range(8, 9)] * 22  # 30 modules
    text = monitor.render_text(rep, WIDTH, HEIGHT, clock=lambda: 0)
    lines = _screen_lines(text)
    assert len(lines) <= HEIGHT - 1, text
    assert set(_ids(text)[:3]) == {"02bddc", "04bddc", "05bddc"}
    assert re.search(r"\.\.\. \d+ more \(HOSTED\)", text), text
    assert lines[-1] == "Ctrl-C quits"


def test_a_gpu_without_a_module_has_its_own_line():
    rep = eight()
    rep["gpus"].append({"uuid": "GPU-lone-0000", "temp_c": 50.0, "power_w": 100.0,
                        "limit_w": 300.0, "state": "ok"})  # fmt: skip
    text = monitor.render_text(rep, WIDTH, HEIGHT)
    row = next(x for x in text.splitlines() if "no module" in x and "GPU-lone" in x)
    assert "100/300" in row and "9 modules" not in text and "1 no module" in text


def test_wide_terminal_lines_are_one_line_each():
    text = monitor.render_text(eight(), 160, 30)
    assert len(_screen_lines(text)) <= 29 and len(_ids(text)) == 8


def test_the_plain_mode_is_one_line_per_module_without_escapes():
    lines = monitor.plain_lines(eight(), clock=lambda: 0)
    assert len(lines) == 8 and not any("\x1b" in x for x in lines)
    assert [x.split()[1] for x in lines] == [f"#{i}" for i in range(1, 9)]
    assert "FAILSAFE(fan_stall)" in lines[2] and "DOWN" in lines[5]


def test_the_plain_mode_through_the_cli_at_eight_modules(home, monkeypatch):
    from modbridge import config

    monkeypatch.setattr(config, "DEFAULT_PATHS", (home / "absent.toml",))
    res = CliRunner().invoke(main, ["monitor", "--sim", "--sim-modules", "8", "--interval",
                                    "0.2", "--count", "2"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output, res.output
    # one line per module and frame; while the modules connect (a loaded machine's
    # sims are slow to boot) a GPU not yet paired has a line of its own as well
    lines = [x for x in res.output.splitlines() if x.strip()]
    modules = [x for x in lines if x.split()[1].startswith("#")]
    assert len(modules) == 16, res.output
    assert sorted({x.split()[1] for x in modules}) == [f"#{i}" for i in range(1, 9)]
    assert all(x.split()[1] == "gpu" for x in lines if x not in modules), res.output


# -- the live view object: keys and log records ----------------------------------------------
def _live(out: io.StringIO, **kw) -> monitor.LiveView:
    return monitor.LiveView(out, tty=True, keys=False, size=(WIDTH, HEIGHT), **kw)


def test_keys_open_and_close_a_module_and_q_quits():
    quit_called = []
    view = _live(io.StringIO(), on_quit=lambda: quit_called.append(1))
    rep = eight()
    try:
        view.draw(rep)
        assert view.state.cursor == rep["modules"][2]["port"]  # on the worst line
        view.key("3")
        assert view.state.opened == rep["modules"][2]["port"]
        view.key("down")
        view.key("enter")
        assert view.state.opened == view.state.cursor == rep["modules"][4]["port"]
        view.key("esc")
        assert view.state.opened is None
        view.key("9")  # no module 9: nothing
        assert view.state.opened is None
        view.key("q")
        assert view.quit and quit_called == [1]
    finally:
        view.close()


def test_log_records_go_above_the_live_view():
    import pyte

    out = io.StringIO()
    view = _live(out)
    root = logging.getLogger()
    stream = io.StringIO()
    stream.isatty = lambda: True  # a handler on the terminal the view draws on
    h = logging.StreamHandler(stream)
    root.addHandler(h)
    try:
        view.draw(eight())
        logging.getLogger("modbridge.policy.engine").warning("pair %s: CRITICAL", "x")
        view.draw(eight())
    finally:
        view.close()
        root.removeHandler(h)
    assert stream.getvalue() == ""  # not written under or over the view
    screen = pyte.Screen(WIDTH, HEIGHT)
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))
    shown = [x.rstrip() for x in screen.display]
    log_at = next(i for i, x in enumerate(shown) if "pair x: CRITICAL" in x)
    head_at = next(i for i, x in enumerate(shown) if x.startswith("modbridge monitor"))
    assert log_at < head_at and len(_ids("\n".join(shown))) == 8, "\n".join(shown)


# -- `modbridge monitor` on an 80x24 pty -----------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch):
    """The subprocess sees no config and no state dir of this machine."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MODBRIDGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return tmp_path


def _pty_run(args, keys=(), stdin_tty=False, timeout=90.0):
    """Run ``modbridge args`` with stdout (and stderr) on an 80x24 pty; return what the
    terminal shows afterwards and the exit code. ``keys``: (text to wait for, bytes
    to type) pairs; with them stdin is the pty too."""
    import pyte

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", HEIGHT, WIDTH, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "", "LINES": ""}
    env.pop("COLUMNS")
    env.pop("LINES")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modbridge", *args],
        stdin=slave if (keys or stdin_tty) else subprocess.DEVNULL,
        stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    screen = pyte.Screen(WIDTH, HEIGHT)
    stream = pyte.ByteStream(screen)
    pending = list(keys)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                stream.feed(data)
            if pending and pending[0][0] in "\n".join(screen.display):
                os.write(master, pending.pop(0)[1])
            if proc.poll() is not None and not r:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return [x.rstrip() for x in screen.display], rc


def _check_screen(shown: list[str]) -> None:
    text = "\n".join(shown)
    head = [i for i, x in enumerate(shown) if x.startswith("modbridge monitor")]
    assert head, text
    body = shown[head[-1] :]
    assert body[1].split()[:3] == ["#", "module", "state"], text
    numbers = [x.split()[0] for x in body[2:10]]
    assert sorted(numbers, key=int) == [str(i) for i in range(1, 9)], text
    assert all(len(x) <= WIDTH for x in shown)


def test_monitor_on_an_80x24_pty_shows_eight_modules_and_its_header(home):
    shown, rc = _pty_run(["monitor", "--sim", "--sim-modules", "8", "--interval", "0.3",
                          "--count", "2"])  # fmt: skip
    assert rc == 0, "\n".join(shown)
    _check_screen(shown)
    assert "Ctrl-C quits" in "\n".join(shown)  # stdin is no terminal: no keys


def test_monitor_keys_on_a_pty_open_a_module_and_q_quits(home):
    shown, rc = _pty_run(
        ["monitor", "--sim", "--sim-modules", "8", "--interval", "0.3"],
        keys=[("HOSTED", b"4"), ("#4 ", b"q")],  # once a module is up: open #4, quit
    )
    assert rc == 0, "\n".join(shown)
    _check_screen(shown)
    text = "\n".join(shown)
    assert re.search(r"^#4 \S+ \w+", text, re.M) and "temps C" in text, text
    assert "q: quit" in text
