"""Synthetic telemetry source for ``modbridge wire-demo`` (runs under MicroPython).

Not firmware: a stand-in that exercises the real protocol encoder on the real
MicroPython interpreter until the virtual module (the real firmware against a
simulated world) exists. Integer-only first-order thermal response to a load
profile; frames go to stdout: binary telemetry every tick, a JSON line every
``json_every`` ticks, and a burst of line noise every ``noise_every`` ticks so the
host shows the decoder resynchronising.

argv: period_ms ticks json_every noise_every
"""

import sys
import time

import micropython

from protocol import catalog as C
from protocol import telemetry as T


def main():
    period_ms = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    ticks = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    json_every = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    noise_every = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    out = sys.stdout.buffer
    enc = T.TelemetryEncoder()
    noise = b'\x13\x37garbage\xff\xfe{"type":\n\x00'
    t_gpu = 34000  # milli-degC
    t_vram = 37000
    t_mos = 36000
    duty = 13107  # 20 %
    rpm = 900
    locked = 0
    seq = 0
    while seq < ticks:
        # load profile: idle, 650 W step, idle (in ticks)
        phase = (seq * 4) // ticks
        load_w = 650 if phase in (1, 2) else 60
        target = 34000 + load_w * 38  # die settles ~ 58.7 degC at 650 W
        t_gpu += (target - t_gpu) * 30 // 100
        t_vram += (target - 8000 - t_vram) * 3 // 100
        t_mos += (target + 4000 - t_mos) * 5 // 100
        err = t_gpu - 55000
        duty = 13107 + (err * 4 if err > 0 else 0)
        if duty > 65535:
            duty = 65535
        rpm += ((duty * 3000) // 65535 - rpm) // 4
        v_in = 12050 - load_w * 2 // 10 * 3  # droop under load
        i_in = load_w * 1000 * 4 // 100  # 4 % of the GPU power on the module's 12 V
        enc.set(T.UPTIME_S, seq * period_ms // 1000)
        enc.set(T.STATE, C.STATE_HOSTED)
        enc.set(T.REASON, C.REASON_HOST_OK)
        enc.set(T.FAULTS, 0)
        enc.set(T.TEMP_GPU, t_gpu)
        enc.set(T.TEMP_VRAM, t_vram)
        enc.set(T.TEMP_MOS, t_mos)
        enc.set(T.TEMP_AMB, 25000 + (seq % 7) * 10)
        enc.set(T.FAN1_RPM, rpm)
        enc.set(T.FAN2_RPM, rpm - rpm // 50)
        enc.set(T.FAN1_DUTY, duty)
        enc.set(T.FAN2_DUTY, duty)
        enc.set(T.V_IN, v_in)
        enc.set(T.I_IN, i_in)
        enc.set(T.P_IN, v_in * i_in // 1000)
        enc.set(T.TARGET, err)
        # encode + write with the heap locked: any allocation would raise MemoryError
        micropython.heap_lock()
        n = enc.encode_cbor(seq & 0xFFFF)
        out.write(enc.out, n)
        if json_every and seq % json_every == json_every - 1:
            n = enc.encode_json(seq & 0xFFFF)
            out.write(enc.out, n)
        micropython.heap_unlock()
        locked += 1
        if noise_every and seq % noise_every == noise_every - 1:
            out.write(noise)
        seq += 1
        time.sleep_ms(period_ms)
    text = "%d ticks encoded with the heap locked" % locked
    out.write(('{"type":"event","code":"none","severity":"info","text":"%s"}\n' % text).encode())


main()
