"""``modbridge console``: a person's JSON-lines session with one module.

A person types the messages of protocol/SPEC.md section 13 as JSON lines in display
units (``{"type":"fan_mode","mode":"manual","duty1":40}``) or as a name and
``key=value`` pairs (``fan_mode mode=manual duty1=40``); the console checks the line
against the catalog (a clear message, nothing sent, when it does not fit), sends it,
signed when the module needs a signature (the key from the host's
:class:`~modbridge.link.keys.KeyStore`; a missing key says to pair), and shows what
the module sends back and on its own (replies, events, self-test reports) as JSON
lines in display units. Telemetry is shown as a compact line with units (throttled),
or hidden.

What it does for the person that a raw terminal does not (docs/console.md):

- framing: the link (:class:`~modbridge.link.session.ModuleLink`) opens the port with
  a 0x00 flush, asks for the hello, and speaks binary frames; the module answers a
  frame with a frame, which the console shows as the JSON line the module would have
  written (the same reference encoder, protocol/jsonl.py). A module left in JSON mode
  by a terminal is read just the same (the stream decoder takes both, section 8), and
  the console's first frame switches it back. Binary frames also keep signed commands
  that carry floats exact (SPEC.md section 16, item 4);
- heartbeats: signed, every ``heartbeat_period_s`` from the link's thread, so the
  module stays HOSTED (without them it counts the host as gone and goes STANDALONE);
- signing: with the module's key and nonce, as the bridge does, on link id 2 (a
  person's tools, SPEC.md section 14.1).

:class:`Console` takes a line and returns what to show (:class:`Shown` items), so
it is tested without a terminal; :mod:`modbridge.cli.console` adds the prompt, line
editing, history and tab completion, or reads a pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from modbridge.errors import ModbridgeError
from modbridge.sanitize import sanitize
from protocol import catalog as C
from protocol import jsonl
from protocol.errors import FieldError, ProtocolError, UnknownTypeError

LINK_ID = 2  # SPEC.md 14.1: a person's tools sign as link 2
HEARTBEAT_PERIOD_S = 1.0
UP_TIMEOUT_S = 5.0
TELEMETRY_EVERY_S = 10.0  # a compact telemetry line at most this often (and on changes)
SPLIT_WAIT_S = 0.1  # after a config reply: the rest of a section split in frames
HISTORY_NAME = "console_history"
INBOX_MAX = 4096  # messages kept for the screen while nobody looks (over an hour of telemetry)
COMMANDS = ("help", "status", "telemetry", "quit")  # the console's own words
# Messages the console does not send for a person, and why (nothing is sent).
_NOT_TYPED = {
    "heartbeat": "the console sends signed heartbeats itself",
    "pair": "use `modbridge pair <port>`: it also stores the new key, which this "
    "console would keep signing without",
}


class ConsoleError(ModbridgeError):
    """The console cannot start (a busy port, no permission); the message says what
    to do (exit 1)."""

    exit_code = 1


class NoModule(ConsoleError):
    """No such port, or no module answers on it (exit 3)."""

    exit_code = 3


@dataclass
class Shown:
    """One line to show. ``kind``: ``module`` (a message from the module, ``text`` its
    JSON line), ``telemetry`` (compact, with units), ``refused`` (a NACK in words),
    ``error`` (the line was not sent, or the link failed), ``info`` (the console)."""

    kind: str
    text: str
    message: dict | None = None  # module messages: name, seq and display fields

    def __str__(self) -> str:
        """The line for a terminal: whatever wire text is in it, escaped."""
        if self.kind == "error":
            return "error: " + sanitize(self.text, None)
        return sanitize(self.text, None)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Result:
    """What :meth:`Console.handle` made of a line: what to show, and whether the
    session is over (``quit``, or the module handed the port to its REPL)."""

    shown: list[Shown] = field(default_factory=list)
    quit: bool = False
    sent: str | None = None  # the message name sent, if one was


def history_path(environ=None) -> Path:
    """``$XDG_STATE_HOME/modbridge/console_history`` (``~/.local/state`` without it)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "modbridge" / HISTORY_NAME


