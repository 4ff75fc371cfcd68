"""Issue 23 item 6, the module's side: a refusal for a stale timestamp says so.

SPEC 14.1: a ``replay`` outcome (right signature, timestamp not newer than the link's
last) is answered ``nack unauthorized`` with ``field`` ``ts``, so a host can tell
"your clock went back, jump ahead" from "wrong key, re-pair" without reading text; a
bad signature or a missing one names no field.
"""

from safety_harness import Harness

from protocol import catalog as C

DUAL = True


def _unauthorized(h):
    out = []
    for _ in range(3):
        h.advance(100)
        for m in h.hal.take():
            if m.ok and m.name == "nack" and m.fields["code"] == C.ERR_UNAUTHORIZED:
                out.append(m.fields)
    return out


def test_a_replay_names_the_timestamp_and_a_forgery_does_not():
    h = Harness()
    h.advance(1000)
    assert h.command("config_set", {"values": {"pid.kp": 6000}}) == "ack"
    h.hal.take()
    h.send_replay(-1)
    got = _unauthorized(h)
    assert len(got) == 1 and got[0].get("field") == "ts", got
    assert got[0]["text"].startswith("replayed"), got
    for how in ("forged", "unsigned"):
        assert h.command("fan_mode", {"mode": 1, "duty1": 19661}, how) == "nack"
    h.send_forged("fan_mode", {"mode": 1, "duty1": 19661})
    got = _unauthorized(h)
    assert got and all("field" not in f for f in got), got
