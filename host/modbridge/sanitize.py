"""Make a string from the wire safe to print on a terminal or write to a log line.

A module is not trusted to send clean text: its id, board, firmware version, the
text of an event or a NACK and the keys of a config are whatever its bytes say. Put
raw on a terminal, an ESC or a C1 CSI starts an escape sequence (move the cursor,
retitle the window, rewrite the screen); a newline forges a log line; a bidi override
shows text in an order other than the bytes'. :func:`sanitize` replaces every
character that is not printable with a visible escape, bounds the length, and
returns a ``str`` that always encodes to valid UTF-8:

- ``\\t``, ``\\n``, ``\\r`` as themselves, other code points below U+0100 as
  ``\\xNN`` (NUL, ESC, DEL, the C1 controls U+0080-U+009F with CSI and OSC, NBSP),
  the rest as ``\\uNNNN`` / ``\\UNNNNNNNN``: bidi overrides and isolates
  (U+202A-U+202E, U+2066-U+2069), marks, zero-width characters, line and paragraph
  separators, lone surrogates, private-use and unassigned code points. "Printable"
  is :meth:`str.isprintable`: letters, digits, marks, punctuation, symbols and the
  ASCII space.
- ``bytes`` are decoded as UTF-8; a byte that is not UTF-8 becomes ``\\xNN``.
  Anything else is ``str(value)`` first.
- At most ``max_len`` characters come out (default :data:`MAX_LEN`): a longer result
  is cut before the escape that would cross the bound and ends in ``...``. None
  means no bound.

Backslashes are left alone, so the function is idempotent (sanitising twice is
sanitising once; every layer may apply it without doubling escapes). The price is
that a module sending the six characters ``\\x1b`` prints like one sending ESC:
the output is safe, not a reversible encoding. Where the exact bytes matter, keep
the raw value (the event log's JSON escapes it losslessly) and sanitise at output.

>>> sanitize("fan\\x1b[2J\\u202eok")
'fan\\\\x1b[2J\\\\u202eok'
>>> sanitize(b"bad\\xffbyte")
'bad\\\\xffbyte'
>>> sanitize("x" * 10, max_len=8)
'xxxxx...'
"""

from __future__ import annotations

#: Default bound on the output length, in characters (the catalog's longest string
#: field is 96; escapes can make it longer).
MAX_LEN = 200
ELLIPSIS = "..."

_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    cp = ord(ch)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def sanitize(value, max_len: int | None = MAX_LEN) -> str:
    """``value`` with every non-printable character escaped, at most ``max_len`` long."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        s = bytes(value).decode("utf-8", "backslashreplace")
    elif isinstance(value, str):
        s = value
    else:
        s = str(value)
    if s.isprintable():  # the common case, in C: nothing to escape
        if max_len is None or len(s) <= max_len:
            return s
        return _truncated(s, max_len)
    pieces = [ch if ch.isprintable() else _escape(ch) for ch in s]
    out = "".join(pieces)
    if max_len is None or len(out) <= max_len:
        return out
    # Cut between pieces: a plain character is one piece, an escape is never split.
    room = max_len - len(ELLIPSIS)
    n = 0
    for i, p in enumerate(pieces):
        n += len(p)
        if n > room:
            return _truncated("".join(pieces[:i]), max_len)
    return out  # pragma: no cover - len(out) > max_len >= room


def sanitize_lines(text) -> str:
    """``text`` for a terminal, line by line: each line :func:`sanitize`-d with no
    bound, joined by ``\n`` again. For output our code laid out in lines, whatever
    wire text went into it: the last guard before ``click.echo``."""
    if not isinstance(text, str):
        text = sanitize(text, None)
    if text.isprintable():
        return text
    return "\n".join(sanitize(line, None) for line in text.split("\n"))


def _truncated(s: str, max_len: int) -> str:
    """``s`` cut to end in ``...`` within ``max_len`` characters."""
    if max_len <= len(ELLIPSIS):
        return ELLIPSIS[: max(max_len, 0)]
    return s[: max_len - len(ELLIPSIS)] + ELLIPSIS