# ------------------------------------------------------------------ the catalog


def command_names() -> list[str]:
    """The messages a person may send (host -> module, but heartbeats and pair)."""
    names = [m[C.M_NAME] for m in C.MESSAGES if m[C.M_DIR] == C.H2D]
    return [n for n in names if n not in _NOT_TYPED]


def _unit(fdef) -> str:
    """The unit a person types for a field (``m degC`` on the wire: degC; duty: %)."""
    scale, unit = fdef[C.F_SCALE], fdef[C.F_UNIT] or ""
    if scale == C.DUTY_PCT:
        return "%"
    if scale is not None and unit.startswith("m "):
        return unit[2:]
    if scale is not None and unit in ("mV", "mA", "mW"):
        return unit[1:]
    return unit


def _shown_bound(fdef, v) -> str:
    scale = fdef[C.F_SCALE]
    if scale is not None and fdef[C.F_KIND] != C.K_ENUM:
        return jsonl.format_fixed(v, scale)
    return str(v)


def field_help(fdef) -> str:
    """One field as a person types it: ``duty1 0..100 %``, ``mode auto|manual|curve``."""
    name, kind = fdef[C.F_NAME], fdef[C.F_KIND]
    lo, hi = fdef[C.F_LO], fdef[C.F_HI]
    if kind == C.K_ENUM:
        text = f"{name} {'|'.join(fdef[C.F_SCALE])}"
    elif kind in (C.K_UINT, C.K_INT, C.K_NUM):
        span = ""
        if lo is not None and hi is not None:
            span = f" {_shown_bound(fdef, lo)}..{_shown_bound(fdef, hi)}"
        unit = _unit(fdef)
        text = f"{name}{span}{' ' + unit if unit else ''}"
    else:
        what = {C.K_STR: "text", C.K_BYTES: "hex", C.K_BOOL: "true|false", C.K_LIST: "[...]",
                C.K_MAP: "{...}"}.get(kind, kind)  # fmt: skip
        text = f"{name} {what}"
    return text + ("" if fdef[C.F_REQUIRED] else " (optional)")


def help_lines(name: str | None = None) -> list[str]:
    """``help``: every message a person can send, with its fields; ``help <name>``:
    one message (either direction) with what it is for."""
    from modbridge.link.requests import OPEN_REQUESTS

    if name:
        mdef = C.by_name(name)
        if mdef is None:
            raise KeyError(name)
        try:
            from modbridge.firmware_host.catalog_doc import field_doc, message_doc

            doc = message_doc(name)
        except (ImportError, KeyError):  # pragma: no cover - every message is documented
            doc, field_doc = "", None
        way = "you send it" if mdef[C.M_DIR] == C.H2D else "the module sends it"
        signed = ", signed" if mdef[C.M_DIR] == C.H2D and name not in OPEN_REQUESTS else ""
        out = [f"{name} (0x{mdef[C.M_TYPE]:02x}, {way}{signed}): {doc}".rstrip(": ")]
        for f in mdef[C.M_FIELDS]:
            d = ""
            if field_doc is not None:
                try:
                    d = field_doc(name, f[C.F_NAME])
                except KeyError:
                    d = ""
            out.append(f"  {field_help(f)}" + (f": {d}" if d else ""))
        return out
    out = ["messages (type a JSON line, or a name and key=value pairs; `help <name>` for one):"]
    for n in command_names():
        mdef = C.by_name(n)
        fields = ", ".join(field_help(f) for f in mdef[C.M_FIELDS]) or "no fields"
        lock = "" if n in OPEN_REQUESTS else " [signed]"
        out.append(f"  {n}{lock}: {fields}")
    out.append('e.g. {"type":"fan_mode","mode":"manual","duty1":40}  or  setpoints sp_gpu=70')
    out.append("console: help [name], status, telemetry (the latest, in full), quit (or Ctrl-D); "
               "the console sends the heartbeats itself")  # fmt: skip
    return out


