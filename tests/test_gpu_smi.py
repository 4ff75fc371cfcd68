"""nvidia-smi backend: the parser on the H200 recordings, and the real subprocess path
through a fake ``nvidia-smi`` script (never the real command)."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from modbridge.gpu.base import (
    GpuDriverNotLoaded,
    GpuError,
    GpuLost,
    GpuNoPermission,
    PowerLimitRefused,
)
from modbridge.gpu.smi import (
    QUERY_FIELDS,
    SmiBackend,
    parse_query_csv,
    parse_thresholds_xml,
    parse_value,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-h200"
UUID = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"


# --------------------------------------------------------------------------- parsing


def test_parse_the_fixture_csv_exactly():
    (row,) = parse_query_csv((FIXTURES / "nvidia_smi_query.csv").read_text())
    assert row == {
        "index": 0.0,
        "name": "NVIDIA H200",
        "uuid": UUID,
        "pci.bus_id": "00000000:00:06.0",
        "temperature.gpu": 32.0,
        "temperature.memory": 31.0,
        "power.draw": 94.38,
        "power.limit": 700.0,
        "power.default_limit": 700.0,
        "power.min_limit": 200.0,
        "power.max_limit": 700.0,
        "enforced.power.limit": 700.0,
        "utilization.gpu": 0.0,
        "memory.used": 0.0,
        "memory.total": 143771.0,
        "clocks.current.sm": 345.0,
        "clocks.current.memory": 3201.0,
        "fan.speed": None,
        "pstate": "P0",
        "clocks_event_reasons.active": 1,
    }


def test_query_fields_are_valid_for_this_driver():
    """Every field asked for is in the recorded ``nvidia-smi --help-query-gpu``."""
    help_text = (FIXTURES / "nvidia_smi_help_query_gpu.txt").read_text()
    for field in QUERY_FIELDS:
        assert f'"{field}"' in help_text, field


def test_parse_noheader_nounits():
    text = (
        "0, GPU-a, NVIDIA H200, 00000000:00:06.0, 58, 52, 12, 689.54, 700.00, 700.00, 700.00,"
        " 200.00, 700.00, 0x0000000000000004, 100, [N/A]\n"
        "1, GPU-b, NVIDIA H200, 00000000:00:07.0, 33, [Not Supported], 55, 80.1, 700.00,"
        " 450.00, 700.00, 200.00, 700.00, 0x0000000000000001, 0, 40\n"
    )
    a, b = parse_query_csv(text)
    assert a["clocks_event_reasons.active"] == 4 and a["fan.speed"] is None
    assert a["power.draw"] == 689.54 and a["utilization.gpu"] == 100.0
    assert b["temperature.memory"] is None and b["fan.speed"] == 40.0
    assert b["enforced.power.limit"] == 450.0


@pytest.mark.parametrize(
    "field, text, value",
    [
        ("power.draw [W]", " 94.38 W", 94.38),
        ("fan.speed", "[N/A]", None),
        ("fan.speed", "N/A", None),
        ("temperature.memory", "[Not Supported]", None),
        ("clocks_event_reasons.active", "0x0000000000000004", 4),
        ("utilization.gpu [%]", "0 %", 0.0),
        ("name", "NVIDIA H200", "NVIDIA H200"),
        ("temperature.gpu", "-5", -5.0),
    ],
)
def test_parse_value(field, text, value):
    assert parse_value(field, text) == value


def test_wrong_column_count_is_a_clear_error():
    with pytest.raises(GpuError, match="2 columns where 16 were asked"):
        parse_query_csv("0, GPU-a\n")


def test_thresholds_from_the_fixture_xml_match_nvml():
    """This driver gives T.Limit offsets; they add up to NVML's 95/89/87 degC."""
    t = parse_thresholds_xml((FIXTURES / "nvidia_smi_q.xml").read_text())
    assert t == {
        UUID: {"shutdown_temp_c": 95.0, "slowdown_temp_c": 89.0, "max_operating_temp_c": 87.0}
    }


