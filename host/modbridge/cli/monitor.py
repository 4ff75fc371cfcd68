"""Text views of a bridge :func:`~modbridge.bridge.report`: the ``status`` table, the
one-line periodic status of ``run``, and the live terminal view of ``monitor``.

Everything here formats the dict :func:`modbridge.bridge.report` builds (the same
object ``--json`` prints), so the table and the JSON cannot disagree. The live view
is plain ANSI (home the cursor, redraw, clear to the end of the screen): no curses.
When the output is not a terminal it prints the one-line status per refresh instead.

Strings from the wire (module id, firmware version, board, errors quoting them) go
through :func:`modbridge.sanitize.sanitize` field by field (bounded) and every line
once more as a whole, so no escape sequence, control character or bidi override a
module sends reaches the terminal raw; the view's own ANSI codes are added after.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from modbridge.sanitize import sanitize

CLEAR_SCREEN = "\x1b[H\x1b[2J"
HOME = "\x1b[H"
CLEAR_EOL = "\x1b[K"
CLEAR_EOS = "\x1b[J"


def _num(v, fmt: str = "{:.1f}", unit: str = "") -> str:
    """A value or ``-`` when absent (a faulted sensor, NotSupported)."""
    return "-" if v is None else fmt.format(v) + unit


def _t(v) -> str:
    """A string from the wire, safe on a terminal and bounded."""
    return sanitize(v)


def _lines(lines: list[str]) -> list[str]:
    return [sanitize(line, None) for line in lines]


def _short(ident: str | None, n: int = 12) -> str:
    if not ident:
        return "-"
    ident = _t(ident)
    return ident if len(ident) <= n else ident[:n] + ".."


def _fans(m: dict) -> str:
    return "/".join(_num(f.get("rpm"), "{:d}") for f in m.get("fans") or []) or "-"


def _duties(m: dict) -> str:
    """Commanded fan duties in percent, ``40/40 %`` (``-`` for a fan without one)."""
    d = [f.get("duty") for f in m.get("fans") or []]
    if not d or all(x is None for x in d):
        return "-"
    return "/".join("-" if x is None else f"{x * 100:.0f}" for x in d) + " %"


def _state(m: dict) -> str:
    """The firmware state with why it is there when that is not plain (``FAILSAFE
    (sensor_open)``): a bare FAILSAFE says nothing a person can act on."""
    state = m.get("state") or "-"
    reason = m.get("reason")
    if state in ("FAILSAFE", "STANDALONE", "MANUAL") and reason and reason != "none":
        return f"{state}({reason})"
    return state


def module_lines(m: dict) -> list[str]:
    """The table rows of one module (``report()["modules"][i]``)."""
    t = m.get("temperatures_c") or {}
    link = "up" if m.get("link_up") else "DOWN"
    lines = [
        f"module {_t(m.get('module_id') or '?')}  port {_t(m['port'])}  link {link}"
        + (
            f"  fw {_t(m['fw_version'])} ({_t(m.get('board'))}, protocol {_t(m.get('protocol'))})"
            if m.get("fw_version")
            else ""
        ),  # fmt: skip
        f"  state {m.get('state') or '-'}  reason {m.get('reason') or '-'}  "
        f"faults {','.join(m.get('faults') or []) or 'none'}",
        "  temps C  "
        + "  ".join(f"{ch} {_num(t.get(ch))}" for ch in ("gpu", "vram", "mos", "amb"))
        + f"  fans rpm {_fans(m)}  duty {_duties(m)}",
        f"  input {_num(m.get('v_in_v'), '{:.2f}', ' V')}  {_num(m.get('i_in_a'), '{:.2f}', ' A')}"
        f"  {_num(m.get('p_in_w'), '{:.1f}', ' W')}",
    ]
    g = m.get("gpu")
    if g:
        lines.append("  " + gpu_line(g))
    else:
        lines.append("  gpu -  (not paired: map it in [[module]], see docs/bridge.md)")
    p = m.get("policy")
    if p:
        target = p.get("target_limit_w")
        lines.append(
            f"  policy {p['level']}  reasons {','.join(p.get('reasons') or []) or 'none'}  "
            f"target {'original' if target is None else _num(target, '{:g}', ' W')}"
            f"  original {_num(p.get('original_limit_w'), '{:g}', ' W')}"
            + (f"  refused {p['limit_writes_refused']}" if p.get("limit_writes_refused") else "")
        )
    if not m.get("link_up") and m.get("last_error"):
        lines.append(f"  error: {_t(m['last_error'])}")
    return _lines(lines)


def gpu_line(g: dict) -> str:
    """One GPU reading (``report()["gpus"][i]``) on one line; absent values as ``-``."""
    if g.get("state", "ok") != "ok":
        return sanitize(
            f"gpu {_t(g['uuid'])}  {g['state'].upper()}: {_t(g.get('error') or '')}", None
        )
    fan = g.get("fan_speed_ratio")
    return sanitize(
        f"gpu {_t(g['uuid'])} ({_t(g.get('name', ''))}, {_t(g.get('pci_bus_id', ''))})  "
        f"{_num(g.get('temperature_c'), '{:.0f}', ' C')}"
        f"  mem {_num(g.get('memory_temperature_c'), '{:.0f}', ' C')}"
        f"  {_num(g.get('power_w'), '{:.0f}', ' W')}"
        f" / limit {_num(g.get('enforced_limit_w'), '{:g}', ' W')}"
        f"  fan {'-' if fan is None else f'{fan * 100:.0f} %'}",
        None,
    )


def table(rep: dict) -> list[str]:
    """``modbridge status``: every module (with its GPU and policy), then unpaired GPUs."""
    lines: list[str] = []
    paired = set()
    for m in rep["modules"]:
        lines += module_lines(m)
        if m.get("gpu"):
            paired.add(m["gpu"]["uuid"])
        lines.append("")
    if not rep["modules"]:
        lines += ["no modules", ""]
    others = [g for g in rep["gpus"] if g["uuid"] not in paired]
    for g in others:
        lines.append(gpu_line(g) + "  (no module)")
    if lines and lines[-1] == "":
        lines.pop()
    return _lines(lines)


def status_line(rep: dict, clock: Callable[[], float] = time.time) -> str:
    """``run``'s periodic line on stderr: one short clause per module."""
    parts = []
    for m in rep["modules"]:
        g = m.get("gpu") or {}
        p = m.get("policy") or {}
        t = (m.get("temperatures_c") or {}).get("gpu")
        if not m.get("link_up"):
            down = "DOWN" if m.get("last_frame_age_s") is not None else "connecting"
            head = f"{_short(m.get('module_id') or m['port'])} {down}"
        else:
            head = (
                f"{_short(m.get('module_id'))} {_state(m)} ntc {_num(t)}C"
                f" fans {_fans(m)}rpm@{_duties(m).replace(' ', '')}"
            )
        gpu = ""
        if g:
            if g.get("state", "ok") != "ok":
                gpu = f" gpu {g['state'].upper()}"
            else:
                gpu = (
                    f" gpu {_num(g.get('temperature_c'), '{:.0f}')}C"
                    f" {_num(g.get('power_w'), '{:.0f}')}/"
                    f"{_num(g.get('enforced_limit_w'), '{:g}')}W"
                )
        level = p.get("level", "-")
        why = ",".join(r for r in p.get("reasons") or [] if r != "hold")
        parts.append(f"{head}{gpu} {level}" + (f"({why})" if why else ""))
    stamp = time.strftime("%H:%M:%S", time.localtime(clock()))
    return sanitize(f"{stamp} " + (" | ".join(parts) if parts else "no modules"), None)


