"""Text views of a bridge :func:`~modbridge.bridge.report`: the ``status`` table, the
one-line periodic status of ``run``, and the live view of ``monitor`` and ``run --live``.

Everything here formats the dict :func:`modbridge.bridge.report` builds (the same
object ``--json`` prints), so the table and the JSON cannot disagree.

The live view (docs/bridge.md, "monitor") is built on rich (``Live`` + ``Table``): one
line per module, the worst first, under a header that stays, and the details of one
module on a key. :func:`view` is a pure function of a report and the view's state
(cursor, open module, terminal size): the tests render it to text. Off a terminal the
view prints :func:`plain_lines` instead: one line per module per refresh, no escape
codes (a pipe, a log file).

Strings from the wire (module id, firmware version, board, errors quoting them) go
through :func:`modbridge.sanitize.sanitize` field by field (bounded) and every line
once more as a whole, so no escape sequence, control character or bidi override a
module sends reaches the terminal raw. The live view hands rich ``Text`` objects,
never markup, so a ``[bold]`` from the wire is text too.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from modbridge.sanitize import sanitize

SILENT_AFTER_S = 10.0  # as ops.health: a frame older than this is a silent module


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


_CHANNELS = ("gpu", "vram", "mos", "amb")


def _temps(m: dict) -> dict:
    """A module's NTC readings by channel (its ``temp_gpu_c`` ..., docs/vocabulary.md)."""
    return {ch: m.get(f"temp_{ch}_c") for ch in _CHANNELS}


def _fan_numbers(m: dict) -> list[int]:
    """The module's fans (1, 2, ...): those with a ``fanN_rpm`` or ``fanN_duty_pct``."""
    n = 1
    while f"fan{n}_rpm" in m or f"fan{n}_duty_pct" in m:
        n += 1
    return list(range(1, n))


def _fans(m: dict) -> str:
    return "/".join(_num(m.get(f"fan{i}_rpm"), "{:d}") for i in _fan_numbers(m)) or "-"


def _duties(m: dict) -> str:
    """Commanded fan duties in percent, ``40/40 %`` (``-`` for a fan without one)."""
    d = [m.get(f"fan{i}_duty_pct") for i in _fan_numbers(m)]
    if not d or all(x is None for x in d):
        return "-"
    return "/".join("-" if x is None else f"{x:.0f}" for x in d) + " %"


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
    t = _temps(m)
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
    return _lines(lines + _policy_and_error(m))


def _policy_and_error(m: dict) -> list[str]:
    """The last rows of a module in the table and in the details: its policy, and
    why its link is down."""
    lines = []
    p = m.get("policy")
    if p:
        target = p.get("target_w")
        lines.append(
            f"  policy {p['level']}  reasons {','.join(p.get('reasons') or []) or 'none'}  "
            f"target {'original' if target is None else _num(target, '{:g}', ' W')}"
            f"  original {_num(p.get('original_w'), '{:g}', ' W')}"
            + (f"  refused {p['limit_writes_refused']}" if p.get("limit_writes_refused") else "")
        )
    if not m.get("link_up") and m.get("last_error"):
        lines.append(f"  error: {_t(m['last_error'])}")
    return lines


def gpu_line(g: dict) -> str:
    """One GPU reading (``report()["gpus"][i]``) on one line; absent values as ``-``."""
    if g.get("state", "ok") != "ok":
        return sanitize(
            f"gpu {_t(g['uuid'])}  {g['state'].upper()}: {_t(g.get('error') or '')}", None
        )
    fan = g.get("fan_speed_pct")
    return sanitize(
        f"gpu {_t(g['uuid'])} ({_t(g.get('name', ''))}, {_t(g.get('pci_bus_id', ''))})  "
        f"{_num(g.get('temp_c'), '{:.0f}', ' C')}"
        f"  mem {_num(g.get('memory_temp_c'), '{:.0f}', ' C')}"
        f"  {_num(g.get('power_w'), '{:.0f}', ' W')}"
        f" / limit {_num(g.get('limit_w'), '{:g}', ' W')}"
        f"  fan {'-' if fan is None else f'{fan:.0f} %'}",
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


def module_clause(m: dict) -> str:
    """One module (with its GPU and policy level) in a short clause: ``run``'s status
    line joins them, the monitor's plain mode prints one a line."""
    g = m.get("gpu") or {}
    p = m.get("policy") or {}
    t = m.get("temp_gpu_c")
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
                f" gpu {_num(g.get('temp_c'), '{:.0f}')}C"
                f" {_num(g.get('power_w'), '{:.0f}')}/"
                f"{_num(g.get('limit_w'), '{:g}')}W"
            )
    level = p.get("level", "-")
    why = ",".join(r for r in p.get("reasons") or [] if r != "hold")
    return f"{head}{gpu} {level}" + (f"({why})" if why else "")


