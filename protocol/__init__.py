"""Wire protocol shared by the module firmware (MicroPython) and modbridge (CPython).

Everything in this package runs unchanged on both interpreters:

- :mod:`protocol.crc`     CRC-16/IBM-3740 over every frame
- :mod:`protocol.cobs`    COBS byte stuffing, 0x00 is the frame delimiter
- :mod:`protocol.cbor`    the project's own CBOR subset codec
- :mod:`protocol.catalog` message types, field keys, units, codes
- :mod:`protocol.frame`   frame encode/decode and the resynchronising stream decoder
- :mod:`protocol.jsonl`   the same messages as JSON lines for a human on a terminal
- :mod:`protocol.jsonparse` the strict JSON parser (bounded depth, no duplicate keys)
- :mod:`protocol.sha256`  SHA-256 that allocates nothing on MicroPython
- :mod:`protocol.sign`    HMAC-SHA256/48 signing of commands (MAVLink 2 model)
- :mod:`protocol.telemetry` the allocation-free telemetry encoder used in the control tick

See protocol/SPEC.md for the normative description.
"""

VERSION_MAJOR = 1
VERSION_MINOR = 0


def _lazy(table, name):
    """The value of ``name`` in ``table`` (pairs: name, value), for a module's
    ``__getattr__`` over its const()-private names (protocol.frame, protocol.telemetry:
    on the MCU they take no slots in the module's dict); AttributeError if absent.
    Allocates nothing."""
    if name in table:
        i = table.index(name)
        if not i & 1:
            return table[i + 1]
    raise AttributeError(name)


if __import__("sys").implementation.name != "micropython":

    def _plain(g, table):
        """CPython: the names of ``table`` as plain attributes of the module whose
        globals are ``g`` (``dir()`` lists them)."""
        for i in range(0, len(table), 2):
            g[table[i]] = table[i + 1]
