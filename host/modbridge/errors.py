"""Errors of the host bridge. Each message says what to do, in one line."""


class ModbridgeError(Exception):
    """Base class; the CLI prints ``str(err)`` and exits non-zero."""

    exit_code = 1
