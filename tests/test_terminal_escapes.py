"""Issue 23 item 8: text from the wire never reaches the operator's terminal raw.

A counterfeit module on a real pty answers every request with hostile strings (its
board, firmware version, NACK fields and texts, config keys and values, event texts,
a boot banner with invalid UTF-8) and every command that prints module text runs
against it. The oracle is SPEC section 14 ("Untrusted text ... escape them before
logging"), written here as the set of code points a terminal or a log reader acts on
(C0 but the line break, DEL, C1, the bidi embeddings/overrides/isolates/marks,
zero-width and invisible formatting, line/paragraph separators, lone surrogates),
not by calling the sanitiser under test.
"""

from __future__ import annotations

import logging
import os
import time

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from ptypeer import PtyPeer

from modbridge.cli.main import main
from modbridge.link.session import ModuleLink
from modbridge.sanitize import sanitize
from protocol import catalog as C

# Each at most 32 characters (the catalog's bound on the short string fields).
HOSTILE = [
    "\x1b]0;pwned\x07",  # OSC: retitle the window
    "\x1b[2J\x1b[H",  # CSI: clear the screen, cursor home
    "\x1bP+q\x1b\\",  # DCS
    "\x1b]8;;http://x\x1b\\l",  # OSC 8 hyperlink
    "\x9b31m",  # C1 CSI
    "\x9d0;t\x9c",  # C1 OSC ... ST
    "a\u202egnp.exe",  # right-to-left override
    "\u2066x\u2069\u202a\u202b\u202c\u202d",  # isolates, embeddings
    "zw\u200b\u200c\u200d\u2060\ufeff",  # zero-width
    "x\rmodbridge: all clear",  # CR
    "y\nmodbridge: all clear",  # LF
    "bs\x08\x08\x7f",  # BS, DEL
    "nul\x00z",
    "\u2028\u2029\x85\u200e\u200f",  # separators, NEL, marks
]
RAW_BANNER = b"MODULER READY v\xff\xfe\x1b]0;t\x07\xc3(\r\n"  # invalid UTF-8 and OSC


def forbidden(ch: str) -> bool:
    """A code point that makes a terminal or a log reader do something (SPEC 14)."""
    cp = ord(ch)
    return (
        (cp < 0x20 and ch != "\n")
        or 0x7F <= cp <= 0x9F
        or 0x200B <= cp <= 0x200F  # zero-width, LRM, RLM
        or 0x202A <= cp <= 0x202E  # embeddings, overrides
        or 0x2060 <= cp <= 0x2069  # word joiner ... isolates
        or cp in (0x2028, 0x2029, 0xFEFF, 0x061C, 0x180E)
        or 0xD800 <= cp <= 0xDFFF
    )


def escapes_in(text: str) -> int:
    """Forbidden code points in ``text``, plus lines forged by a module ("modbridge:
    all clear" at the start of a line)."""
    n = sum(1 for ch in text if forbidden(ch))
    n += sum(1 for line in text.split("\n") if line.startswith("modbridge: all clear"))
    return n


class HostilePeer(PtyPeer):
    """Answers everything but the hello with a NACK whose field and text are hostile,
    ``config_get`` with hostile keys and values, and sends hostile events."""

    def __init__(self, s: str, **kw):
        super().__init__(board=s[:32] or "x", fw_version=s[:32] or "x", **kw)
        self.s = s
        for name in ("fan_mode", "setpoints", "fan_curve", "pid", "config_set", "config_save",
                     "config_reset", "reboot", "selftest", "pair", "cal_read", "calibrate"):
            self.nack_rules[name] = (C.ERR_OUT_OF_RANGE, s[:32], (s * 4)[:96])
        self.replies["config_get"] = (
            "config",
            {"values": {s[:32] or "k": s[:32], "pid.kp" + s[:24]: 5000, "fans.0.model": s[:32]}},
        )

    def _handle(self, item, now):
        super()._handle(item, now)
        if item.ok and item.name == "hello_request":
            self.send("event", {"code": C.REASON_INTERNAL_ERROR, "severity": 2, "active": True,
                                "text": (self.s * 4)[:96]})  # fmt: skip
            self.send_raw(RAW_BANNER)