# ------------------------------------------------------------------ parsing


def _value(text: str):
    """``key=value``: the value as JSON when it parses (numbers, lists, true), else
    the text itself (``mode=manual``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_line(line: str) -> tuple[str, dict, int]:
    """A typed line -> (message name, wire fields, seq typed or 0), or
    :class:`ProtocolError` / ``ValueError`` with a message for a person."""
    s = line.strip()
    if s.startswith("{"):
        obj_line = s
    else:
        words = s.split()
        name, pairs = words[0], words[1:]
        if C.by_name(name) is None:
            raise UnknownTypeError(f"unknown message or command {name!r}")
        obj = {"type": name}
        for p in pairs:
            key, eq, raw = p.partition("=")
            if not eq or not key:
                raise ValueError(f"{p!r}: give fields as key=value (e.g. duty1=40)")
            obj[key] = _value(raw)
        obj_line = json.dumps(obj, separators=(",", ":"))
    try:
        msg = jsonl.decode_line(obj_line.encode("utf-8"), accept=C.H2D)
    except FieldError as e:
        raise FieldError(_field_text(obj_line, e), e.code, e.field) from None
    return msg.name, dict(msg.fields), msg.seq


def _field_text(obj_line: str, e: FieldError) -> str:
    """A FieldError in display units (the decoder's own text names wire values)."""
    text = str(e)
    if e.code != C.ERR_OUT_OF_RANGE or not e.field:
        if e.code == C.ERR_DIRECTION:
            return text.replace("is not accepted in this direction",
                                "is sent by the module, not to it")  # fmt: skip
        return text
    try:
        name = json.loads(obj_line).get("type")
    except ValueError:  # pragma: no cover - it parsed a moment ago
        return text
    mdef = C.by_name(name) if isinstance(name, str) else None
    if mdef is None:
        return text
    for f in mdef[C.M_FIELDS]:
        if f[C.F_NAME] == e.field and f[C.F_KIND] != C.K_ENUM:
            typed = json.loads(obj_line).get(e.field)
            return f"{e.field}={json.dumps(typed)} is out of range: {field_help(f)}"
    return text


# ------------------------------------------------------------------ rendering


def message_line(msg) -> str:
    """A module message as the JSON line the module writes in JSON mode."""
    try:
        return jsonl.encode_line(msg.name, msg.fields, msg.seq).decode("utf-8").rstrip("\n")
    except ProtocolError:  # a field the encoder refuses: show what we have
        return json.dumps({"type": msg.name, "seq": msg.seq, **{k: repr(v) for k, v in
                                                                 msg.fields.items()}})  # fmt: skip


def _fault_names(mask: int) -> list[str]:
    names = [n for i, n in enumerate(C.FAULT_BITS) if mask & (1 << i)]
    return names or ([f"0x{mask:x}"] if mask else [])


def _r(v, digits: int) -> str:
    return f"{round(float(v), digits):g}"


def telemetry_line(fields: dict) -> str:
    """Telemetry (wire fields) as one compact line in the units a person reads."""
    d = json.loads(jsonl.encode_line("telemetry", fields, 0))
    parts = [str(d.get("state", "?"))]
    if d.get("reason") not in (None, "none", "host_ok"):
        parts[-1] += f" ({d['reason']})"
    temps = [f"{ch} {_r(d['temp_' + ch], 1)}C" for ch in C.CHANNELS if "temp_" + ch in d]
    if temps:
        parts.append(" ".join(temps))
    fans = []
    for i in (1, 2):
        rpm, duty = d.get(f"fan{i}_rpm"), d.get(f"fan{i}_duty")
        if rpm is not None or duty is not None:
            txt = f"fan{i}"
            txt += f" {rpm} rpm" if rpm is not None else ""
            txt += f" {_r(duty, 1)}%" if duty is not None else ""
            fans.append(txt)
    if fans:
        parts.append(" ".join(fans))
    units = (("v_in", "V", 2), ("i_in", "A", 2), ("p_in", "W", 1))
    power = [f"{_r(d[k], n)}{u}" for k, u, n in units if k in d]
    if power:
        parts.append(" ".join(power))
    faults = fields.get("faults") or 0
    if faults:
        parts.append("faults " + ",".join(_fault_names(faults)))
    return "telemetry " + " | ".join(parts)


# ------------------------------------------------------------------ the link


def link_class():
    """:class:`~modbridge.link.session.ModuleLink` that hands every item it receives
    to a queue (``inbox``), besides doing what a link does with it."""
    from modbridge.link.session import ModuleLink

    class ConsoleLink(ModuleLink):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.inbox: queue.Queue = queue.Queue(INBOX_MAX)

        def _dispatch(self, item, now):
            while True:  # nobody reading (a pipe that waits): the oldest go
                try:
                    self.inbox.put_nowait(item)
                    break
                except queue.Full:
                    with contextlib.suppress(queue.Empty):
                        self.inbox.get_nowait()
            super()._dispatch(item, now)

    return ConsoleLink


def open_link(port: str, keys, heartbeat_source=None,
              heartbeat_period_s: float = HEARTBEAT_PERIOD_S,
              up_timeout_s: float = UP_TIMEOUT_S):  # fmt: skip
    """A started :func:`link_class` link on ``port`` with its hello in; ConsoleError
    when the port cannot be opened or no module answers."""
    from modbridge.link.session import LinkError

    if not os.path.exists(port):
        raise NoModule(f"{port}: no such port (is the module plugged in? `modbridge list`)")
    link = link_class()(port, keys=keys, link_id=LINK_ID, heartbeat_period_s=heartbeat_period_s,
                        heartbeat_source=heartbeat_source)  # fmt: skip
    try:
        link.start()
    except LinkError as e:
        link.stop()
        raise ConsoleError(f"{e}") from None
    if not link.wait_up(up_timeout_s):
        why = link.status.last_error or f"no hello within {up_timeout_s:g} s"
        link.stop()
        raise NoModule(f"{port}: no module answered: {why}")
    return link


class SimModule:
    """A virtual module for ``--sim`` (the real firmware in MicroPython on a pty) and
    its virtual GPU's readings for the heartbeats; :meth:`close` stops it."""

    def __init__(self, speed: float = 1.0, world: str = "default"):
        from modbridge.gpu.virtual import VirtualBackend
        from modbridge.sim.fleet import SimFleet

        try:
            self.fleet = SimFleet(1, world=world, speed=speed).start()
        except (ModbridgeError, OSError, ValueError) as e:
            raise ConsoleError(f"cannot start the virtual module: {e}") from None
        self.speed = speed
        self.port = self.fleet.ports[0]
        self.keys = self.fleet.keys
        self._backend = VirtualBackend(self.fleet.gpus)
        self._uuid = self.fleet.gpus[0].uuid

    @property
    def heartbeat_period_s(self) -> float:
        """Two heartbeats a world second at most (the module's host timeout is 5 s of
        its time, and the heartbeats keep wall time)."""
        return min(HEARTBEAT_PERIOD_S, max(0.02, 0.5 / self.speed)) if self.speed else 0.02

    def heartbeat(self) -> dict | None:
        from modbridge.bridge import heartbeat_fields

        return heartbeat_fields(self._backend.sample(self._uuid))

    def close(self) -> None:
        self.fleet.stop()


# ------------------------------------------------------------------ the console


class Console:
    """A JSON-lines session over a link from :func:`open_link` (or any object with
    its ``request``, ``inbox``, ``status``, ``port``, ``key_error`` and
    ``heartbeats_sent``).

    :meth:`handle` takes a typed line and returns a :class:`Result`;
    :meth:`pending` what the module sent on its own since the last call (events,
    reports, throttled telemetry). Both are safe to call from different threads.
    """

    def __init__(self, link, *, telemetry: str = "compact",
                 telemetry_every_s: float = TELEMETRY_EVERY_S, clock=time.monotonic):  # fmt: skip
        if telemetry not in ("compact", "json", "off"):
            raise ValueError(f"telemetry must be compact, json or off, not {telemetry!r}")
        self.link = link
        self.telemetry = telemetry
        self.telemetry_every_s = telemetry_every_s
        self.clock = clock
        self._lock = threading.Lock()
        self._tel_shown_at: float | None = None
        self._tel_state = None
        self.last_telemetry: dict | None = None
        self.sent = 0
        self.refused = 0

    # -- typed lines -------------------------------------------------------------
    def handle(self, line: str) -> Result:
        """What to show for one typed line (and whether the session ends)."""
        s = line.strip()
        if not s or s.startswith("#"):
            return Result()
        words = s.split()
        word = words[0].lower()
        if not s.startswith("{"):
            if word in ("quit", "exit"):
                return Result(quit=True)
            if word in ("help", "?"):
                return self._help(words[1:])
            if word == "status":
                return Result(self._status())
            if word == "telemetry" and len(words) == 1:  # the message has no such use
                return Result(self._latest_telemetry())
        try:
            name, fields, _seq = parse_line(s)
        except UnknownTypeError as e:
            return Result([Shown("error", f"{e}; `help` lists the messages")])
        except (ProtocolError, ValueError) as e:
            return Result([Shown("error", f"{e}; nothing sent (`help {_typed_name(s)}`)")])
        if name in _NOT_TYPED:
            return Result([Shown("error", f"{name}: {_NOT_TYPED[name]}; nothing sent")])
        return self._send(name, fields)

    def _help(self, args) -> Result:
        try:
            return Result([Shown("info", t) for t in help_lines(args[0] if args else None)])
        except KeyError:
            return Result([Shown("error", f"no message {args[0]!r}; `help` lists them")])

    def _send(self, name: str, fields: dict) -> Result:
        from modbridge.link.session import CommandRefused, LinkError

        res = Result(sent=name)
        self.sent += 1
        try:
            reply = self.link.request(name, fields or None)
        except KeyboardInterrupt:
            res.shown = self.pending() + [Shown("info", f"{name}: stopped waiting for the answer")]
            return res
        except CommandRefused as e:
            self.refused += 1
            res.shown = self.pending()
            res.shown.append(Shown("refused", f"refused: {_refusal(e)}"))
            return res
        except LinkError as e:
            res.shown = self.pending()
            res.shown.append(Shown("error", str(e)))
            return res
        if reply.name == "config":
            time.sleep(SPLIT_WAIT_S)  # a section too big for a frame: the rest follows
        res.shown = self.pending()
        if name == "repl":
            res.quit = True
            res.shown.append(Shown("info", f"the module is at its MicroPython REPL: the port is "
                                   f"handed back (mpremote connect {self.link.port}); "
                                   "the protocol resumes after a reset"))  # fmt: skip
        elif name == "reboot":
            res.shown.append(Shown("info", "rebooting: the console signs with the new nonce "
                                   "once the module's hello is in"))  # fmt: skip
        return res

    # -- what the module sends -----------------------------------------------------
    def pending(self) -> list[Shown]:
        """Everything the module sent since the last call, as lines to show."""
        out: list[Shown] = []
        inbox = self.link.inbox
        with self._lock:
            while True:
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    break
                shown = self._render(item)
                if shown is not None:
                    out.append(shown)
        return out

    def _render(self, item) -> Shown | None:
        name = getattr(item, "name", None)
        if getattr(item, "ok", False):
            if name == "telemetry":
                return self._telemetry(item)
            text = message_line(item)
            try:
                display = json.loads(text)
            except ValueError:  # pragma: no cover - message_line writes JSON
                display = {"type": name}
            return Shown("module", text, display)
        if hasattr(item, "fw_version"):  # a boot banner
            return Shown("info", f"the module booted (firmware {item.fw_version})")
        kind = getattr(item, "kind", None)
        if kind is None or kind == "noise":
            return None  # text the module printed (a traceback is noise too)
        detail = getattr(item, "detail", "")
        return Shown("info", f"a bad frame from the module: {kind}"
                     + (f" ({detail})" if detail else ""))  # fmt: skip

    def _telemetry(self, item) -> Shown | None:
        fields = dict(item.fields)
        self.last_telemetry = fields
        if self.telemetry == "off":
            return None
        now = self.clock()
        state = (fields.get("state"), fields.get("reason"), fields.get("faults"))
        due = (self._tel_shown_at is None or state != self._tel_state
               or now - self._tel_shown_at >= self.telemetry_every_s)  # fmt: skip
        if not due:
            return None
        self._tel_shown_at = now
        self._tel_state = state
        if self.telemetry == "json":
            return Shown("telemetry", message_line(item))
        return Shown("telemetry", telemetry_line(fields))

    def _latest_telemetry(self) -> list[Shown]:
        out = self.pending()  # what is waiting first: the latest telemetry is among it
        if self.last_telemetry is None:
            tel = getattr(self.link.status, "telemetry", None)
            if tel is None:
                return out + [Shown("info", "no telemetry yet")]
            self.last_telemetry = dict(tel)
        line = jsonl.encode_line("telemetry", self.last_telemetry, 0).decode().rstrip("\n")
        return out + [Shown("telemetry", line)]

    def _status(self) -> list[Shown]:
        link = self.link
        st = link.status
        tel = st.telemetry or {}
        state = C.STATES[tel["state"]] if "state" in tel and 0 <= tel["state"] < 5 else "?"
        signing = "off (the module verifies nothing)"
        if getattr(link, "signing_supported", False):
            err = getattr(link, "key_error", None)
            signing = f"no key: {err}" if err else "on"
        return [
            Shown("info", f"{link.port}: module {st.module_id or '?'}, firmware "
                  f"{st.fw_version or '?'}, board {st.board or '?'}, {state}"),
            Shown("info", f"signing {signing}; heartbeats sent {link.heartbeats_sent}, "
                  f"withheld {getattr(link, 'heartbeats_withheld', 0)}; commands sent "
                  f"{self.sent}, refused {self.refused}"),
        ]  # fmt: skip

    # -- completion ------------------------------------------------------------------
    def complete(self, text: str, line: str = "") -> list[str]:
        """Completions of ``text`` (the word being typed; ``line`` the whole line)."""
        names = command_names()
        before = line[: len(line) - len(text)] if line.endswith(text) else ""
        if before.strip():  # a field name after the message name
            mdef = C.by_name(before.split()[0])
            if mdef is None:
                return []
            return [f[C.F_NAME] + "=" for f in mdef[C.M_FIELDS] if f[C.F_NAME].startswith(text)]
        key = '{"type":"'
        if text.startswith(key):
            return [f'{key}{n}"' for n in names if (key + n).startswith(text)]
        return [n for n in (*names, *COMMANDS) if n.startswith(text)]


def _typed_name(s: str) -> str:
    if s.startswith("{"):
        try:
            t = json.loads(s).get("type")
            return t if isinstance(t, str) else ""
        except (ValueError, AttributeError):
            return ""
    return s.split()[0]


def _refusal(e) -> str:
    where = f" ({sanitize(e.field)})" if e.field else ""
    text = f": {sanitize(e.text)}" if e.text else ""
    msg = f"{e.code_name}{where}{text}"
    if e.code == C.ERR_UNAUTHORIZED:
        hint = str(e).split(": ", 1)[-1]
        if "modbridge pair" in hint and "modbridge pair" not in msg:
            msg += " (" + hint.rsplit(": ", 1)[-1] + ")"
    return msg
