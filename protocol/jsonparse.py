"""A strict JSON (RFC 8259) parser that says yes or no the same way everywhere.

``json.loads`` is not that parser: CPython raises ``RecursionError`` on deep nesting,
MicroPython's ``json`` accepts overlong UTF-8, raw control characters and ``NaN``,
and both let a repeated key win silently (``{"type":"hello_request",
"type":"config_reset"}`` is a factory reset). :func:`loads` is pure Python, has no
recursion (an explicit stack) and gives the same verdict on CPython, on the
MicroPython unix port and on a 32-bit MCU build.

Accepted: RFC 8259 JSON text, any value at the top (the caller checks its type),
whitespace (SP, TAB, LF, CR) around tokens. Refused with :class:`JSONError`, which
names the problem and the byte offset (into the UTF-8 bytes, also for ``str`` input):

- input longer than ``max_len`` bytes; empty input; a byte order mark;
- nesting deeper than ``max_depth``, counted like the CBOR decoder
  (:data:`protocol.cbor.DEFAULT_MAX_DEPTH`): the top value is level 0, the items of a
  container at level L (keys included) are at level L + 1, and an item above
  ``max_depth`` is refused. ``[[]]`` has its inner array at level 1;
- a key repeated in any object, at any depth;
- text that is not strict UTF-8 (RFC 3629): stray continuation bytes, overlong forms,
  UTF-8-encoded surrogates (ED A0..BF), code points past U+10FFFF, sequences cut
  short;
- raw control characters (below 0x20) in strings, escapes other than
  ``\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX``, and lone surrogate escapes: ``\\ud800``
  not followed by a low-surrogate escape, or a ``\\udc00`` without a high one
  (MicroPython strings cannot hold a lone surrogate, so neither side gets one);
- ``NaN``, ``Infinity``, ``-Infinity`` and every other bare word but ``true``,
  ``false`` and ``null`` (case-sensitive);
- numbers outside the grammar: leading zeros, ``+1``, ``.5``, ``1.``, ``1e``, hex;
- integers outside the signed 64-bit range (-2**63 .. 2**63 - 1; more than 19 digits
  is refused before any big int is made) -- the range every MicroPython integer
  implementation holds exactly;
- numbers with a fraction or exponent whose magnitude is 1e38 or more, decided on the
  decimal text, not on a float: that is finite in single precision (max ~3.4e38), the
  float format of the STM32F4 and RP2040 builds, so no board turns it into infinity.
  Smaller magnitudes are accepted; below ~1e-330 they are 0.0 (-0.0 with a minus);
- trailing commas, missing commas or colons, and anything but whitespace after the
  value.

Values: objects -> dict, arrays -> list, strings -> str, integers (no fraction, no
exponent; ``-0`` is 0) -> int, other numbers -> float, true/false/null -> True/False/
None. Keys are inserted in input order: CPython's dict keeps it, MicroPython's plain
dict keeps no order at all (as with its own ``json``). Float values may differ in
the last digits between interpreters (MicroPython's conversion is not correctly
rounded; MCU builds are single precision) but the accept/reject verdict never does:
it depends only on the bytes.

The parser allocates freely (it is for the human command path and the config file,
never the control tick).

>>> loads(b'{"a":[1,2.5,"x",true,null]}')
{'a': [1, 2.5, 'x', True, None]}
"""

from protocol.cbor import DEFAULT_MAX_DEPTH

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


DEFAULT_MAX_LEN = 1024  # protocol.frame.MAX_LINE (not imported: frame imports jsonl)

INT_MAX = 0x7FFFFFFFFFFFFFFF
INT_MIN = -INT_MAX - 1
_INT_DIGITS = const(19)  # len(str(2**63))
FLOAT_MAX_EXP10 = 38  # refuse a fraction/exponent number >= 10**38 in magnitude
_UNDERFLOW_EXP10 = const(-330)  # below 10**-330 every float format rounds to zero
_HUGE_EXP = const(1000000000)  # stands in for an exponent with more than 9 digits

_QUOTE = const(0x22)
_BACKSLASH = const(0x5C)
_MINUS = const(0x2D)
_DOT = const(0x2E)
_ZERO = const(0x30)
_NINE = const(0x39)

_SIMPLE_ESCAPES = {
    0x22: '"',
    0x5C: "\\",
    0x2F: "/",
    0x62: "\b",
    0x66: "\f",
    0x6E: "\n",
    0x72: "\r",
    0x74: "\t",
}
_LITERALS = ((b"true", True), (b"false", False), (b"null", None))


