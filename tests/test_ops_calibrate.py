"""``modbridge calibrate``: offline fits of datasheet-like 103JT points recover the
temperatures within the accuracy docs/calibration.md states, values and points parse
(codes, ohm suffixes) or are refused with the reason (exit 2), fits that would be
wrong are refused naming why (exit 1), fit-then-eval returns the reference
temperatures for any SH thermistor (hypothesis), the guided session against a fake
link (scripted input) and against a virtual module (the real firmware acks)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device import calib
from device import config as devcfg
from modbridge.cli.main import main
from modbridge.firmware_host import calib_fit
from modbridge.ops import calibrate as K
from protocol import catalog as C

# The "103JT" of these tests: Steinhart-Hart through the Semitec JT datasheet's
# R(0 degC) = 27.70 kohm and R25 = 10.0 kohm, and R(85 degC) from its B25/85 = 3435 K.
# Its local B rises with temperature (3319 K over 0..25, 3435 over 25..85), as real
# NTCs' do, so a beta model cannot follow it exactly.
R85 = calib.beta_resistance(85 + calib.KELVIN, 3435.0, 10000.0, 298.15)
TRUTH = calib_fit.fit_steinhart_hart([(27700.0, 0.0), (10000.0, 25.0), (R85, 85.0)])
DIV = K.Divider()


def r_true(t_c, sh=TRUTH):
    return calib.model_resistance(t_c, "sh", sh)


def code12(t_c, div=DIV, sh=TRUTH):
    """The read_u16() code of a 12-bit ADC reading the 103JT at ``t_c`` (quantised)."""
    raw = int(math.floor(div.code(r_true(t_c, sh)) / 65535 * 4095 + 0.5))
    return raw << 4 | raw >> 8


def pt(t_c, kind="code"):
    if kind == "code":
        c = code12(t_c)
        return (t_c, K.Value(str(c), "code", float(c)))
    r = float(f"{r_true(t_c):.4g}")  # a datasheet's 4 digits
    return (t_c, K.Value(f"{r}ohm", "ohm", r))


def worst_c(res, lo, hi):
    """Largest |fitted - true| over lo..hi degC in 0.1 degC steps."""
    return max(
        abs(res.curve.temp_c(r_true(i / 10)) - i / 10)
        for i in range(int(lo * 10), int(hi * 10) + 1)
    )


def cli(*args, input=None):
    return CliRunner().invoke(main, ["calibrate", *args], input=input)


# ------------------------------------------------------------------ accuracy (docs)

# (model, reference temperatures, value kind, degree) -> bounds of the worst error over
# 0..100 and 0..125 degC and of the predicted error (reference +-0.1 degC) over the
# same ranges: the table in docs/calibration.md "Per model and number of points".
# Measured: the comments.
ACCURACY = [
    ("steinhart-hart", (25, 50, 75), "code", 3, 0.02, 0.05, 0.46, 1.01),  # .016 .044 .45 1.00
    ("steinhart-hart", (0, 50, 100), "code", 3, 0.04, 0.05, 0.11, 0.23),  # .033 .047 .10 .22
    ("steinhart-hart", (0, 25, 50, 75, 100), "code", 3, 0.03, 0.04, 0.11, 0.23),  # .024 .034
    ("steinhart-hart", (25, 50, 75), "ohm", 3, 0.005, 0.006, 0.46, 1.01),  # .004 .005
    ("beta", (25, 85), "code", 3, 0.8, 1.35, 0.31, 0.45),  # .79 1.34 .30 .44
    ("beta", (25, 50), "code", 3, 1.5, 2.95, 0.49, 0.73),  # 1.50 2.95 .48 .72
    ("beta", (0, 25), "ohm", 3, 3.75, 6.2, 0.54, 0.73),  # 3.72 6.16 .53 .72
    ("beta", (0, 25, 50, 75, 100), "code", 3, 0.67, 1.9, 0.25, 0.36),  # .67 1.90 .24 .35
    ("poly", (0, 25, 50, 75, 100), "code", 3, 0.04, 0.14, 0.11, 0.53),  # .032 .132 .10 .52
    ("poly", (25, 50, 75, 100), "code", 3, 0.04, 0.17, 0.79, 0.88),  # .033 .165 .78 .87
    ("poly", (25, 75), "code", 1, 0.72, 1.71, 0.17, 0.23),  # .71 1.71 .16 .22
    ("poly", (50,), "code", 0, 1.1, 1.69, 0.11, 0.11),  # 1.10 1.68 .10 .10
]


@pytest.mark.parametrize("model,temps,kind,degree,bound100,bound125,pred100,pred125", ACCURACY)
def test_datasheet_points_recover_the_temperatures(
    model, temps, kind, degree, bound100, bound125, pred100, pred125
):
    base = K.Curve("beta", (3435.0, 10000.0, 298.15))  # poly: on the datasheet's beta
    res = K.fit([pt(t, kind) for t in temps], model, DIV, degree=degree, base=base)
    assert worst_c(res, 0, 100) <= bound100
    assert worst_c(res, 0, 125) <= bound125
    assert max(e.ref_c for e in res.errors if e.t_c <= 100) <= pred100
    assert res.max_error_c <= pred125
    # the module's table agrees with the model at every point (257-entry LUT)
    for p in res.points:
        assert abs(p.module_c - p.fitted_c) < 0.02, p
    # an exact fit (as many points as parameters) passes through its points
    if len(temps) == K.needed_points(model, degree):
        assert res.max_residual_c < 0.01  # beta: B and R0 written as integers


def test_the_factory_beta_is_11_degc_off_a_103jt_and_a_correction_cannot_fix_it():
    assert worst_c(K.fit([pt(25), pt(50)], "beta", DIV), 0, 100) < 1.6  # sanity
    factory = max(abs(K.FACTORY_CURVE.temp_c(r_true(t)) - t) for t in range(0, 101))
    assert 11.0 < factory < 12.0
    datasheet = K.Curve("beta", (3435.0, 10000.0, 298.15))
    assert 0.7 < max(abs(datasheet.temp_c(r_true(t / 10)) - t / 10) for t in range(1001)) < 0.8
    with pytest.raises(K.FitRefused) as e:
        K.fit([pt(t) for t in (0, 25, 50, 75, 100)], "poly", DIV)  # on the factory curve
    assert "calibration band" in e.value.reason and "steinhart-hart" in e.value.reason


def test_predicted_error_grows_outside_the_points():
    res = K.fit([pt(t) for t in (25, 50, 75)], "steinhart-hart", DIV)
    by_t = {e.t_c: e for e in res.errors}
    assert set(by_t) == {0.0, 25.0, 50.0, 75.0, 100.0, 125.0}
    assert abs(by_t[50.0].ref_c - 0.1) < 0.01 and not by_t[50.0].extrapolated
    assert by_t[125.0].extrapolated and by_t[125.0].ref_c > 5 * by_t[50.0].ref_c
    # one 12-bit step is 16 codes: ~0.025 degC at 25, ~0.12 at 100 (docs' table)
    assert 0.02 < by_t[25.0].lsb_c < 0.03 and 0.1 < by_t[100.0].lsb_c < 0.14
    spread = K.fit([pt(t) for t in (0, 50, 100)], "steinhart-hart", DIV)
    assert spread.max_error_c < res.max_error_c  # wider points, smaller extrapolation


def test_cal_write_and_config_snippet_are_what_the_module_takes():
    from protocol import jsonl

    sh = K.fit([pt(t) for t in (25, 50, 75)], "steinhart-hart", DIV, channel=2)
    msg = jsonl.decode_line(sh.cal_write_line())
    assert msg.name == "cal_write" and msg.fields["channel"] == 2
    assert msg.fields["model"] == C.CAL_MODELS.index("sh") and msg.fields["correction"] == []
    assert msg.fields["coeffs"] == pytest.approx(list(sh.curve.params), rel=1e-12)
    cfg = devcfg.merge(devcfg.defaults(), sh.config_snippet())
    assert cfg["channels"][2]["model"] == "sh" and cfg["channels"][2]["correction"] == []
    beta = K.fit([pt(25), pt(85)], "beta", DIV)
    assert beta.coeffs == [3436, 10005, 25000]  # integers, as the config holds them
    assert all(type(x) is int for x in beta.coeffs)
    poly = K.fit([pt(t) for t in (25, 50, 75, 100)], "poly", DIV,
                 base=K.Curve("beta", (3435.0, 10000.0, 298.15)))  # fmt: skip
    f = poly.cal_write_fields()
    assert f["model"] == C.CAL_MODELS.index("poly") and "correction" not in f
    assert len(f["coeffs"]) == 4 and list(poly.config_snippet()) == ["channels.0.correction"]


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize("text,ohm", [
    ("10000ohm", 10000.0), ("10kohm", 10000.0), ("10k ohm", 10000.0), ("4.1k ohm", 4100.0),
    ("4.1kohms", 4100.0), ("1.2Mohm", 1.2e6), ("470 ohm", 470.0), ("10kΩ", 10000.0),
    (" 2.2K Ohm ", 2200.0), (".5kohm", 500.0),
])  # fmt: skip
def test_resistances_with_an_ohm_suffix(text, ohm):
    v = K.parse_value(text)
    assert v.kind == "ohm" and v.number == pytest.approx(ohm)


def test_codes_and_their_range():
    assert K.parse_value("32776") == K.Value("32776", "code", 32776.0)
    assert K.parse_value("2048.5").number == 2048.5  # a mean
    assert K.parse_value("4095", full_scale=4095).number == 4095.0
    for bad, why in (("65536", "0..65535"), ("70000", "0..65535"), ("10k", "ohm suffix"),
                     ("abc", "neither"), ("-5", "neither"), ("0ohm", "> 0 ohm"),
                     ("", "neither"), ("1e3", "neither")):  # fmt: skip
        with pytest.raises(K.InputError) as e:
            K.parse_value(bad)
        assert why in str(e.value), (bad, str(e.value))
    with pytest.raises(K.InputError, match="0..4095"):
        K.parse_value("5000", full_scale=4095)


def test_points_parse_or_say_why():
    t, v = K.parse_point("25:10kohm")
    assert t == 25.0 and v.kind == "ohm" and v.number == 10000.0
    assert K.parse_point("-10.5:50508")[0] == -10.5
    for bad, why in (("abc", "expected T:VALUE"), ("25:", "missing"), (":100", "not a temperature"),
                     ("x:100", "not a temperature"), ("25:70000", "0..65535"),
                     ("nan:100", "finite")):  # fmt: skip
        with pytest.raises(K.InputError) as e:
            K.parse_point(bad)
        assert why in str(e.value), (bad, str(e.value))


def test_channels_and_prompt_temperatures():
    assert [K.parse_channel(c) for c in ("gpu", "VRAM", "2", "amb")] == [0, 1, 2, 3]
    with pytest.raises(K.InputError, match="gpu, vram, mos, amb"):
        K.parse_channel("cpu")
    assert K.parse_temperature(" 49.95 ") == 49.95
    for bad in ("hot", "300", "-60", "inf"):
        with pytest.raises(K.InputError):
            K.parse_temperature(bad)


# ------------------------------------------------------------------ input checks (exit 2)


@pytest.mark.parametrize("args,why", [
    (["--point", "abc"], "expected T:VALUE"),
    (["--point", "25:"], "missing"),
    (["--point", "25:70000"], "0..65535"),
    (["--point", "25:32776", "--point", "25:19204", "--point", "75:10562"], "duplicate points"),
    (["--point", "25:32776", "--point", "26:19204", "--point", "75:10562"], "duplicate points"),
    (["--point", "25:32776", "--point", "50:19204"], "needs at least 3 reference points, got 2"),
    (["--model", "beta", "--point", "25:32776"], "needs at least 2"),
    (["--model", "poly", "--point", "25:32776", "--point", "50:19204"], "degree-3 correction"),
    (["--point", "25:32776", "--point", "250:19204", "--point", "75:10562"], "outside -55..200"),
    (["--point", "25:65535", "--point", "50:19204", "--point", "75:10562"], "open circuit"),
    (["--point", "25:32776", "--point", "50:100", "--point", "75:10562"], "short circuit"),
    (["--point", "25:10562", "--point", "50:19204", "--point", "75:32776"], "falls as it warms"),
    (["--point", "25:32776", "--point", "50:19204", "--point", "75:10562", "--eval", "x"],
     "neither"),
    (["--point", "25:32776", "--channel", "cpu"], "channel 'cpu'"),
    (["--point", "25:32776", "--point", "50:19204", "--point", "75:10562", "--check-range",
      "a:b"], "--check-range"),
    ([], "no --point"),
])  # fmt: skip
def test_bad_input_exits_2_with_the_reason(args, why):
    res = cli("fit", *args)
    assert res.exit_code == 2, res.output
    assert res.output.startswith("modbridge calibrate: ") and why in res.output, res.output


def test_the_high_side_divider_flips_what_open_and_monotonic_mean():
    hi = K.Divider(10000.0, ntc_low=False)
    pts = [(t, K.Value("c", "code", hi.code(r_true(t)))) for t in (25, 50, 75)]
    res = K.fit(pts, "steinhart-hart", hi)
    assert res.max_residual_c < 1e-6
    assert hi.at_rail(65535) == "short" and hi.at_rail(0) == "open"
    res = cli("fit", "--ntc-high", "--point", "25:32768", "--point", "50:19204",
              "--point", "75:10562")  # fmt: skip
    assert res.exit_code == 2 and "falls as it warms" in res.output


# ------------------------------------------------------------------ refused fits (exit 1)


def test_refused_fits_name_the_reason_verbatim():
    # bunched points: calib_fit's noise gain
    res = cli("fit", "--point", "25:32776", "--point", "35:26000", "--point", "45:20000")
    assert res.exit_code == 1
    assert "fit refused: ill-conditioned: an error of 0.1 degC" in res.output
    try:
        calib_fit.fit_steinhart_hart([(DIV.ohms(c), t) for t, c in ((25, 32776), (35, 26000),
                                                                     (45, 20000))])  # fmt: skip
    except calib.CalibrationError as e:
        assert str(e) in res.output  # verbatim
    # resistances within 2 %: the probe did not follow the bath
    res = cli("fit", "--model", "beta", "--point", "25:10000ohm", "--point", "60:9900ohm")
    assert res.exit_code == 1 and "near-duplicate resistances" in res.output
    # not one NTC: a local beta far outside 1500..8000 K
    res = cli("fit", "--model", "beta", "--point", "25:10000ohm", "--point", "30:1000ohm")
    assert res.exit_code == 1 and "fit refused" in res.output
    # poly on the factory beta for a 103JT: the module's correction band
    args = [a for t in (0, 25, 50, 75, 100) for a in ("--point", f"{t}:{code12(t)}")]
    res = cli("fit", "--model", "poly", *args)
    assert res.exit_code == 1 and "calibration band of +-5 degC" in res.output


# ------------------------------------------------------------------ CLI output, --eval


def test_fit_prints_residuals_eval_cal_write_and_config():
    args = [a for t in (25, 50, 75) for a in ("--point", f"{t}:{code12(t)}")]
    res = cli("fit", *args, "--eval", "10kohm", "--eval", str(code12(60)), "--eval", "0")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "steinhart-hart fit through 3 points" in out and "residual" in out
    assert "predicted error over 0..125 degC" in out and "extrapolated" in out
    line = next(x.strip() for x in out.splitlines() if x.strip().startswith('{"type":"cal_write"'))
    assert json.loads(line)["model"] == "sh"
    assert "10kohm: 25.0" in out and f"{code12(60)}: 60.0" in out
    assert "0: no temperature" in out
    cfg = json.loads(next(x for x in out.splitlines()[out.splitlines().index("config:") + 1 :]))
    assert cfg["channels.0.model"] == "sh"


def test_fit_json_has_everything():
    args = [a for t in (25, 85) for a in ("--point", f"{t}:{code12(t)}")]
    res = cli("fit", "--model", "beta", "--channel", "vram", *args, "--eval", "4kohm", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["model"] == "beta" and d["channel"] == "vram"
    assert d["cal_write_fields"] == {"channel": 1, "model": 1, "coeffs": [3436, 10005, 25000],
                                     "correction": []}  # fmt: skip
    assert d["config"]["channels.1.beta"] == 3436 and len(d["points"]) == 2
    assert len(d["predicted_error"]) == 6 and d["max_residual_c"] < 0.01
    (ev,) = d["eval"]
    assert (
        ev["value"] == "4kohm" and ev["r_ohm"] == 4000.0 and 50.5 < ev["t_c"] < 51.0
    )  # beta: 0.3 below the 103JT
    assert abs(ev["module_c"] - ev["t_c"]) < 0.02


def test_divider_from_options_and_from_a_config_file(tmp_path):
    div = K.Divider(3300.0)
    codes = [f"{t}:{div.code(r_true(t)):.2f}" for t in (25, 50, 75)]
    args = [a for c in codes for a in ("--point", c)]
    assert cli("fit", *args, "--r-fixed", "3300", "--eval", "10kohm").output.count("25.000") >= 1
    cfg = devcfg.defaults()
    cfg["channels"][3]["r_fixed"] = 3300
    forms = {
        "file": {"config": cfg, "crc": 0, "version": 1, "writes": 1},
        "whole": cfg,
        "flat": {"values": devcfg.get_section(cfg, "channels.3")},
    }
    for name, obj in forms.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(obj))
        res = cli("fit", *args, "--config", str(path), "--channel", "amb", "--json",
                  "--eval", "10kohm")  # fmt: skip
        assert res.exit_code == 0, (name, res.output)
        d = json.loads(res.output)
        assert d["divider"]["r_fixed_ohm"] == 3300.0 and d["channel"] == "amb", name
        assert abs(d["eval"][0]["t_c"] - 25.0) < 0.01, name
    (tmp_path / "bad.json").write_text("{")
    res = cli("fit", *args, "--config", str(tmp_path / "bad.json"))
    assert res.exit_code == 2 and "not JSON" in res.output
    res = cli("fit", *args, "--config", str(tmp_path / "none.json"))
    assert res.exit_code == 2 and "none.json" in res.output


# ------------------------------------------------------------------ property


@st.composite
def sh_thermistors(draw):
    """A plausible NTC as SH: R25 1 k..100 k, B 3000..4500 K rising by 0..200 K to 85 degC."""
    r25 = draw(st.floats(1e3, 1e5))
    b_lo = draw(st.floats(3000.0, 4500.0))
    b_hi = b_lo + draw(st.floats(0.0, 200.0))
    r0 = calib.beta_resistance(273.15, b_lo, r25, 298.15)
    r85 = calib.beta_resistance(358.15, b_hi, r25, 298.15)
    return calib_fit.fit_steinhart_hart([(r0, 0.0), (r25, 25.0), (r85, 85.0)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sh=sh_thermistors(),
    temps=st.lists(
        st.sampled_from([0, 20, 40, 60, 80, 100, 120]), min_size=3, max_size=6, unique=True
    ),
    jitter=st.lists(st.floats(-4.0, 4.0), min_size=6, max_size=6),
    as_codes=st.booleans(),
)
def test_fit_then_eval_returns_the_reference_temperatures(sh, temps, jitter, as_codes):
    r_fixed = calib.model_resistance(50.0, "sh", sh)  # a divider centred in the range
    div = K.Divider(r_fixed)
    pts = []
    for t, j in zip(temps, jitter, strict=False):
        t = t + j
        r = calib.model_resistance(t, "sh", sh)
        v = K.Value("c", "code", div.code(r)) if as_codes else K.Value("r", "ohm", r)
        pts.append((t, v))
    try:
        res = K.fit(pts, "steinhart-hart", div, channel_values={"r_fixed": 10000})
    except K.FitRefused as e:  # only for the reasons calib_fit documents
        assert e.reason.startswith(("ill-conditioned", "non-monotonic", "implausible",
                                    "the module")), e.reason  # fmt: skip
        return
    for t, v in pts:
        assert abs(res.evaluate(v).t_c - t) < 1e-4
    assert res.max_residual_c < 1e-4


# ------------------------------------------------------------------ guided, fake link


class FakeMsg:
    def __init__(self, name, fields):
        self.name, self.fields = name, fields


class FakeLink:
    """A module with one divider per channel whose probes read ``bath_c`` as the
    103JT (or ``stuck`` for a probe that does not follow); logs the requests."""

    port = "/dev/fake"

    def __init__(self, stuck=()):
        self.status = type("S", (), {"module_id": "fake01", "telemetry": {}})()
        self.sent = []
        self.bath_c = 25.0
        self.stuck = set(stuck)
        self.cfg = devcfg.defaults()

    def request(self, name, fields=None, timeout=None):
        self.sent.append((name, fields))
        if name == "config_get":
            return FakeMsg("config", {"values": devcfg.get_section(self.cfg, fields["section"])})
        if name == "cal_read":
            t = 25.0 if fields["channel"] in self.stuck else self.bath_c
            code = DIV.code(r_true(t))
            return FakeMsg("cal_raw", {"ref": 1, "channel": fields["channel"],
                                       "samples": fields["samples"],
                                       "raw_mean_x16": int(round(code * 16)),
                                       "raw_min": int(code) - 8, "raw_max": int(code) + 8,
                                       "temp": 12345})  # fmt: skip
        return FakeMsg("ack", {"ref": 1})


def _script(link, answers):
    it = iter(answers)
    asked = []

    def ask(q):
        asked.append(q)
        a = next(it)
        try:
            link.bath_c = float(a)
        except ValueError:
            pass
        return a

    return ask, asked


def test_guided_session_reads_fits_and_writes_on_confirmation():
    link = FakeLink()
    s = K.GuidedSession(link, [0, 3], "steinhart-hart", reads=2, interval_s=0.0)
    lines = []
    ask, asked = _script(link, ["25", "done", "hot", "26", "90", "undo", "50", "75", "done"])
    res = s.run(ask, confirm=lambda q: True, emit=lines.append)
    text = "\n".join(lines)
    assert "needs at least 3 baths, have 1" in text
    assert "not taken: 'hot' is not a temperature" in text
    assert "not taken: 26 degC is within 2 degC of bath 25" in text
    assert "dropped bath 2 (90 degC)" in text
    assert "2 more needed" in asked[1]
    assert [b.t_ref_c for b in res.baths] == [25.0, 50.0, 75.0]
    assert res.written == ["gpu", "amb"] and res.saved and not res.refused
    writes = [f for n, f in link.sent if n == "cal_write"]
    assert [w["channel"] for w in writes] == [0, 3]
    assert all(w["model"] == 0 and len(w["coeffs"]) == 3 and w["correction"] == [] for w in writes)
    names = [n for n, _ in link.sent]
    assert names.index("config_save") > max(i for i, n in enumerate(names) if n == "cal_write")
    # 4 baths read (one dropped), 2 channels, 2 reads each
    assert sum(1 for n, f in link.sent if n == "cal_read" and f["samples"] == 256) == 4 * 2 * 2
    assert worst_c(res.fits["gpu"], 0, 100) < 0.01  # unquantised means: near exact
    assert "residual" in text and "written and saved: gpu, amb" in text
    assert res.check == {"gpu": 12.345, "amb": 12.345}


def test_guided_session_declined_quit_and_refused():
    link = FakeLink()
    res = K.GuidedSession(link, [0], "beta", interval_s=0.0).run(
        _script(link, ["25", "85", "done"])[0], confirm=lambda q: False, emit=lambda s: None
    )
    assert res.fits and not res.written and "cal_write" not in [n for n, _ in link.sent]
    link = FakeLink()
    res = K.GuidedSession(link, [0], interval_s=0.0).run(
        _script(link, ["25", "quit"])[0], confirm=lambda q: True, emit=lambda s: None
    )
    assert res.aborted and not res.written
    # a probe that stays at 25 degC: that channel is refused, the other one written
    link = FakeLink(stuck={1})
    lines = []
    res = K.GuidedSession(link, [0, 1], interval_s=0.0).run(
        _script(link, ["25", "50", "75", "done"])[0], confirm=lambda q: True, emit=lines.append
    )
    assert list(res.refused) == ["vram"] and res.written == ["gpu"]
    assert "channel vram: fit refused:" in "\n".join(lines)
    assert "resistance" in res.refused["vram"]
    d = res.as_dict()
    assert d["refused"] == res.refused and d["written"] == ["gpu"] and len(d["baths"]) == 3


def test_guided_warns_when_the_bath_is_not_steady():
    link = FakeLink()
    s = K.GuidedSession(link, [0], reads=3, interval_s=0.0)
    s.setup()
    drift = iter([40.0, 40.3, 40.6])
    orig = link.request

    def moving(name, fields=None, timeout=None):
        if name == "cal_read":
            link.bath_c = next(drift)
        return orig(name, fields, timeout)

    link.request = moving
    bath = s.read(40.0)
    (w,) = bath.readings["gpu"].warnings
    assert "not steady" in w and 0.5 < bath.readings["gpu"].drift_c < 0.7
    assert any("warning: gpu: the reads moved" in x for x in K.render_bath(bath))


def test_guided_usage_errors():
    res = cli()
    assert res.exit_code == 2 and "give MODULE" in res.output
    res = cli("--sim", "/dev/ttyUSB0")
    assert res.exit_code == 2
    res = cli("/nonexistent/tty", "--channel", "cpu")
    assert res.exit_code == 2 and "channel 'cpu'" in res.output
    for args, why in ((("--samples", "0"), "--samples must be 1..4096"),
                      (("--reads", "50"), "--reads must be 1..20"),
                      (("--degree", "9"), "--degree must be 0..7"),
                      (("--check-range", "100:50"), "--check-range"),
                      (("--sim-beta", "50"), "--sim-beta")):  # fmt: skip
        res = cli("/nonexistent/tty", *args)
        assert res.exit_code == 2 and why in res.output, (args, res.output)


def test_guided_on_a_missing_port_says_no_module(tmp_path):
    res = cli(str(tmp_path / "ttyNONE"), "--keys-dir", str(tmp_path / "keys"))
    assert res.exit_code == 3, res.output
    assert "modbridge calibrate:" in res.output and "ttyNONE" in res.output


# ------------------------------------------------------------------ guided, virtual module


def test_guided_against_a_virtual_module_writes_and_the_module_reads_true():
    # The sim's bath probes are 103JT-like (B 3435) while the module's factory config
    # says 3950: it reads 67.6 at 75 degC before, 75.0 after.
    res = cli("--sim", "--sim-beta", "3435", "--channel", "gpu", "--yes", "--json",
              input="25\n50\n75\ndone\n")  # fmt: skip
    assert res.exit_code == 0, res.output
    d = json.loads(res.output[res.output.index("{\n") :])
    assert d["written"] == ["gpu"] and d["saved"] and not d["refused"]
    before = d["baths"][2]["readings"]["gpu"]["module_c"]
    assert 66.5 < before < 68.5
    assert abs(d["check"]["gpu"] - 75.0) < 0.15
    f = d["fits"]["gpu"]
    assert f["model"] == "steinhart-hart" and f["max_residual_c"] < 0.01
    assert "bath 1: reference degC" in res.output  # the prompts (stderr in --json)
