"""device.control.select: worst channel relative to its own setpoint."""

from array import array

from mpcompat import IS_MICROPYTHON, heap_lock, heap_unlock

from device.control.select import mask_of, worst_channel

DUAL = True

# gpu, vram, mos, ambient
SETPOINTS = array("i", [70000, 85000, 95000, 0])
CONTROLLED = 0b0111  # ambient is never controlled


def test_picks_the_largest_excess_over_own_setpoint():
    out = array("i", [9, 9])
    temps = array("i", [72000, 90000, 80000, 30000])  # +2, +5, -15 degC
    assert worst_channel(temps, SETPOINTS, CONTROLLED, out) == 1
    assert list(out) == [1, 5000]
    # the hottest absolute reading (vram 90) is not what matters; ambient is out
    temps = array("i", [80000, 88000, 96000, 45000])  # +10, +3, +1
    assert worst_channel(temps, SETPOINTS, CONTROLLED, out) == 0
    assert out[1] == 10000


def test_all_below_setpoint_gives_the_least_negative():
    out = array("i", [0, 0])
    temps = array("i", [40000, 60000, 90000, 25000])  # -30, -25, -5
    assert worst_channel(temps, SETPOINTS, CONTROLLED, out) == 2
    assert out[1] == -5000


def test_ties_go_to_the_lowest_index():
    out = array("i", [0, 0])
    temps = array("i", [71000, 86000, 96000, 0])  # +1 each
    assert worst_channel(temps, SETPOINTS, CONTROLLED, out) == 0
    assert worst_channel(temps, SETPOINTS, 0b0110, out) == 1
    assert out[1] == 1000


def test_masks():
    out = array("i", [0, 0])
    temps = array("i", [99000, 86000, 97000, 50000])  # +29 (failed), +1, +2
    valid = 0b1110  # gpu sensor failed: its reading must be ignored
    assert worst_channel(temps, SETPOINTS, valid & CONTROLLED, out) == 2
    assert worst_channel(temps, SETPOINTS, 0b1000, out) == 3  # only if asked
    assert out[1] == 50000
    assert worst_channel(temps, SETPOINTS, 0b10000, out) == -1  # beyond the channels
    assert mask_of([True, 0, 1, False]) == 0b0101
    assert mask_of(()) == 0


def test_nothing_valid_gives_minus_one():
    out = array("i", [5, 5])
    temps = array("i", [99000, 99000, 99000, 99000])
    assert worst_channel(temps, SETPOINTS, 0, out) == -1
    assert list(out) == [-1, 0]
    assert worst_channel(array("i"), array("i"), 0b1111, out) == -1


def test_plain_lists_work_too():
    out = [0, 0]
    assert worst_channel([1, 5, 3], [0, 0, 0], 0b111, out) == 1
    assert out == [1, 5]


def test_does_not_allocate():
    out = array("i", [0, 0])
    temps = array("i", [72000, 90000, 80000, 30000])
    got = array("i", [0] * 64)
    heap_lock()
    try:
        for i in range(64):
            temps[i & 3] = 60000 + i * 500
            got[i] = worst_channel(temps, SETPOINTS, i & 15, out)
    finally:
        heap_unlock()
    assert got[0] == -1
    assert got[15] >= 0


def test_intermediates_stay_small_ints():
    if IS_MICROPYTHON:
        return  # needs CPython's ast
    from intcheck import load_checked

    mod, chk = load_checked("device/control/select.py")
    out = [0, 0]
    lo, hi = -(2**29), 2**29 - 1
    with chk:
        mod.worst_channel([hi, lo, hi, lo], [lo, hi, lo, hi], 0b1111, out)
    assert out == [0, hi - lo]
    assert chk.peak < 2**30