class Throttled:
    """Calls ``fn(rep)`` at most every ``every_s`` seconds (the first call always; 0 or
    less: never). The bridge ticks faster than a person reads."""

    def __init__(self, fn: Callable[[dict], None], every_s: float, now=time.monotonic):
        self.fn = fn
        self.every_s = every_s
        self._now = now
        self._last: float | None = None

    def __call__(self, rep: dict) -> None:
        if self.every_s <= 0:
            return
        now = self._now()
        if self._last is None or now - self._last >= self.every_s:
            self._last = now
            self.fn(rep)


class LiveView:
    """Redraws the status table in place on a terminal; one status line per refresh
    otherwise (a pipe, a log file)."""

    def __init__(self, out=None, tty: bool | None = None, title: str = "modbridge monitor"):
        self.out = out if out is not None else sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.title = title
        self.frames = 0

    def draw(self, rep: dict) -> None:
        if not self.tty:
            self.out.write(status_line(rep) + "\n")
        else:
            head = (
                f"{_t(self.title)}  {time.strftime('%H:%M:%S')}  backend {_t(rep['backend'])}"
                "  (Ctrl-C quits)"
            )
            body = [head, ""] + table(rep)
            prefix = CLEAR_SCREEN if self.frames == 0 else HOME
            self.out.write(prefix + "".join(line + CLEAR_EOL + "\n" for line in body) + CLEAR_EOS)
        self.out.flush()
        self.frames += 1