def status_line(rep: dict, clock: Callable[[], float] = time.time) -> str:
    """``run``'s periodic line on stderr: one short clause per module."""
    parts = [module_clause(m) for m in rep["modules"]]
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


# ----------------------------------------------------------------------------- live view

RANK_BAD, RANK_LONE, RANK_WARN, RANK_OK = range(4)  # worst first
RANK_STYLES = {RANK_BAD: "bold red", RANK_LONE: "red", RANK_WARN: "yellow", RANK_OK: ""}
COLUMNS = (  # header, justify, min width, max width (None: what is left)
    ("#", "right", 1, 3),
    ("module", "left", 6, 8),
    ("state", "left", 6, 13),
    ("GPU C", "right", 3, 5),
    ("NTC C", "left", 4, 8),
    ("fan %", "right", 3, 7),
    ("fan rpm", "right", 3, 9),
    ("W/limit", "right", 3, 9),
    ("policy", "left", 8, None),
)
POLICY_WIDTH = 16  # the policy column's bound (its level and a reason's head)


@dataclass
class Row:
    """One line of the live view: a module (with its GPU), or a GPU no module cools."""

    key: str  # what the cursor follows: a module's port, or ``gpu:`` + the GPU's uuid
    number: int | None  # the module's place in the report, from 1: its key
    rank: int  # RANK_*
    cells: tuple[str, ...]  # as :data:`COLUMNS`
    module: dict | None = None
    gpu: dict | None = None


def _silent_for(m: dict) -> float | None:
    age = m.get("last_frame_age_s")
    return age if age is not None and age > SILENT_AFTER_S else None


def module_rank(m: dict) -> int:
    """How bad module ``m`` looks: CRITICAL, FAILSAFE, a silent module or a lost GPU
    first (as ``healthcheck`` calls them problems), then WARN, STANDALONE, BOOT,
    MANUAL or a module without a GPU yet, then the rest."""
    g = m.get("gpu") or {}
    level = (m.get("policy") or {}).get("level")
    connecting = not m.get("link_up") and m.get("last_frame_age_s") is None
    if (
        (not m.get("link_up") and not connecting)
        or _silent_for(m) is not None
        or level == "CRITICAL"
        or m.get("state") == "FAILSAFE"
        or g.get("state", "ok") != "ok"
    ):
        return RANK_BAD
    if (
        connecting  # not heard from yet: the first seconds after a start
        or level == "WARN"
        or m.get("state") in ("STANDALONE", "BOOT", "MANUAL")
        or not m.get("policy")
        or not g
    ):
        return RANK_WARN
    return RANK_OK


def _hottest(m: dict) -> str:
    t = {k: v for k, v in _temps(m).items() if v is not None}
    if not t:
        return "-"
    ch = max(t, key=t.get)
    return f"{t[ch]:.0f} {_t(ch)}"


def _gpu_cells(g: dict | None) -> tuple[str, str]:
    """(temperature, power/limit) of a GPU reading."""
    if not g:
        return "-", "-"
    if g.get("state", "ok") != "ok":
        return _t(g["state"]).upper(), "-"
    w = _num(g.get("power_w"), "{:.0f}")
    lim = _num(g.get("limit_w"), "{:.0f}")
    return _num(g.get("temp_c"), "{:.0f}"), f"{w}/{lim}"


def _module_state(m: dict) -> str:
    if not m.get("link_up"):
        return "DOWN" if m.get("last_frame_age_s") is not None else "connecting"
    age = _silent_for(m)
    if age is not None:
        return f"silent {age:.0f}s"
    return _t(_state(m))


def _port_name(port: str | None, n: int = 8) -> str:
    """A module not heard from yet by its port's name, its tail if long.

    >>> _port_name("/dev/ttyACM0"), _port_name("/tmp/sim/module-3.tty")
    ('ttyACM0', '..-3.tty')
    """
    name = _t(os.path.basename(port or "")) or "-"
    return name if len(name) <= n else ".." + name[-(n - 2) :]