def test_thresholds_absolute_form_of_older_drivers():
    xml = (
        "<nvidia_smi_log><gpu id='x'><uuid>GPU-old</uuid><temperature>"
        "<gpu_temp>40 C</gpu_temp><gpu_temp_max_threshold>92 C</gpu_temp_max_threshold>"
        "<gpu_temp_slow_threshold>89 C</gpu_temp_slow_threshold>"
        "<gpu_temp_max_gpu_threshold>87 C</gpu_temp_max_gpu_threshold>"
        "</temperature></gpu></nvidia_smi_log>"
    )
    assert parse_thresholds_xml(xml)["GPU-old"] == {
        "shutdown_temp_c": 92.0,
        "slowdown_temp_c": 89.0,
        "max_operating_temp_c": 87.0,
    }


# --------------------------------------------------------------------------- fake nvidia-smi

FAKE_SMI = r"""
import json, os, sys, time
state_path = os.environ["FAKE_SMI_STATE"]
state = json.load(open(state_path))
with open(state_path + ".log", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
mode = state.get("mode", "ok")
if mode == "hang":
    time.sleep(30)
if mode == "lost":
    print("Unable to determine the device handle for GPU0000:00:06.0: GPU is lost. "
          "Reboot the system to recover this GPU", file=sys.stderr)
    sys.exit(15)
if mode == "broken":
    print("Failed to initialize NVML: Unknown Error", file=sys.stderr)
    sys.exit(255)
args = sys.argv[1:]
if args[0].startswith("--query-gpu="):
    fields = args[0].split("=", 1)[1].split(",")
    assert args[1] == "--format=csv,noheader,nounits", args
    for f in fields:
        if f in state.get("invalid", []):
            print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
            sys.exit(2)
    row = dict(state["row"], **{"enforced.power.limit": "%.2f" % state["limit"],
                                "power.limit": "%.2f" % state["limit"]})
    row["clocks_throttle_reasons.active"] = row["clocks_event_reasons.active"]
    print(", ".join(row[f] for f in fields))
elif args[:2] == ["-q", "-x"]:
    sys.stdout.write(open(state["xml"]).read())
elif args[0] == "-i" and args[2] == "-pl":
    watts = float(args[3])
    if mode == "noperm":
        print("Unable to set power limit for GPU 00000000:00:06.0: Insufficient Permissions")
        sys.exit(4)
    if not 200 <= watts <= 700:
        print("Provided power limit %.2f W is not a valid power limit which should be "
              "between 200.00 W and 700.00 W for GPU 00000000:00:06.0" % watts)
        sys.exit(2)
    print("Power limit for GPU 00000000:00:06.0 was set to %.2f W from %.2f W."
          % (watts, state["limit"]))
    print("All done.")
    state["limit"] = watts
    json.dump(state, open(state_path, "w"))
else:
    print("unexpected arguments", args, file=sys.stderr)
    sys.exit(2)
"""

ROW = {
    "index": "0",
    "uuid": UUID,
    "name": "NVIDIA H200",
    "pci.bus_id": "00000000:00:06.0",
    "temperature.gpu": "32",
    "temperature.memory": "31",
    "temperature.gpu.tlimit": "55",
    "power.draw": "94.38",
    "power.default_limit": "700.00",
    "power.min_limit": "200.00",
    "power.max_limit": "700.00",
    "clocks_event_reasons.active": "0x0000000000000001",
    "utilization.gpu": "0",
    "fan.speed": "[N/A]",
}


class FakeSmi:
    def __init__(self, tmp_path, monkeypatch):
        self.path = tmp_path / "nvidia-smi"
        self.path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_SMI))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)
        self.state_path = tmp_path / "state.json"
        self.state = {"row": dict(ROW), "limit": 700.0, "xml": str(FIXTURES / "nvidia_smi_q.xml")}
        self.save()
        monkeypatch.setenv("FAKE_SMI_STATE", str(self.state_path))

    def save(self):
        self.state_path.write_text(json.dumps(self.state))

    def set(self, **kw):
        self.state.update(kw)
        self.save()

    @property
    def argvs(self):
        log = Path(str(self.state_path) + ".log")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def smi(tmp_path, monkeypatch):
    return FakeSmi(tmp_path, monkeypatch)


