"""Exception hierarchy of the protocol layer.

``ProtocolError`` is the root; the stream decoder never lets any of them escape,
it counts them by :attr:`ProtocolError.kind` instead::

    ProtocolError (ValueError)     kind "protocol"
        FrameError                 "framing"       framing is broken: bad COBS, too short, too long
            OversizeError          "oversize"      a frame exceeds MAX_FRAME (or its buffer)
            CRCError               "crc"           the CRC-16 of a frame does not match
        VersionError               "version"       another protocol major version (.major, .minor)
        CBORDecodeError            "undecodable"   not valid CBOR, or outside the subset
        CBOREncodeError            "unencodable"   a value the CBOR subset cannot represent
        UnknownTypeError           "unknown_type"  a message type not in this version's catalog
        FieldError                 "invalid"       a field's type or range (.code, .field)

Only the root is made at import. The others are made the first time they are named
(``errors.FrameError``, ``from protocol.errors import FrameError``) by the module's
``__getattr__`` and kept, so each is one class for the life of the process, as if it
were defined here. On the module, a class costs about 130 B of heap (its type, dict
and bases), which a board keeps from boot for errors it may never see (issue 24's boot
budget); the root is made up front because the decoder's ``except ProtocolError``
names it while an exception, perhaps a MemoryError, is being handled.
"""


class ProtocolError(ValueError):
    """Anything wrong with bytes received or with a message to be sent."""

    kind = "protocol"


def _make(name):
    """The class ``name`` (not the root), made now: its body runs only here."""
    if name == "FrameError":

        class FrameError(ProtocolError):
            """Framing is broken: bad COBS, too short, too long."""

            kind = "framing"

        return FrameError
    if name == "OversizeError":

        class OversizeError(_get("FrameError")):
            """A frame exceeds MAX_FRAME (or a buffer it is written into)."""

            kind = "oversize"

        return OversizeError
    if name == "CRCError":

        class CRCError(_get("FrameError")):
            """The CRC-16 of a frame does not match."""

            kind = "crc"

        return CRCError
    if name == "VersionError":

        class VersionError(ProtocolError):
            """The peer speaks another protocol major version: refused, never guessed at."""

            kind = "version"

            def __init__(self, msg, major=None, minor=None):
                super().__init__(msg)
                self.major = major
                self.minor = minor

        return VersionError
    if name == "CBORDecodeError":

        class CBORDecodeError(ProtocolError):
            """The payload is not valid CBOR, or uses a feature outside the subset."""

            kind = "undecodable"

        return CBORDecodeError
    if name == "CBOREncodeError":

        class CBOREncodeError(ProtocolError):
            """A value cannot be represented in the CBOR subset."""

            kind = "unencodable"

        return CBOREncodeError
    if name == "UnknownTypeError":

        class UnknownTypeError(ProtocolError):
            """The message type is not in the catalog of this protocol version."""

            kind = "unknown_type"

        return UnknownTypeError
    if name == "FieldError":

        class FieldError(ProtocolError):
            """A known field has the wrong type, is out of range, or a required one is
            missing.

            ``code`` is the NACK error code (see catalog.ERR_*) and ``field`` the field
            name.
            """

            kind = "invalid"

            def __init__(self, msg, code, field=None):
                super().__init__(msg)
                self.code = code
                self.field = field

        return FieldError
    return None


def _get(name):
    """The class ``name``: the one made before, else made now and kept."""
    g = globals()
    cls = g.get(name)
    if cls is None:
        cls = _make(name)
        if cls is None:
            raise AttributeError(name)
        import sys

        if sys.implementation.name != "micropython":
            cls.__qualname__ = name  # not "_make.<locals>.FrameError" in reprs
        g[name] = cls
    return cls


def __getattr__(name):
    """``FrameError`` and the other subclasses, made on first use (module docstring)."""
    return _get(name)
