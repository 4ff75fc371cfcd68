"""Optional parts of modbridge and the pip extras that bring them (pyproject.toml).

The base install runs the bridge on real hardware; two commands need more:

- ``[sim]``: the MicroPython unix port, for every ``--sim`` command and
  ``modbridge sim`` (the virtual module runs the real firmware in it);
- ``[report]``: matplotlib, for ``modbridge report``'s PNG.

A command that needs a missing extra stops with one line naming it.
"""

from __future__ import annotations

import importlib

from modbridge.errors import ModbridgeError


class ExtraMissing(ModbridgeError):
    """An optional dependency is not installed; the message names the extra."""


def install_hint(extra: str) -> str:
    """How to get ``extra``: pip for an installed modbridge, make in a checkout."""
    return f"pip install 'modbridge[{extra}]' (in a checkout: make setup)"


def missing(what: str, extra: str) -> str:
    """The one line a command says when ``extra`` is missing."""
    return f"{what} needs the optional [{extra}] extra: {install_hint(extra)}"


def require(module: str, what: str, extra: str) -> None:
    """Import ``module`` or raise :class:`ExtraMissing` naming ``extra``."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ExtraMissing(missing(what, extra)) from None