def module_row(m: dict, number: int) -> Row:
    """The live view's line of module ``m`` (``report()["modules"][number - 1]``)."""
    g = m.get("gpu")
    p = m.get("policy")
    if p:
        why = [_t(r) for r in p.get("reasons") or [] if r != "hold"]
        policy = " ".join([p.get("level") or "-"] + why[:1]) + ("+" if len(why) > 1 else "")
    else:
        policy = "no GPU" if m.get("link_up") and m.get("policy") is None and g is None else "-"
    gpu_t, gpu_w = _gpu_cells(g)
    cells = (
        str(number),
        _short(m["module_id"], 6) if m.get("module_id") else _port_name(m.get("port")),
        _module_state(m),
        gpu_t,
        _hottest(m),
        _duties(m).replace(" %", ""),
        _fans(m),
        gpu_w,
        policy,
    )
    return Row(str(m.get("port") or m.get("module_id")), number, module_rank(m),
               tuple(sanitize(c, 60) for c in cells), m, g)  # fmt: skip


def rows(rep: dict) -> list[Row]:
    """Every line of the live view, the worst first (ties keep the report's order):
    each module, then each GPU that no module cools (as ``status`` lists them)."""
    out = [module_row(m, i + 1) for i, m in enumerate(rep.get("modules") or [])]
    paired = {m["gpu"]["uuid"] for m in rep.get("modules") or [] if m.get("gpu")}
    for g in rep.get("gpus") or []:
        if g.get("uuid") in paired:
            continue
        gpu_t, gpu_w = _gpu_cells(g)
        cells = ("-", "-", "no module", gpu_t, "-", "-", "-", gpu_w, _short(g.get("uuid"), 12))
        out.append(Row("gpu:" + str(g.get("uuid")), None, RANK_LONE,
                       tuple(sanitize(c, 60) for c in cells), None, g))  # fmt: skip
    return sorted(out, key=lambda r: r.rank)  # stable


def detail_lines(row: Row) -> list[str]:
    """The details of one line (a key opens them), each short enough for 80 columns
    (what is longer is cut): everything ``status`` says of a module and its GPU."""
    g = row.gpu
    if row.module is None:
        return [gpu_line(g or {}), "  no module cools this GPU: map one in [[module]] "
                "(docs/bridge.md)"]  # fmt: skip
    m = row.module
    t = _temps(m)
    fw = (f"  fw {_t(m['fw_version'])} ({_t(m.get('board'))}, protocol {_t(m.get('protocol'))})"
          if m.get("fw_version") else "")  # fmt: skip
    age = m.get("last_frame_age_s")
    lines = [
        f"module {_t(m.get('module_id') or '?')}  link {'up' if m.get('link_up') else 'DOWN'}"
        + ("" if age is None else f" (last frame {age:.1f} s ago)")
        + fw,
        f"  port {_t(m.get('port'))}",
        f"  state {m.get('state') or '-'}  reason {m.get('reason') or '-'}  "
        f"faults {','.join(m.get('faults') or []) or 'none'}",
        "  temps C  " + "  ".join(f"{c} {_num(t.get(c))}" for c in ("gpu", "vram", "mos", "amb")),
        f"  fans rpm {_fans(m)}  duty {_duties(m)}   input {_num(m.get('v_in_v'), '{:.2f}', ' V')}"
        f"  {_num(m.get('i_in_a'), '{:.2f}', ' A')}  {_num(m.get('p_in_w'), '{:.1f}', ' W')}",
    ]
    if not g:
        lines.append("  gpu -  (not paired: map it in [[module]], see docs/bridge.md)")
    elif g.get("state", "ok") != "ok":
        lines.append("  " + gpu_line(g))
    else:
        lines += [
            f"  gpu {_t(g['uuid'])}  {_t(g.get('name', ''))}  {_t(g.get('pci_bus_id', ''))}",
            f"      {_num(g.get('temp_c'), '{:.0f}', ' C')}"
            f"  mem {_num(g.get('memory_temp_c'), '{:.0f}', ' C')}"
            f"  {_num(g.get('power_w'), '{:.0f}', ' W')}"
            f" / limit {_num(g.get('limit_w'), '{:g}', ' W')}"
            f"  (min {_num(g.get('min_limit_w'), '{:g}')},"
            f" max {_num(g.get('max_limit_w'), '{:g}')})",
        ]  # fmt: skip
    return _lines(lines + _policy_and_error(m))


