"""CPython-only proof helper: every integer a function computes stays within +-2**30.

A 32-bit MicroPython MCU keeps ints in [-2**30, 2**30 - 1] without allocating; past
that it builds a heap big int. The unix port has 63-bit small ints, so heap_lock()
there cannot catch such an overflow. This module loads a copy of a firmware module
whose every arithmetic expression (binary/unary operators, augmented assignments) is
wrapped in a check, so a test can drive the worst cases and see the largest
magnitude reached:

    mod, chk = load_checked("device/control/pid.py")
    pid = mod.PID(kp=1000000)
    with chk:                       # only checked inside the block (set-time code
        pid.step(100000, 0, 1000)   # may use big ints legitimately)
    assert chk.peak < 2**30

Outside the ``with`` block the checks are inert.
"""

import ast
import types
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL_MIN = -(2**30)
SMALL_MAX = 2**30 - 1


class Checker:
    def __init__(self):
        self.active = False
        self.peak = 0
        self.where = None
        self.count = 0

    def __enter__(self):
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False
        return False

    def __call__(self, value, line):
        if self.active and type(value) is int:
            self.count += 1
            mag = -value if value < 0 else value
            if mag > self.peak:
                self.peak = mag
                self.where = line
            if value < SMALL_MIN or value > SMALL_MAX:
                raise AssertionError(f"int {value} outside +-2**30 at line {line}")
        return value


class _Wrap(ast.NodeTransformer):
    def _call(self, node):
        return ast.copy_location(
            ast.Call(
                func=ast.Name("__intcheck__", ast.Load()),
                args=[node, ast.Constant(node.lineno)],
                keywords=[],
            ),
            node,
        )

    def visit_BinOp(self, node):
        self.generic_visit(node)
        return self._call(node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return self._call(node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        load = ast.parse(ast.unparse(node.target), mode="eval").body
        ast.copy_location(load, node)
        value = self._call(ast.copy_location(ast.BinOp(load, node.op, node.value), node))
        return ast.copy_location(ast.Assign(targets=[node.target], value=value), node)


def load_checked(relpath):
    """Return ``(module, checker)`` for a checked copy of the file at ``relpath``."""
    path = REPO_ROOT / relpath
    tree = _Wrap().visit(ast.parse(path.read_text(), filename=str(path)))
    ast.fix_missing_locations(tree)
    checker = Checker()
    module = types.ModuleType(path.stem + "_intchecked")
    module.__file__ = str(path)
    module.__intcheck__ = checker
    exec(compile(tree, str(path), "exec"), module.__dict__)
    return module, checker