class JSONError(ValueError):
    """Input refused by :func:`loads`. ``reason`` says why, ``offset`` is the byte
    offset where the problem was found; ``str()`` gives both."""

    def __init__(self, reason, offset):
        super().__init__("%s (at byte %d)" % (reason, offset))
        self.reason = reason
        self.offset = offset


def _is_ws(c):
    return c == 0x20 or c == 0x0A or c == 0x0D or c == 0x09


def _skip_ws(b, i, n):
    while i < n and _is_ws(b[i]):
        i += 1
    return i


def _is_digit(c):
    return _ZERO <= c <= _NINE


def _is_letter(c):
    return 0x61 <= (c | 0x20) <= 0x7A


def _show_byte(c):
    if 0x20 < c < 0x7F:
        return "'%s'" % chr(c)
    return "byte 0x%02x" % c


def _word(b, i, n):
    """The run of letters at ``b[i]`` (for messages about bare words)."""
    j = i
    while j < n and j - i < 16 and (_is_letter(b[j])):
        j += 1
    return str(b[i:j], "ascii")


def _utf8_end(b, i, n):
    """End of the strict UTF-8 sequence whose lead byte (>= 0x80) is ``b[i]``."""
    c = b[i]
    lo = 0x80
    hi = 0xBF
    why = ""  # what a second byte outside lo..hi (but a continuation byte) means
    if 0xC2 <= c <= 0xDF:
        more = 1
    elif 0xE0 <= c <= 0xEF:
        more = 2
        if c == 0xE0:
            lo, why = 0xA0, "overlong UTF-8 encoding"
        elif c == 0xED:
            hi, why = 0x9F, "UTF-8-encoded surrogate (U+D800..U+DFFF)"
    elif 0xF0 <= c <= 0xF4:
        more = 3
        if c == 0xF0:
            lo, why = 0x90, "overlong UTF-8 encoding"
        elif c == 0xF4:
            hi, why = 0x8F, "UTF-8 code point beyond U+10FFFF"
    elif c < 0xC0:
        raise JSONError("invalid UTF-8: stray continuation byte 0x%02x" % c, i)
    elif c < 0xC2:
        raise JSONError("overlong UTF-8 encoding (lead byte 0x%02x)" % c, i)
    elif c < 0xF8:
        raise JSONError("UTF-8 code point beyond U+10FFFF (lead byte 0x%02x)" % c, i)
    else:
        raise JSONError("invalid UTF-8: byte 0x%02x never occurs in UTF-8" % c, i)
    j = i + 1
    end = i + 1 + more
    while j < end:
        if j >= n or not 0x80 <= b[j] <= 0xBF:
            raise JSONError("invalid UTF-8: sequence cut short", i)
        if j == i + 1 and not lo <= b[j] <= hi:
            raise JSONError(why, i)
        j += 1
    return end


def _hex4(b, i, n):
    """Value of the four hex digits at ``b[i:i+4]`` (after a backslash-u)."""
    if i + 4 > n:
        raise JSONError("\\u escape needs four hex digits", i - 2)
    v = 0
    for j in range(i, i + 4):
        c = b[j]
        if _ZERO <= c <= _NINE:
            d = c - _ZERO
        elif 0x61 <= c <= 0x66:
            d = c - 0x57
        elif 0x41 <= c <= 0x46:
            d = c - 0x37
        else:
            raise JSONError("\\u escape needs four hex digits", i - 2)
        v = (v << 4) | d
    return v


def _string(b, i, n):
    """Parse the string whose opening quote is at ``b[i]``: ``(str, end)``."""
    start = i
    i += 1
    run = i  # start of the current stretch of plain bytes
    parts = None
    while True:
        if i >= n:
            raise JSONError("unterminated string", start)
        c = b[i]
        if c == _QUOTE:
            text = str(b[run:i], "utf-8")  # validated byte by byte below
            if parts is not None:
                parts.append(text)
                text = "".join(parts)
            return text, i + 1
        if c == _BACKSLASH:
            if parts is None:
                parts = []
            if i > run:
                parts.append(str(b[run:i], "utf-8"))
            if i + 1 >= n:
                raise JSONError("unterminated string", start)
            e = b[i + 1]
            if e in _SIMPLE_ESCAPES:
                parts.append(_SIMPLE_ESCAPES[e])
                i += 2
            elif e == 0x75:  # u
                cp = _hex4(b, i + 2, n)
                if 0xD800 <= cp <= 0xDBFF:
                    lo = -1
                    if i + 7 < n and b[i + 6] == _BACKSLASH and b[i + 7] == 0x75:
                        lo = _hex4(b, i + 8, n)
                    if not 0xDC00 <= lo <= 0xDFFF:
                        raise JSONError(
                            "lone surrogate escape \\u%04x (no low surrogate follows)" % cp, i
                        )
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    i += 6
                elif 0xDC00 <= cp <= 0xDFFF:
                    raise JSONError(
                        "lone surrogate escape \\u%04x (no high surrogate before it)" % cp, i
                    )
                parts.append(chr(cp))
                i += 6
            else:
                raise JSONError("invalid escape: %s after a backslash" % _show_byte(e), i)
            run = i
        elif c < 0x20:
            raise JSONError("raw control character 0x%02x in a string (escape it)" % c, i)
        elif c < 0x80:
            i += 1
        else:
            i = _utf8_end(b, i, n)