def column_widths(shown: list[Row], width: int) -> list[int]:
    """Each column as wide as its widest cell; when that is too wide for ``width``,
    the columns above their bounds (a long state, the policy's reasons) are cut first,
    then the roomiest down to its minimum: the measures stay whole."""
    from rich.cells import cell_len

    ws = [max([cell_len(name)] + [cell_len(r.cells[j]) for r in shown])
          for j, (name, *_rest) in enumerate(COLUMNS)]  # fmt: skip
    width -= len(COLUMNS) - 1  # one space between columns
    for bound in (lambda c: c[3] or POLICY_WIDTH, lambda c: c[2]):
        while sum(ws) > width:
            over = [w - bound(c) for w, c in zip(ws, COLUMNS, strict=True)]
            j = max(range(len(ws)), key=over.__getitem__)
            if over[j] <= 0:
                break
            ws[j] -= 1
    return ws


@dataclass
class ViewState:
    """What the keys change: the cursor's line and the line whose details are open
    (both by :attr:`Row.key`, so they follow a module as the order changes)."""

    cursor: str | None = None
    opened: str | None = None


def summary(all_rows: list[Row]) -> str:
    """``8 modules: 2 bad, 1 warn, 5 ok`` for the header."""
    n = sum(1 for r in all_rows if r.module is not None)
    counts = [sum(1 for r in all_rows if r.rank == k) for k in range(4)]
    parts = [f"{c} {w}" for c, w in zip(counts, ("alarm", "no module", "warn", "ok"),
                                         strict=True) if c]  # fmt: skip
    return f"{n} module{'s' if n != 1 else ''}" + (": " + ", ".join(parts) if parts else "")


def view(rep: dict, width: int = 80, height: int = 24, state: ViewState | None = None,
         keys: bool = False, title: str = "modbridge monitor",
         clock: Callable[[], float] = time.time):  # fmt: skip
    """The live view of ``rep`` as a rich renderable that fits ``width`` x ``height``
    (one line is left free below it): a header, one line per module (the worst first;
    past the height, the best are counted, not shown), the open module's details, and
    a line saying which keys work (``keys``: stdin is a terminal)."""
    from rich.console import Group
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    state = state or ViewState()
    all_rows = rows(rep)
    stamp = time.strftime("%H:%M:%S", time.localtime(clock()))
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(sanitize(title, 40), style="bold")
    head.append(f"  {stamp}  backend {_t(rep.get('backend'))}  {summary(all_rows)}")
    foot = Text(no_wrap=True, overflow="ellipsis", style="dim")
    n_mod = sum(1 for r in all_rows if r.number is not None)
    if keys:
        digits = f"1-{min(n_mod, 9)}" if n_mod > 1 else "1"
        foot.append(f"{digits}/up/down+Enter: details  Esc: close  q: quit")
    else:
        foot.append("Ctrl-C quits")
    opened = next((r for r in all_rows if r.key == state.opened), None)
    details: list = []
    if opened is not None:
        name = f"#{opened.number} " if opened.number else ""
        details.append(Rule(Text(f"{name}{opened.cells[1]} {opened.cells[2]}",
                                 overflow="ellipsis"), align="left", style="dim"))  # fmt: skip
        details += [Text(x, no_wrap=True, overflow="ellipsis") for x in detail_lines(opened)]
    room = max(1, height - 1 - 3 - len(details))  # header, table head, footer
    if len(all_rows) > room and details:  # the table first: the details give way
        keep = max(2, len(details) - (len(all_rows) - room))
        details = details[:keep]
        room = max(1, height - 1 - 3 - len(details))
    shown = all_rows if len(all_rows) <= room else all_rows[: max(room - 1, 0)]
    table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False,
                  header_style="bold", expand=False, width=None)  # fmt: skip
    for (name, justify, _lo, _hi), w in zip(COLUMNS, column_widths(shown, width), strict=True):
        table.add_column(Text(name), justify=justify, no_wrap=True, overflow="ellipsis",
                         width=w)  # fmt: skip
    for r in shown:
        style = RANK_STYLES[r.rank]
        if r.key == state.cursor and keys:
            style = (style + " reverse").strip()
        table.add_row(*(Text(c) for c in r.cells), style=style or None)
    parts: list = [head, table]
    if len(shown) < len(all_rows):
        rest = all_rows[len(shown) :]
        words = sorted({r.cells[2] for r in rest})
        more = f"... {len(rest)} more ({', '.join(words)})"
        parts.append(Text(more, no_wrap=True, overflow="ellipsis", style="dim"))
    parts += details
    parts.append(foot)
    return Group(*parts)


