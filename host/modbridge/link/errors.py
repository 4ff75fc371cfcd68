"""The link's errors: one-line messages that say what to do (STYLE 8: a narrow
hierarchy per layer, foreign exceptions wrapped at the boundary)."""

from __future__ import annotations

from modbridge.errors import ModbridgeError
from modbridge.sanitize import sanitize
from protocol import VERSION_MAJOR
from protocol import catalog as C
from protocol.message import Message


class LinkError(ModbridgeError):
    """The serial link to a module failed; the message says what to do."""


class PortNotFound(LinkError):
    """The port path does not exist (module unplugged, wrong path)."""


class PortPermissionDenied(LinkError):
    """The user may not open the port."""


class PortBusy(LinkError):
    """Another process holds the port."""


class NotASerialPort(LinkError):
    """The path exists but is no tty (a regular file, a directory, /dev/null): no
    module can be behind it, so waiting for a hello is pointless."""


class IncompatibleModule(LinkError):
    """The module speaks another protocol major version."""


class LinkDown(LinkError):
    """A request was made while the link is not up."""


class RequestTimeout(LinkError):
    """The module did not answer a request in time."""


class BadRequest(LinkError):
    """A request that does not fit the protocol catalog (never sent)."""


class NotPaired(LinkError):
    """The module verifies signatures and the key store has no usable key for it."""


class CommandRefused(LinkError):
    """The module answered a request with a NACK; nothing changed on the module."""

    def __init__(self, port: str, request: str, nack: Message):
        code = nack.fields.get("code", 0)
        self.code = code
        self.code_name = C.ERRORS[code] if 0 <= code < len(C.ERRORS) else str(code)
        self.field = nack.fields.get("field")
        self.text = nack.fields.get("text")
        self.nack = nack
        where = f" ({sanitize(self.field)})" if self.field else ""
        detail = f": {sanitize(self.text)}" if self.text else ""
        super().__init__(f"{port}: module refused {request}: {self.code_name}{where}{detail}")


class Unauthorized(CommandRefused):
    """The module refused a signed request's signature (wrong key, or a replay)."""

    def __init__(self, port: str, request: str, nack: Message, hint: str):
        super().__init__(port, request, nack)
        self.args = (f"{self.args[0]}: {hint}",)


def not_paired_text(port: str, uid: str, why: str | None = None) -> str:
    detail = f" ({why})" if why else ""
    return f"module {sanitize(uid)} is not paired{detail}: run `modbridge pair {port}`"


def key_missing_text(port: str, uid: str, keys_dir) -> str:
    """The module says it is paired, this host has no key file for it: the host's
    key store is elsewhere (another user's, the bridge's), not the module unpaired."""
    return (f"module {sanitize(uid)} is paired, but there is no key for it in "
            f"{sanitize(str(keys_dir))}: point MODBRIDGE_KEYS_DIR (or --keys-dir) at the "
            "key store of the host that paired it (the bridge's: [bridge] keys_dir, else "
            f"its state dir), or pair it again: `modbridge pair {port} --force` in its "
            "pairing window")  # fmt: skip


def version_error_text(major: int, minor: int | None = None) -> str:
    theirs = f"{major}.{minor}" if minor is not None else f"{major}.x"
    return (
        f"module speaks protocol {theirs}, modbridge speaks {VERSION_MAJOR}.x: "
        "upgrade modbridge or reflash the module"
    )
