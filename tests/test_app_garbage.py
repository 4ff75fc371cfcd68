"""Garbage for every command and every config field: a NACK with the right code, and
nothing changes (config, state, duty). DUAL: also under MicroPython.
"""

from fakehal import FakeHal, run, signer_for
from protocol_samples import bad_type_value, raw_frame, valid_field_sets

from device import config
from device.app import App
from protocol import catalog as C
from protocol import cbor

DUAL = True
MPY_TIMEOUT = 600


def _booted():
    hal = FakeHal()
    app = App(hal)
    app.boot()
    signer_for(hal, app)
    run(app, hal, 1000)
    hal.take()
    return hal, app


def _exchange(hal, app, data):
    hal.send(data)
    app.step()
    hal.advance(100)  # NACKs are rate-limited to ten a second after a burst
    return hal.take()


def _snapshot(app):
    return (config.flatten(app.cfg), app.sup.state, app.mode, list(app.manual_duty))


def _payload(mdef, fields):
    keyed = {}
    for fdef in mdef[C.M_FIELDS]:
        if fdef[C.F_NAME] in fields:
            keyed[fdef[C.F_KEY]] = fields[fdef[C.F_NAME]]
    return cbor.dumps(keyed) if keyed else b""


def _only(items, name):
    got = [it for it in items if it.ok and it.name == name]
    assert len(got) == 1, items
    return got[0]


def test_every_field_of_every_command_with_a_wrong_type():
    hal, app = _booted()
    before = _snapshot(app)
    seq = 1000
    checked = 0
    for mdef in C.MESSAGES:
        if mdef[C.M_DIR] != C.H2D:
            continue
        base = valid_field_sets(mdef)[0]  # required fields only
        for fdef in mdef[C.M_FIELDS]:
            fields = dict(base)
            fields[fdef[C.F_NAME]] = bad_type_value(fdef[C.F_KIND])
            seq += 1
            items = _exchange(
                hal, app, raw_frame(mdef[C.M_TYPE], _payload(mdef, fields), seq, signer=hal.signer)
            )
            nack = _only(items, "nack")
            assert nack.fields["ref"] == seq and nack.fields["ref_type"] == mdef[C.M_TYPE]
            assert nack.fields["code"] == C.ERR_BAD_TYPE, (mdef[C.M_NAME], fdef, nack)
            assert nack.fields["field"] == fdef[C.F_NAME]
            assert _snapshot(app) == before, (mdef[C.M_NAME], fdef[C.F_NAME])
            checked += 1
    assert checked >= 25, checked


def test_every_integer_field_just_out_of_range():
    hal, app = _booted()
    before = _snapshot(app)
    seq = 2000
    for mdef in C.MESSAGES:
        if mdef[C.M_DIR] != C.H2D:
            continue
        base = valid_field_sets(mdef)[0]
        for fdef in mdef[C.M_FIELDS]:
            if fdef[C.F_KIND] not in (C.K_UINT, C.K_INT, C.K_ENUM):
                continue
            for bad in (fdef[C.F_LO] - 1, fdef[C.F_HI] + 1):
                fields = dict(base)
                fields[fdef[C.F_NAME]] = bad
                seq += 1
                data = raw_frame(mdef[C.M_TYPE], _payload(mdef, fields), seq, signer=hal.signer)
                nack = _only(_exchange(hal, app, data), "nack")
                assert nack.fields["code"] == C.ERR_OUT_OF_RANGE, (mdef[C.M_NAME], fdef, bad)
                assert _snapshot(app) == before


def test_missing_required_fields():
    hal, app = _booted()
    before = _snapshot(app)
    seq = 3000
    for mdef in C.MESSAGES:
        if mdef[C.M_DIR] != C.H2D:
            continue
        required = [f for f in mdef[C.M_FIELDS] if f[C.F_REQUIRED]]
        for fdef in required:
            fields = dict(valid_field_sets(mdef)[0])
            del fields[fdef[C.F_NAME]]
            seq += 1
            nack = _only(
                _exchange(hal, app, raw_frame(mdef[C.M_TYPE], _payload(mdef, fields), seq)), "nack"
            )
            assert nack.fields["code"] == C.ERR_MISSING_FIELD, nack
            assert _snapshot(app) == before


def test_every_config_field_with_garbage_matches_the_validator():
    hal, app = _booted()
    flat = config.flatten(app.cfg)
    garbage = ("x", None, -(10**9), 10**7, [], 1.5, True)
    seq = 4000
    nacked = 0
    for key in sorted(flat):
        if key == "version":
            continue
        for bad in garbage:
            before = _snapshot(app)
            try:
                config.merge(app.cfg, {key: bad})
                expect_nack = False
            except config.ConfigError:
                expect_nack = True
            seq += 1
            fields = {0: {key: bad}}
            items = _exchange(
                hal, app, raw_frame(C.T_CONFIG_SET, cbor.dumps(fields), seq, signer=hal.signer)
            )
            reply = [it for it in items if it.ok and it.name in ("ack", "nack")]
            assert len(reply) == 1, (key, bad, items)
            if expect_nack:
                assert reply[0].name == "nack", (key, bad)
                assert reply[0].fields["code"] == C.ERR_OUT_OF_RANGE
                assert reply[0].fields["field"] == key, (key, reply[0].fields)
                assert _snapshot(app) == before, key
                nacked += 1
            else:  # accepted: put the default back
                assert reply[0].name == "ack", (key, bad, reply[0])
                app.apply_changes({key: flat[key]})
    assert nacked > 3 * len(flat), nacked
    assert config.flatten(app.cfg) == flat


def test_command_garbage_does_not_disturb_cooling():
    """A flood of garbage commands while regulating: duty and state stay sane."""
    hal, app = _booted()
    hal.set_temp(0, 75.0)
    run(app, hal, 3000)
    state = app.sup.state
    seq = 5000
    for i in range(200):
        seq += 1
        hal.send(raw_frame(C.T_FAN_MODE, cbor.dumps({0: i % 7, 1: -i}), seq))
        hal.send(b"\xff" * (i % 13) + b"\x00")
        app.step()
        hal.advance(10)
    run(app, hal, 500)
    assert app.sup.state == state
    assert app.fans[0].duty > app.cfg["fans"][0]["min_duty"]
    assert app.failures == 0