def render_text(rep: dict, width: int = 80, height: int = 24, **kw) -> str:
    """:func:`view` rendered to plain text (the tests; ``status`` could use it)."""
    import io

    from rich.console import Console

    con = Console(file=io.StringIO(), width=width, height=height, record=True,
                  color_system=None, force_terminal=False, legacy_windows=False)  # fmt: skip
    con.print(view(rep, width, height, **kw))
    return con.export_text()


def plain_lines(rep: dict, clock: Callable[[], float] = time.time) -> list[str]:
    """The view off a terminal: one line per module (and per GPU no module cools)
    per refresh, time stamped, in the report's order, no escape codes."""
    stamp = time.strftime("%H:%M:%S", time.localtime(clock()))
    out = [f"{stamp} #{i + 1} {module_clause(m)}" for i, m in enumerate(rep["modules"])]
    paired = {m["gpu"]["uuid"] for m in rep["modules"] if m.get("gpu")}
    for g in rep.get("gpus") or []:
        if g.get("uuid") not in paired:
            out.append(f"{stamp} {gpu_line(g)} (no module)")
    return _lines(out or [f"{stamp} no modules"])


# ----------------------------------------------------------------------------- keys

KEYS = {  # bytes a terminal sends -> the view's name for them
    b"\x1b[A": "up", b"\x1bOA": "up", b"k": "up",
    b"\x1b[B": "down", b"\x1bOB": "down", b"j": "down",
    b"\r": "enter", b"\n": "enter", b" ": "enter",
    b"\x1b": "esc", b"0": "esc",
    b"q": "q", b"Q": "q",
}  # fmt: skip


def parse_keys(data: bytes) -> list[str]:
    """The keys in what one read of a terminal returned (digits as themselves).

    >>> parse_keys(b"3\\x1b[Bq\\x1b")
    ['3', 'down', 'q', 'esc']
    """
    out, i = [], 0
    while i < len(data):
        for n in (3, 1):
            name = KEYS.get(data[i : i + n])
            if name is not None:
                out.append(name)
                i += n
                break
        else:
            ch = data[i : i + 1]
            if ch.isdigit():
                out.append(ch.decode())
            elif ch == b"\x1b":  # an escape sequence we do not use: skip it whole
                m = 2
                while i + m < len(data) and not (0x40 <= data[i + m] <= 0x7E):
                    m += 1
                i += m
            i += 1
    return out


class _KeyReader:
    """Reads keys from a terminal on stdin (cbreak mode: no echo, Ctrl-C still a
    signal) on a thread of its own and hands them to ``on_key``; the terminal's mode
    comes back on :meth:`stop`."""

    def __init__(self, fd: int, on_key: Callable[[str], None]):
        import termios
        import tty

        self.fd = fd
        self.on_key = on_key
        self._saved = termios.tcgetattr(fd)
        tty.setcbreak(fd, termios.TCSANOW)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="monitor-keys", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import select

        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                data = os.read(self.fd, 64) if ready else b""
            except OSError:
                return
            if ready and not data:
                return  # the terminal went away
            for k in parse_keys(data):
                self.on_key(k)

    def stop(self) -> None:
        import termios

        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(1.0)
        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
        except termios.error:  # pragma: no cover - the terminal is gone
            pass


class _ConsoleHandler(logging.Handler):
    """Log records printed through the live view's console: above the live region,
    which rich redraws under them."""

    def __init__(self, console, like: logging.Handler):
        super().__init__(like.level)
        self.console = console
        self.setFormatter(like.formatter)
        for f in like.filters:
            self.addFilter(f)

    def emit(self, record: logging.LogRecord) -> None:
        from rich.text import Text

        try:
            self.console.print(Text(self.format(record)), highlight=False)
        except Exception:  # noqa: BLE001 - as logging.Handler: a record never raises
            self.handleError(record)


def _on_terminal(h: logging.Handler) -> bool:
    stream = getattr(h, "stream", None)
    if not isinstance(h, logging.StreamHandler) or isinstance(h, logging.FileHandler):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# ----------------------------------------------------------------------------- LiveView