def _exp_value(b, i, j):
    """Integer value of the exponent digits ``b[i:j]``, capped at +-_HUGE_EXP."""
    while i < j - 1 and b[i] == _ZERO:
        i += 1
    if j - i > 9:
        return _HUGE_EXP
    return int(b[i:j])


def _number(b, i, n):
    """Parse the number at ``b[i]`` (a digit or '-'): ``(int or float, end)``."""
    start = i
    neg = b[i] == _MINUS
    if neg:
        i += 1
        if i >= n or not _is_digit(b[i]):
            if i < n and _is_letter(b[i]):
                raise JSONError("not a JSON value: -%s" % _word(b, i, n), start)
            raise JSONError("a number needs a digit after '-'", start)
    int_start = i
    if b[i] == _ZERO:
        i += 1
        if i < n and _is_digit(b[i]):
            raise JSONError("numbers must not have leading zeros", start)
    else:
        while i < n and _is_digit(b[i]):
            i += 1
    int_end = i
    frac_start = frac_end = i
    if i < n and b[i] == _DOT:
        i += 1
        frac_start = i
        while i < n and _is_digit(b[i]):
            i += 1
        frac_end = i
        if frac_end == frac_start:
            raise JSONError("a number needs digits after '.'", start)
    exp = 0
    has_exp = False
    if i < n and (b[i] == 0x65 or b[i] == 0x45):  # e E
        has_exp = True
        i += 1
        exp_neg = False
        if i < n and (b[i] == 0x2B or b[i] == _MINUS):  # + -
            exp_neg = b[i] == _MINUS
            i += 1
        exp_start = i
        while i < n and _is_digit(b[i]):
            i += 1
        if i == exp_start:
            raise JSONError("a number needs digits in its exponent", start)
        exp = _exp_value(b, exp_start, i)
        if exp_neg:
            exp = -exp
    if frac_end == frac_start and not has_exp:
        if int_end - int_start > _INT_DIGITS:
            raise JSONError("integer out of the 64-bit range (more than 19 digits)", start)
        v = int(b[start:i])
        if v > INT_MAX or v < INT_MIN:
            raise JSONError("integer out of the 64-bit range", start)
        return v, i
    # decimal exponent of the leading significant digit: 10**adj <= |value| < 10**(adj+1)
    k = int_start
    while k < int_end and b[k] == _ZERO:
        k += 1
    if k < int_end:
        adj = int_end - k - 1 + exp
    else:
        k = frac_start
        while k < frac_end and b[k] == _ZERO:
            k += 1
        if k == frac_end:
            return (-0.0 if neg else 0.0), i
        adj = frac_start - k - 1 + exp
    if adj >= FLOAT_MAX_EXP10:
        raise JSONError("number too large (magnitude 1e%d or more)" % FLOAT_MAX_EXP10, start)
    if adj < _UNDERFLOW_EXP10:
        return (-0.0 if neg else 0.0), i
    return float(b[start:i]), i


def _as_bytes(data, max_len):
    if isinstance(data, str):
        if len(data) > max_len:  # a char is at least one byte
            raise JSONError("input is longer than %d bytes" % max_len, max_len)
        try:
            return data.encode("utf-8")
        except UnicodeError:  # CPython: a str holding a lone surrogate
            raise JSONError("input str is not encodable as UTF-8", 0) from None
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError("loads() takes bytes, bytearray, memoryview or str")


