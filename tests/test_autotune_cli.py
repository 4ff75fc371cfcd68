"""``modbridge tune`` without a module: argument checks (exit 2 with the option named),
a port with no module (exit 1, said why), and the result's JSON shape and texts."""

from __future__ import annotations

from click.testing import CliRunner

from modbridge.cli import tune as T
from modbridge.cli.main import main


def _run(*args):
    return CliRunner().invoke(main, ["tune", *args])


def test_exactly_one_target():
    for args in ((), ("--sim", "--port", "/dev/null")):
        res = _run(*args)
        assert res.exit_code == 2 and "exactly one of --module, --port, --sim" in res.output


def test_parameters_out_of_the_protocols_range_are_usage_errors():
    for args, opt in (
        (("--amplitude", "60"), "--amplitude"),
        (("--hysteresis", "0.01"), "--hysteresis"),
        (("--max-rise", "30"), "--max-rise"),
        (("--timeout", "10"), "--timeout"),
        (("--cycles", "9"), "--cycles"),
    ):
        res = _run("--port", "/nonexistent", *args)
        assert res.exit_code == 2, (args, res.output)
        assert opt in res.output, (args, res.output)


def test_a_port_without_a_module_fails_with_the_reason(tmp_path):
    res = _run("--port", str(tmp_path / "ttyNONE"), "--keys-dir", str(tmp_path / "keys"))
    assert res.exit_code == 1, res.output
    assert "modbridge tune:" in res.output and "ttyNONE" in res.output


def test_result_dict_and_abort_texts():
    res = T.TuneResult(status="running", module_id="m", port="p")
    T._update(res, {"status": 2, "cycles": 3, "elapsed_s": 120, "bias": 32768, "relay": 13107,
                    "amplitude": 1250, "ku": 20000, "pu_ms": 40000, "kp": 6250, "ki": 71,
                    "kd": 0})  # fmt: skip
    d = res.as_dict()
    assert d["status"] == "done" and d["ku_pct_per_c"] == 20.0 and d["pu_s"] == 40.0
    assert d["gains"] == {"kp": 6.25, "ki": 0.071, "kd": 0.0} and d["bias_pct"] == 50.0
    assert abs(d["ti_s"] - 6250 / 71) < 1e-9
    assert any("Tyreus-Luyben" in line for line in T._summary(res))
    res.causes = 8
    assert "fan stall" in T._why("safety", res)
    res.cycles = 0
    assert "never crossed" in T._why("timeout", res)
