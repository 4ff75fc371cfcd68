"""No firmware module carries a constant tuple with an int that freezing turns into a
heap-style big int.

MicroPython's compiler folds a tuple whose items are all constants (literals, names
bound with ``const()`` in the same module, constant expressions such as ``2**29``)
into one constant object. ``tools/mpy-tool.py``, which freezes .mpy files into a
firmware image, writes every int inside such an object that is outside
``-0x2000..0x1FFF`` (the smallest small-int range of any target, 16-bit ports) as a
static *mpz* object, even on a 32-bit port whose small ints reach 2**30. Comparing
with one is free, but arithmetic on it builds a new mpz on the heap every time, and
the result stays an mpz: measured on the qemu Cortex-M3 image, ``x + 0`` with such an
``x`` allocates 32 bytes, and a tick that read its fan model's ``min_spin`` or a hot
floor from such a table allocated under ``heap_lock``. Bytecode literals (a plain
``13107`` in an expression, ``const()`` uses outside tuples) are small ints up to
2**30 and are fine; so are tuples built at run time (an item that is not constant).

The rule here: a constant tuple in a frozen module holds ints only within
``-0x2000..0x1FFF``, or at or above 2**30 in magnitude (big on every 32-bit target
anyway, used at configuration time only). Firmware that needs a table of larger values
builds it at import (``tuple([...])``, or a call such as ``floors._t(...)``: not
folded). A table that is only ever compared with (the config schema's bounds: no
arithmetic, never copied into a value) may stay a constant, in flash, when the line
that assigns it, or the comment line right above, says ``frozen-ints: compared only``;
so may a table whose every allocation-free user first makes its ints small (a scale
taken through ``protocol.catalog.scale_ints``), marked ``frozen-ints: made small
before arithmetic``.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

import pytest

from modbridge.tools import flash

ROOT = Path(__file__).resolve().parent.parent
SMALL_FROZEN = range(-0x2000, 0x2000)  # mpy-tool.py's mp_small_int_fits()
BIG = 2**30  # at or beyond: a big int on a 32-bit port in any form
MARK = "frozen-ints: compared only"
# A table whose ints are made small (``int(str(v))``, protocol.catalog.scale_ints) by
# every user whose arithmetic must not allocate: protocol.catalog.DUTY_PCT.
MARK_SMALL = "frozen-ints: made small before arithmetic"

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_, ast.BitXor: operator.xor,
}  # fmt: skip
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_NOT_CONST = object()


class _Folder:
    """MicroPython's compile-time view of one module: ``const()`` names and folding."""

    def __init__(self, tree: ast.Module):
        self.consts: dict[str, object] = {}
        for node in tree.body:  # module-level NAME = const(expr), in order
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "const"
                and len(node.value.args) == 1
            ):
                value = self.fold(node.value.args[0])
                if value is not _NOT_CONST:
                    self.consts[node.targets[0].id] = value

    def fold(self, node: ast.AST):
        """The constant ``node`` compiles to, or ``_NOT_CONST``."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.consts.get(node.id, _NOT_CONST)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            v = self.fold(node.operand)
            return _UNOPS[type(node.op)](v) if type(v) is int else _NOT_CONST
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = self.fold(node.left), self.fold(node.right)
            if type(a) is int and type(b) is int:
                try:
                    return _BINOPS[type(node.op)](a, b)
                except (ZeroDivisionError, ValueError, OverflowError):
                    return _NOT_CONST
            return _NOT_CONST
        if isinstance(node, ast.Tuple):
            items = [self.fold(e) for e in node.elts]
            return _NOT_CONST if any(i is _NOT_CONST for i in items) else tuple(items)
        return _NOT_CONST


def _ints(value):
    if type(value) is int:
        yield value
    elif type(value) is tuple:
        for v in value:
            yield from _ints(v)


def offending_tuples(source: str) -> list[tuple[int, list[int]]]:
    """(line, ints) of every constant tuple in ``source`` that would freeze an int as
    an mpz although a 32-bit port holds it as a small int.

    >>> offending_tuples("A = (1, 13107)\\nB = (1, 2)\\n_X = const(9000)\\nC = (_X, None)\\n")
    [(1, [13107]), (4, [9000])]
    >>> offending_tuples("def f(x):\\n    return (x, 13107)\\n")  # built at run time
    []
    >>> offending_tuples("# frozen-ints: compared only\\nLIM = (0, 90000)\\n")
    []
    """
    tree = ast.parse(source)
    folder = _Folder(tree)
    lines = source.splitlines()
    out = []
    inner: set[int] = set()  # tuples inside a reported or exempt one (not again)
    for stmt in tree.body:
        first = stmt.lineno - 1
        marked = lines[first : first + 1] + ([lines[first - 1]] if first else [])
        if any(MARK in line or MARK_SMALL in line for line in marked):
            for sub in ast.walk(stmt):
                inner.add(id(sub))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Tuple) or id(node) in inner:
            continue
        value = folder.fold(node)
        if value is _NOT_CONST:
            continue
        for sub in ast.walk(node):
            inner.add(id(sub))
        bad = [v for v in _ints(value) if v not in SMALL_FROZEN and -BIG < v < BIG]
        if bad:
            out.append((node.lineno, bad))
    return out


def frozen_sources() -> list[Path]:
    seen = set()
    for board in flash.board_names():
        for rel in flash.firmware_sources(board):
            seen.add(ROOT / rel)
    return sorted(seen)


def test_the_scan_sees_the_firmware():
    files = frozen_sources()
    assert any(p.name == "app.py" for p in files)
    assert len(files) > 20, files


@pytest.mark.parametrize("path", frozen_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_frozen_mpz_constants(path):
    bad = offending_tuples(path.read_text())
    assert not bad, (
        f"{path.relative_to(ROOT)}: constant tuples whose ints freeze as heap-style big "
        f"ints (arithmetic on them allocates on the MCU; see this test's docstring): "
        + "; ".join(f"line {line}: {vals[:4]}" for line, vals in bad)
    )


def test_the_rule_itself():
    import doctest
    import sys

    result = doctest.testmod(sys.modules[__name__], verbose=False)
    assert result.attempted == 3 and result.failed == 0, result