def test_sample_through_a_real_subprocess(smi):
    b = SmiBackend(smi_path=smi.path)
    (info,) = b.devices()
    assert (info.index, info.uuid, info.name, info.pci_bus_id) == (
        0,
        UUID,
        "NVIDIA H200",
        "00000000:00:06.0",
    )
    s = b.sample(UUID)
    assert s.state == "ok"
    assert (s.temperature_c, s.memory_temperature_c, s.power_w) == (32.0, 31.0, 94.38)
    assert (s.enforced_limit_w, s.default_limit_w, s.min_limit_w, s.max_limit_w) == (
        700.0,
        700.0,
        200.0,
        700.0,
    )
    assert s.clocks_event_reasons == 1 and s.utilization == 0.0
    assert s.fan_speed_ratio is None
    assert (s.slowdown_temp_c, s.shutdown_temp_c, s.max_operating_temp_c) == (89.0, 95.0, 87.0)
    assert s.extra["requested_limit_w"] == 700.0


def test_argv_lists_and_one_subprocess_per_cycle(smi):
    b = SmiBackend(smi_path=smi.path)
    first = smi.argvs[0]
    assert first == [
        "--query-gpu=" + ",".join(QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]
    b.sample_all()  # thresholds: one -q -x, once
    before = b.subprocesses
    samples = b.sample_all()
    assert b.subprocesses == before + 1
    b.sample(UUID)  # served from the cycle's cache
    assert b.subprocesses == before + 1
    assert [s.uuid for s in samples] == [UUID]
    assert sum(1 for a in smi.argvs if a[:2] == ["-q", "-x"]) == 1


def test_missing_binary():
    with pytest.raises(GpuDriverNotLoaded, match="nvidia-smi not found") as e:
        SmiBackend(smi_path="/nonexistent/nvidia-smi")
    assert "--sim" in str(e.value)


def test_not_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GpuDriverNotLoaded, match="install the NVIDIA driver or use --sim"):
        SmiBackend()


def test_timeout(smi):
    b = SmiBackend(smi_path=smi.path, timeout_s=0.5, max_age_s=0)
    smi.set(mode="hang")
    with pytest.raises(GpuError, match=r"did not answer --query-gpu within 0.5 s"):
        b.sample(UUID)


def test_non_zero_exit_reports_stderr(smi):
    smi.set(mode="broken")
    with pytest.raises(GpuError) as e:
        SmiBackend(smi_path=smi.path)
    assert "exit code 255" in str(e.value) and "Unknown Error" in str(e.value)


def test_gpu_lost(smi):
    b = SmiBackend(smi_path=smi.path, max_age_s=0)
    smi.set(mode="lost")
    with pytest.raises(GpuLost, match="Xid 79"):
        b.sample(UUID)
    (s,) = b.sample_all()
    assert s.state == "lost" and "GPU is lost" in s.error


def test_older_field_name_is_used_when_the_new_one_is_rejected(smi):
    smi.set(invalid=["clocks_event_reasons.active", "temperature.gpu.tlimit"])
    b = SmiBackend(smi_path=smi.path)
    assert b.sample(UUID).clocks_event_reasons == 1
    query = [a for a in smi.argvs if a[0].startswith("--query-gpu=")][-1][0]
    assert "clocks_throttle_reasons.active" in query
    assert "clocks_event_reasons.active" not in query
    assert "temperature.gpu.tlimit" not in query


def test_set_power_limit_then_requery(smi):
    b = SmiBackend(smi_path=smi.path)
    assert b.set_power_limit_w(UUID, 450) == 450.0
    pl = [a for a in smi.argvs if "-pl" in a]
    assert pl == [["-i", UUID, "-pl", "450.00"]]
    assert smi.argvs[-1][0].startswith("--query-gpu=")  # read back
    assert b.sample(UUID).enforced_limit_w == 450.0


def test_set_power_limit_without_root(smi):
    b = SmiBackend(smi_path=smi.path)
    smi.set(mode="noperm")
    with pytest.raises(GpuNoPermission) as e:
        b.set_power_limit_w(UUID, 450)
    assert "root" in str(e.value) and "Insufficient Permissions" in str(e.value)


def test_set_power_limit_out_of_range_is_refused(smi):
    b = SmiBackend(smi_path=smi.path)
    with pytest.raises(PowerLimitRefused, match="not a valid power limit") as e:
        b.set_power_limit_w(UUID, 100)
    assert e.value.requested_w == 100


def test_fake_smi_is_a_file_not_a_shell_string(smi):
    assert os.access(smi.path, os.X_OK)
