"""Consistent Overhead Byte Stuffing (Cheshire & Baker, 1999).

The encoded form contains no 0x00 byte, so 0x00 delimits frames on the wire.
Overhead is at most one byte per 254 bytes plus one.

Both directions work buffer-to-buffer with explicit offsets so the firmware can
encode into a preallocated buffer without allocating.

>>> bytes(encode(b"\\x11\\x00\\x22"))
b'\\x02\\x11\\x02"'
"""

from protocol import errors as E  # the classes by attribute, made on first use


def max_encoded_len(n):
    """Worst-case COBS length for ``n`` raw bytes (without the delimiter)."""
    return n + n // 254 + 1


def encode_into(src, src_len, dst, dst_off=0, src_off=0):
    """COBS-encode ``src[src_off:src_off+src_len]`` into ``dst`` at ``dst_off``; return
    the end offset.

    Canonical COBS: a block of 254 non-zero bytes that ends the input gets no extra
    code byte. Raises OversizeError if ``dst`` is too small. Does not allocate.

    ``src`` may be ``dst`` itself, the input starting at least the overhead
    (``max_encoded_len(src_len) - src_len``) after ``dst_off``: every byte is read
    before its position is written (the telemetry encoder's frame is stuffed in place).
    """
    if dst_off + max_encoded_len(src_len) > len(dst):
        raise E.OversizeError("COBS output buffer too small")
    code_pos = dst_off
    out = dst_off + 1
    code = 1
    i = src_off
    end = src_off + src_len
    while i < end:
        b = src[i]
        i += 1
        if b:
            dst[out] = b
            out += 1
            code += 1
        if not b or code == 0xFF:
            dst[code_pos] = code
            code = 1
            code_pos = out
            if not b or i < end:
                out += 1
    dst[code_pos] = code
    return out


def encode(data):
    """COBS-encode ``data`` (no delimiter appended); returns a new bytearray."""
    n = len(data)
    dst = bytearray(max_encoded_len(n))
    end = encode_into(data, n, dst, 0)
    return dst[:end]


def decode_into(src, src_len, dst, dst_len=-1):
    """Decode ``src[:src_len]`` (one frame, without its delimiter) into ``dst``.

    Returns the decoded length. Raises FrameError on a 0x00 inside the frame or a
    code byte that runs past the end, OversizeError if the frame decodes to more than
    ``dst_len`` bytes (``-1``: ``len(dst)``). ``dst`` may be ``src`` itself: every
    byte is written at or before the position it was read from, so a frame can be
    decoded in place.
    """
    i = 0
    out = 0
    if dst_len < 0 or dst_len > len(dst):
        dst_len = len(dst)
    while i < src_len:
        code = src[i]
        if code == 0:
            raise E.FrameError("0x00 inside a COBS frame")
        i += 1
        end = i + code - 1
        if end > src_len:
            raise E.FrameError("COBS code byte runs past the end of the frame")
        if out + (end - i) > dst_len:
            raise E.OversizeError("decoded frame larger than the buffer")
        while i < end:
            b = src[i]
            if b == 0:
                raise E.FrameError("0x00 inside a COBS frame")
            dst[out] = b
            out += 1
            i += 1
        if code != 0xFF and i < src_len:
            if out >= dst_len:
                raise E.OversizeError("decoded frame larger than the buffer")
            dst[out] = 0
            out += 1
    return out


def decode(data):
    """Decode one COBS frame (without delimiter); returns a new bytearray."""
    dst = bytearray(len(data))
    n = decode_into(data, len(data), dst)
    return dst[:n]
