"""A path no module can be behind fails at once with one line and exit 1
(docs/bridge.md): /dev/null, a regular file, a directory. Before, commands waited
5.5-11 s for a hello, printed the error twice and exited 3; doctor said the port
opens but nothing speaks the protocol."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from modbridge.link.errors import NotASerialPort, PortNotFound
from modbridge.link.port import check_port, open_error

MODBRIDGE = str(Path(sys.executable).parent / "modbridge")


def test_check_port(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for path, what in (("/dev/null", "not a tty"), (str(f), "regular file"),
                       (str(tmp_path), "directory")):  # fmt: skip
        with pytest.raises(NotASerialPort, match=what):
            check_port(path)
    with pytest.raises(PortNotFound):
        check_port(str(tmp_path / "none"))
    master, slave = pty.openpty()  # a tty passes
    try:
        check_port(os.ttyname(slave))
    finally:
        os.close(master)
        os.close(slave)


def test_enotty_from_pyserial_is_not_a_serial_port():
    err = open_error("/dev/null", OSError(25, "Could not configure port: (25, "
                                              "'Inappropriate ioctl for device')"))  # fmt: skip
    assert isinstance(err, NotASerialPort) and "not a serial port" in str(err)


@pytest.mark.parametrize("args", [["set", "/dev/null", "fan1", "40%"],
                                  ["config", "get", "/dev/null"]])  # fmt: skip
def test_commands_say_it_once_and_exit_1(args):
    res = subprocess.run([MODBRIDGE, *args], capture_output=True, text=True, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert len(lines) == 1 and "/dev/null is not a serial port" in lines[0], res.stderr


def test_doctor_names_it():
    res = subprocess.run([MODBRIDGE, "doctor", "--port", "/dev/null", "--config", os.devnull],
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    out = res.stdout
    assert "/dev/null is not a serial port" in out, out
    assert "nothing speaks the protocol" not in out, out
