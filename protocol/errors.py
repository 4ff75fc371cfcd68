"""Exception hierarchy of the protocol layer.

``ProtocolError`` is the root; the stream decoder never lets any of them escape,
it counts them by :attr:`ProtocolError.kind` instead.
"""


class ProtocolError(ValueError):
    """Anything wrong with bytes received or with a message to be sent."""

    kind = "protocol"


class FrameError(ProtocolError):
    """Framing is broken: bad COBS, too short, too long."""

    kind = "framing"


class OversizeError(FrameError):
    """A frame exceeds MAX_FRAME (or a buffer it is written into)."""

    kind = "oversize"


class CRCError(FrameError):
    """The CRC-16 of a frame does not match."""

    kind = "crc"


class VersionError(ProtocolError):
    """The peer speaks another protocol major version: refused, never guessed at."""

    kind = "version"

    def __init__(self, msg, major=None, minor=None):
        super().__init__(msg)
        self.major = major
        self.minor = minor


class CBORDecodeError(ProtocolError):
    """The payload is not valid CBOR, or uses a feature outside the subset."""

    kind = "undecodable"


class CBOREncodeError(ProtocolError):
    """A value cannot be represented in the CBOR subset."""

    kind = "unencodable"


class UnknownTypeError(ProtocolError):
    """The message type is not in the catalog of this protocol version."""

    kind = "unknown_type"


class FieldError(ProtocolError):
    """A known field has the wrong type, is out of range, or a required one is missing.

    ``code`` is the NACK error code (see catalog.ERR_*) and ``field`` the field name.
    """

    kind = "invalid"

    def __init__(self, msg, code, field=None):
        super().__init__(msg)
        self.code = code
        self.field = field
