"""Running out of MicroPython's pystack is an exception like any other.

The images give MicroPython a fixed pystack for bytecode frames (firmware/stm32.py
PYSTACK_WORDS, 768 words on the boards and in the qemu image); a call chain deeper
than it raises RuntimeError("pystack exhausted") in the calling code. Here a command's
handler recurses through frames of 40 locals each until something gives: the
pystack in the [qemu-arm] column (there the nack must say so), the C stack's
recursion limit on the unix port (no pystack), RecursionError on CPython. Each is a
RuntimeError, which the dispatch's last-resort handler answers ``nack internal``;
the safety harness checks every tick meanwhile (fan floors, no failed tick), and the
next command is answered as usual: the pystack was given back as the exception
unwound. DUAL: CPython, the unix port and the [qemu-arm] column.
"""

from safety_harness import Harness

from protocol import catalog as C

DUAL = True

try:
    import micropython

    PYSTACK = hasattr(micropython, "pystack_use")  # MICROPY_ENABLE_PYSTACK builds
except ImportError:  # CPython
    PYSTACK = False


def _wide(n):
    """A frame of 40 locals (~45 words of pystack), calling itself without end."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = n
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = b8 = b9 = n
    c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = c9 = n
    d0 = d1 = d2 = d3 = d4 = d5 = d6 = d7 = d8 = d9 = n
    return (
        _wide(n + 1)
        + (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9)
        + (b0 + b1 + b2 + b3 + b4 + b5 + b6 + b7 + b8 + b9)
        + (c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9)
        + (d0 + d1 + d2 + d3 + d4 + d5 + d6 + d7 + d8 + d9)
    )


def test_a_call_chain_deeper_than_the_pystack_is_nack_internal_and_cooling_goes_on():
    h = Harness()
    h.advance(1000)
    handle = h.app.handle

    def deep(msg):
        if msg.name == "setpoints":  # a handler that recurses without end
            _wide(0)
        handle(msg)

    h.app.handle = deep
    h.allow_internal = True
    h.hal.take()
    ticks = h.app.ticks
    seq = h.send_signed("setpoints", {"sp_gpu": 70000})
    items = []
    for _ in range(3):  # 300 ms: the harness checks every tick's duties meanwhile
        h.advance(100)
        items.extend(h.hal.take())
    got = [
        m
        for m in items
        if m.ok
        and m.name == "nack"
        and m.fields["code"] == C.ERR_INTERNAL
        and m.fields["ref"] == seq
    ]
    assert len(got) == 1, items
    text = got[0].fields["text"]
    assert "RuntimeError" in text or "RecursionError" in text, text
    if PYSTACK:
        assert "pystack" in text, text
    assert h.app.internal_errors == 1 and h.app.failures == 0
    assert h.app.ticks - ticks >= 3
    if PYSTACK:
        assert micropython.pystack_use() < 4 * 384, micropython.pystack_use()
    h.app.handle = handle
    assert h.command("setpoints", {"sp_gpu": 70000}) == "ack"
    assert h.app.internal_errors == 1 and h.app.failures == 0
