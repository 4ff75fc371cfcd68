"""CRC-16/IBM-3740 (a.k.a. CRC-16/CCITT-FALSE): poly 0x1021, init 0xFFFF,
no reflection, no final XOR. Check value for b"123456789" is 0x29B1.

Table driven; computing over a buffer never allocates (all values stay small ints),
so it can run inside the firmware's heap-locked tick.

>>> hex(crc16(b"123456789"))
'0x29b1'
"""

from array import array

POLY = 0x1021
INIT = 0xFFFF


def _make_table():
    table = array("H", [0] * 256)
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ POLY) if c & 0x8000 else (c << 1)
            c &= 0xFFFF
        table[i] = c
    return table


_TABLE = _make_table()


def crc16(buf, start=0, end=-1, crc=INIT):
    """CRC over ``buf[start:end]`` (``end=-1`` means len(buf)) without slicing."""
    if end < 0:
        end = len(buf)
    t = _TABLE
    i = start
    while i < end:
        crc = ((crc << 8) & 0xFF00) ^ t[((crc >> 8) ^ buf[i]) & 0xFF]
        i += 1
    return crc
