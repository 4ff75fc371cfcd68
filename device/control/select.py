"""Pick the channel the loop regulates: the worst one relative to its own setpoint.

GPU core, VRAM and power MOSFET have different limits, so the controlled quantity is
max(temp[i] - setpoint[i]) over the channels that are both valid (sensor healthy)
and controlled (ambient usually is not). The caller passes one int bitmask, e.g.
``valid_mask & controlled_mask``: bit i set = channel i takes part.

    out = array("i", [0, 0])            # allocated once
    i = worst_channel(temps_mc, setpoints_mc, valid & CONTROLLED, out)
    if i >= 0:
        duty = pid.step(temps_mc[i], setpoints_mc[i], dt_ms)   # error = out[1]

No allocation; temperatures and setpoints must be within +-2**29 (sensor values are
within +-2**20), so every difference stays within +-2**30.
"""


def worst_channel(temps_mc, setpoints_mc, mask, out):
    """Return the index of the worst channel (-1 when none is selected by ``mask``).

    Writes ``out[0] = index`` and ``out[1] = temp - setpoint`` (m degC; 0 when the
    index is -1). Ties go to the lowest index. ``len(temps_mc)`` channels are
    examined; ``setpoints_mc`` must be at least as long.
    """
    best = -1
    worst = 0
    n = len(temps_mc)
    i = 0
    while i < n:
        if (mask >> i) & 1:
            err = temps_mc[i] - setpoints_mc[i]
            if best < 0 or err > worst:
                best = i
                worst = err
        i += 1
    out[0] = best
    out[1] = worst
    return best


def mask_of(flags):
    """Bitmask from a sequence of truthy flags (bit i = flags[i]); for boot/config time."""
    mask = 0
    for i in range(len(flags)):
        if flags[i]:
            mask |= 1 << i
    return mask
