"""Issue 23 item 13: a misspelt fan model is refused, never taken for the generic one.

On 4092283 ``floors.fan_model()`` mapped any unknown name to ``pwm4``: a board that
meant ``pwm4_server`` and wrote ``pwm4_sever`` got the 400 RPM tach floor instead of
2,000 RPM, silently. Now None is the factory default (``FAN_MODEL_DEFAULT``, named
explicitly) and any other name must be in ``FAN_MODELS``; every board's ``FAN_MODEL``
is in the table. DUAL: runs on CPython and under MicroPython.
"""

from fakehal import FakeHal
from mpcompat import raises

from boards import BOARDS, load
from device import floors as F
from device.app import App
from device.drivers.fan import Fan

DUAL = True

MISSPELT = ("pwm4_sever", "PWM4", "pwm 4", "", "pwm4 ", "server")


def test_every_board_names_a_known_model():
    for name in BOARDS:
        model = load(name).FAN_MODEL
        assert model in F.FAN_MODELS, (name, model)
        assert F.fan_model(model) is F.FAN_MODELS[model]


def test_the_factory_default_is_explicit():
    assert F.FAN_MODEL_DEFAULT == "pwm4"
    assert F.fan_model(None) is F.FAN_MODELS["pwm4"]
    assert F.rpm_floor(F.fan_model("pwm4_server")) == 2000  # what a misspelling lost
    assert F.rpm_floor(F.fan_model(None)) == 400


def test_unknown_names_are_refused_with_the_known_ones_listed():
    for bad in MISSPELT:
        with raises(ValueError, match="unknown fan model") as e:
            F.fan_model(bad)
        for known in F.FAN_MODELS:
            assert known in str(e.value), (bad, str(e.value))


def test_the_fan_driver_refuses_them_too():
    with raises(ValueError, match="pwm4, pwm4_server, sim"):
        Fan.from_config(None, None, 0, {}, model="pwm4_sever")


def test_a_board_with_a_misspelt_model_does_not_run_on_the_generic_floor():
    """The app refuses to configure (the HAL left the fans at full duty) instead of
    running with the generic model's 400 RPM tach floor."""
    hal = FakeHal()
    hal.fan_model = "pwm4_sever"
    with raises(ValueError, match="known: pwm4, pwm4_server, sim"):
        App(hal)
    hal = FakeHal()
    hal.fan_model = "pwm4_server"
    app = App(hal)
    assert app.safety.model is F.FAN_MODELS["pwm4_server"]