class LiveView:
    """``monitor`` and ``run --live``: on a terminal the rich live view, redrawn in
    place, with keys when stdin is a terminal too; otherwise :func:`plain_lines`.

    ``draw(rep)`` per refresh; :meth:`close` at the end (the last view stays on the
    screen, the terminal's mode and the log handlers come back). While the view is
    up, a log handler writing to a terminal is swapped for one that prints above the
    live region. ``q`` sets :attr:`quit` and calls ``on_quit``.
    """

    def __init__(self, out=None, tty: bool | None = None, title: str = "modbridge monitor",
                 keys: bool | None = None, on_quit: Callable[[], None] | None = None,
                 size: tuple[int, int] | None = None, stdin=None):  # fmt: skip
        self.out = out if out is not None else sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.title = title
        self.frames = 0
        self.quit = False
        self.on_quit = on_quit
        self.state = ViewState()
        self._stdin = stdin if stdin is not None else sys.stdin
        if keys is None:
            try:
                keys = self.tty and self._stdin.isatty()
            except (AttributeError, ValueError):
                keys = False
        self.keys = bool(keys)
        self._size = size
        self._rep: dict | None = None
        self._lock = threading.RLock()
        self._live = None
        self._console = None
        self._reader: _KeyReader | None = None
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []

    # -- drawing
    def draw(self, rep: dict) -> None:
        with self._lock:
            self._rep = rep
            if not self.tty:
                self.out.write("".join(x + "\n" for x in plain_lines(rep)))
                self.out.flush()
            else:
                if self._live is None:
                    self._start()
                self._refresh()
            self.frames += 1

    def _start(self) -> None:
        from rich.console import Console
        from rich.live import Live

        w, h = self._size or (None, None)
        self._console = Console(file=self.out, force_terminal=True, width=w, height=h,
                                highlight=False, legacy_windows=False)  # fmt: skip
        real = self.out is sys.stdout
        self._live = Live(console=self._console, auto_refresh=False, transient=False,
                          vertical_overflow="crop", redirect_stdout=real,
                          redirect_stderr=real)  # fmt: skip
        self._live.start()
        atexit.register(self.close)  # the terminal's mode back whatever way we leave
        root = logging.getLogger()
        for h in list(root.handlers):
            if _on_terminal(h):
                mine = _ConsoleHandler(self._console, h)
                root.removeHandler(h)
                root.addHandler(mine)
                self._swapped.append((h, mine))
        if self.keys:
            try:
                self._reader = _KeyReader(self._stdin.fileno(), self.key)
            except (OSError, ValueError, AttributeError):  # not a terminal after all
                self.keys = False
            except Exception as e:  # noqa: BLE001 - termios.error: keys are a nicety
                logging.getLogger(__name__).debug("no keys: %s", e)
                self.keys = False

    def _refresh(self) -> None:
        if self._live is None or self._rep is None:
            return
        all_rows = rows(self._rep)
        keys = [r.key for r in all_rows]
        if self.state.cursor not in keys:
            self.state.cursor = keys[0] if keys else None
        w, h = self._console.size
        self._live.update(view(self._rep, w, h, self.state, self.keys, self.title),
                          refresh=True)  # fmt: skip

    # -- keys
    def key(self, name: str) -> None:
        """One key (as :func:`parse_keys` names it): a digit opens that module's
        details (again: closes them), up/down move the cursor, Enter opens the
        cursor's line, Esc closes, q quits."""
        with self._lock:
            st = self.state
            all_rows = rows(self._rep) if self._rep is not None else []
            keys = [r.key for r in all_rows]
            if name == "q":
                self.quit = True
                if self.on_quit is not None:
                    self.on_quit()
                return
            if name.isdigit():
                row = next((r for r in all_rows if r.number == int(name)), None)
                if row is not None:
                    st.cursor = row.key
                    st.opened = None if st.opened == row.key else row.key
            elif name in ("up", "down") and keys:
                i = keys.index(st.cursor) if st.cursor in keys else 0
                i = max(0, min(len(keys) - 1, i + (1 if name == "down" else -1)))
                st.cursor = keys[i]
            elif name == "enter" and st.cursor is not None:
                st.opened = None if st.opened == st.cursor else st.cursor
            elif name == "esc":
                st.opened = None
            self._refresh()

    def close(self) -> None:
        """Stop the live view (idempotent): the last view stays, the terminal's mode
        and the log handlers come back."""
        with self._lock:
            if self._reader is not None:
                self._reader.stop()
                self._reader = None
            root = logging.getLogger()
            for theirs, mine in self._swapped:
                root.removeHandler(mine)
                root.addHandler(theirs)
            self._swapped = []
            if self._live is not None:
                self._live.stop()
                self._live = None
                atexit.unregister(self.close)

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