def loads(data, max_depth=DEFAULT_MAX_DEPTH, max_len=DEFAULT_MAX_LEN):
    """Parse one JSON value from ``data`` (bytes, bytearray, memoryview or str).

    Returns dict/list/str/int/float/bool/None; raises :class:`JSONError` for anything
    the module docstring lists as refused, and TypeError for another input type.
    """
    b = _as_bytes(data, max_len)
    n = len(b)
    if n > max_len:
        raise JSONError("input is %d bytes, longer than %d" % (n, max_len), max_len)
    # the open containers: [list_or_dict, pending key or None]; len(stack) is the level
    if n >= 3 and b[0] == 0xEF and b[1] == 0xBB and b[2] == 0xBF:
        raise JSONError("byte order mark before the value", 0)
    stack = []
    i = _skip_ws(b, 0, n)
    while True:
        # -- a value starts at b[i], at level len(stack)
        if len(stack) > max_depth:
            raise JSONError("nesting deeper than %d" % max_depth, i)
        if i >= n:
            raise JSONError("unexpected end of input, expected a value", i)
        c = b[i]
        if c == 0x7B:  # {
            i = _skip_ws(b, i + 1, n)
            if i < n and b[i] == 0x7D:
                value = {}
                i += 1
            else:
                top = [{}, None]
                stack.append(top)
                i = _key(b, i, n, top, max_depth, len(stack))
                continue
        elif c == 0x5B:  # [
            i = _skip_ws(b, i + 1, n)
            if i < n and b[i] == 0x5D:
                value = []
                i += 1
            else:
                stack.append([[], None])
                continue
        elif c == _QUOTE:
            value, i = _string(b, i, n)
        elif c == _MINUS or _is_digit(c):
            value, i = _number(b, i, n)
        else:
            value = _literal(b, i, n)
            i += 4 if value is not False else 5
        # -- a complete value: hand it to the open containers, closing those that end
        while True:
            if not stack:
                i = _skip_ws(b, i, n)
                if i < n:
                    raise JSONError("%s after the value" % _show_byte(b[i]), i)
                return value
            top = stack[-1]
            cont = top[0]
            is_obj = top[1] is not None
            if is_obj:
                cont[top[1]] = value
            else:
                cont.append(value)
            i = _skip_ws(b, i, n)
            if i >= n:
                raise JSONError("unexpected end of input, expected ',' or a closing bracket", i)
            c = b[i]
            if c == 0x2C:  # ,
                i = _skip_ws(b, i + 1, n)
                if is_obj:
                    i = _key(b, i, n, top, max_depth, len(stack))
                elif i < n and b[i] == 0x5D:
                    raise JSONError("trailing comma before ']'", i)
                break
            if c == (0x7D if is_obj else 0x5D):  # } or ]
                i += 1
                stack.pop()
                value = cont
                continue
            raise JSONError(
                "%s where ',' or '%s' belongs" % (_show_byte(c), "}" if is_obj else "]"), i
            )


def _key(b, i, n, top, max_depth, level):
    """Parse ``"key" :`` at ``b[i]`` for the object ``top``; return the value's offset."""
    if level > max_depth:
        raise JSONError("nesting deeper than %d" % max_depth, i)
    if i >= n:
        raise JSONError("unexpected end of input, expected a key", i)
    if b[i] != _QUOTE:
        if b[i] == 0x7D:
            raise JSONError("trailing comma before '}'", i)
        raise JSONError("%s where a key (a string) belongs" % _show_byte(b[i]), i)
    at = i
    key, i = _string(b, i, n)
    if key in top[0]:
        raise JSONError("duplicate key %s" % _quote(key), at)
    top[1] = key
    i = _skip_ws(b, i, n)
    if i >= n or b[i] != 0x3A:  # :
        raise JSONError("expected ':' after the key", i)
    return _skip_ws(b, i + 1, n)


def _literal(b, i, n):
    for text, value in _LITERALS:
        m = len(text)
        if b[i : i + m] == text:
            j = i + m
            if j < n and _is_letter(b[j]):
                break  # "nullx", "trueish": a longer word
            return value
    if _is_letter(b[i]):
        raise JSONError("not a JSON value: %s" % _word(b, i, n), i)
    raise JSONError("%s where a value belongs" % _show_byte(b[i]), i)


def _quote(key):
    """A key for a message: ASCII, bounded."""
    out = []
    for ch in key[:32]:
        o = ord(ch)
        out.append(ch if 0x20 <= o < 0x7F and ch != '"' and ch != "\\" else "\\u%04x" % o)
    return '"' + "".join(out) + ('..."' if len(key) > 32 else '"')