COMMANDS = [
    ["config", "get", "{port}", "--direct"],
    ["set", "{port}", "fan1", "40%", "--direct"],
    ["set", "{port}", "mode", "auto", "--direct"],
    ["set", "{port}", "setpoint", "gpu", "70", "--direct"],
    ["config", "set", "{port}", "gpu.setpoint=72", "--direct"],
    ["reboot", "{port}", "--direct"],
    ["selftest", "{port}", "--direct"],
    ["status", "--port", "{port}", "--direct"],
    ["list", "--port", "{port}"],
    ["doctor", "--port", "{port}"],
    ["monitor", "--port", "{port}", "--count", "1", "--interval", "0.5"],
    ["pair", "{port}"],
]


def _virtual_gpu_backend(monkeypatch):
    """status and monitor need a GPU: a virtual one (never a real GPU in a test)."""
    from modbridge.gpu import select
    from modbridge.gpu.virtual import VirtualBackend
    from modbridge.sim import World, load_params

    world = World(load_params("default"), seed=0, profile="idle")
    monkeypatch.setattr(select, "open_backend", lambda *a, **k: VirtualBackend([world.gpu]))


def _run_all(peer, tmp_path) -> dict[str, str]:
    out = {}
    env = {"MODBRIDGE_KEYS_DIR": str(tmp_path / "keys"), "COLUMNS": "200"}
    for cmd in COMMANDS:
        args = [a.replace("{port}", peer.path) for a in cmd]
        if cmd[0] in ("monitor", "status"):
            args += ["--state-dir", str(tmp_path / "state")]
        r = CliRunner().invoke(main, args, env=env)
        if r.exception and not isinstance(r.exception, SystemExit):
            raise r.exception
        out[" ".join(cmd)] = r.output
    r = CliRunner().invoke(main, ["console", peer.path, "--keys-dir", str(tmp_path / "keys")],
                           input='{"type":"fan_mode","mode":"manual","duty1":30}\n'
                                 '{"type":"hello_request"}\n',
                           env=env)  # fmt: skip
    out["console"] = r.output
    return out


@pytest.mark.parametrize("s", HOSTILE, ids=[ascii(s)[1:12] for s in HOSTILE])
def test_no_raw_control_or_bidi_character_reaches_the_terminal(tmp_path, s, monkeypatch):
    _virtual_gpu_backend(monkeypatch)
    os.makedirs(tmp_path / "state", mode=0o700, exist_ok=True)
    with HostilePeer(s, symlink=tmp_path / "mod0", telemetry_period_s=0.2) as peer:
        outs = _run_all(peer, tmp_path)
    bad = {k: ascii(v) for k, v in outs.items() if escapes_in(v)}
    assert not bad, bad
    # the module's words are still there, escaped, for the operator to read
    assert "refused" in outs["set {port} fan1 40% --direct"]
    assert "refused" in outs["console"]


def test_the_log_lines_of_a_link_are_escaped(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    s = "".join(HOSTILE)[:96]
    with HostilePeer(HOSTILE[0], symlink=tmp_path / "mod0", telemetry_period_s=0.1) as peer:
        link = ModuleLink(peer.path, heartbeat_period_s=0.1).start()
        try:
            assert link.wait_up(10)
            for name in ("fan_mode", "setpoints"):
                peer.nack_rules[name] = (C.ERR_OUT_OF_RANGE, s[:32], s)
            with pytest.raises(Exception):  # noqa: B017 - refused, whatever its class
                link.request("setpoints", {"sp_gpu": 70000})
            peer.send("event", {"code": C.REASON_INTERNAL_ERROR, "severity": 3,
                                "active": True, "text": s})  # fmt: skip
            peer.send_raw(RAW_BANNER)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and link.status.module_resets == 0:
                time.sleep(0.05)
        finally:
            link.stop()
    text = "\n".join(logging.Formatter().format(r) for r in caplog.records)
    assert text and not escapes_in(text), ascii(text)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=64))
def test_the_sanitiser_leaves_nothing_a_terminal_acts_on(s):
    assert not any(forbidden(ch) for ch in sanitize(s))
    assert not any(forbidden(ch) for ch in sanitize(s, None))
