"""`modbridge healthcheck --slurm` (ops/slurm.py, packaging/slurm/): a fake ``scontrol``
on PATH that keeps one node's state and records every call (drain on unhealthy, an
admin's drain never overridden, only our own drain resumed, scontrol missing or
failing); the same against Debian's slurm-wlm on loopback when its daemons run here
(munged, slurmctld, slurmd in a temporary directory, HealthCheckProgram the packaged
wrapper); and end to end: `modbridge run --sim` with a fan stall, drained through the
control socket during the stall and resumed after it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_health import MODBRIDGE, cli, running_bridge, wait_for

from modbridge.ops import health, slurm

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "packaging" / "slurm" / "modbridge-healthcheck"

FAKE_SCONTROL = textwrap.dedent(
    """\
    #!{python}
    # a fake scontrol: one node's State/Reason in $FAKE_SLURM_STATE, calls in $FAKE_SLURM_LOG
    import json, os, sys
    state_file, log = os.environ["FAKE_SLURM_STATE"], os.environ["FAKE_SLURM_LOG"]
    with open(log, "a") as fh:
        fh.write(json.dumps(sys.argv[1:]) + "\\n")
    if os.environ.get("FAKE_SLURM_FAIL"):
        print("slurm_load_node error: Unable to contact slurm controller", file=sys.stderr)
        sys.exit(1)
    st = json.load(open(state_file))
    args = sys.argv[1:]
    if args[:3] == ["show", "node", "-o"]:
        if args[3] != st["name"]:
            print(f"Node {{args[3]}} not found", file=sys.stderr)
            sys.exit(1)
        line = (f"NodeName={{st['name']}} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 "
                f"State={{st['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
                "ExtSensorsTemp=n/s")
        if st.get("reason"):
            line += f" Reason={{st['reason']}} [root@2026-12-02T06:34:24]"
        print(line)
    elif args[0] == "update":
        kv = dict(a.split("=", 1) for a in args[1:])
        assert kv["NodeName"] == st["name"], kv
        base = st["state"].split("+")[0]
        if kv["State"] == "DRAIN":
            st["state"], st["reason"] = base + "+DRAIN", kv["Reason"]
        elif kv["State"] == "RESUME":
            st["state"], st["reason"] = base, None
        json.dump(st, open(state_file, "w"))
    else:
        sys.exit(2)
    """
)


class FakeSlurm:
    def __init__(self, d: Path, name="gpu01", state="IDLE", reason=None):
        self.dir = d
        self.bin = d / "bin"
        self.bin.mkdir()
        exe = self.bin / "scontrol"
        exe.write_text(FAKE_SCONTROL.format(python=sys.executable))
        exe.chmod(0o755)
        self.state_file, self.log = d / "state.json", d / "calls.log"
        self.name = name
        self.set(state, reason)
        self.env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}",
                    "FAKE_SLURM_STATE": str(self.state_file),
                    "FAKE_SLURM_LOG": str(self.log)}  # fmt: skip

    def set(self, state, reason=None):
        self.state_file.write_text(
            json.dumps({"name": self.name, "state": state, "reason": reason})
        )
        self.log.write_text("")

    def node(self) -> dict:
        return json.loads(self.state_file.read_text())

    def calls(self) -> list[list[str]]:
        return [json.loads(x) for x in self.log.read_text().splitlines()]

    def updates(self):
        return [c for c in self.calls() if c[0] == "update"]


@pytest.fixture
def fake(tmp_path):
    return FakeSlurm(tmp_path)


def _doc(level="NORMAL", state="HOSTED"):
    return json.dumps({
        "backend": "virtual",
        "modules": [{"port": "/dev/m0", "module_id": "b9bddcc21aff921d00d1d986", "link_up": True,
                     "last_frame_age_s": 0.1, "state": state, "reason": "host_ok", "faults": [],
                     "gpu": {"uuid": "GPU-1"},
                     "policy": {"level": level,
                                "reasons": ["critical_temp"] if level == "CRITICAL" else []}}],
        "gpus": [{"uuid": "GPU-1", "name": "NVIDIA H200"}],
    })  # fmt: skip


def hc(fake, doc, *args):
    return cli("healthcheck", "--slurm", "--node", fake.name, "--input", "-", *args,
               input=doc, env=fake.env, timeout=60)  # fmt: skip


def test_unhealthy_drains_with_our_reason_and_healthy_resumes_it(fake):
    res = hc(fake, _doc("CRITICAL"))
    assert res.returncode == 1, res.stdout + res.stderr
    (upd,) = fake.updates()
    assert upd[:3] == ["update", "NodeName=gpu01", "State=DRAIN"]
    assert upd[3] == "Reason=modbridge: module b9bddcc21aff..: CRITICAL (critical_temp)"
    assert fake.node()["state"] == "IDLE+DRAIN"
    assert fake.calls()[0] == ["show", "node", "-o", "gpu01"]
    # again, same problem: nothing to update
    fake.log.write_text("")
    assert hc(fake, _doc("CRITICAL")).returncode == 1 and fake.updates() == []
    # another problem: our drain's reason follows it
    res = hc(fake, _doc("NORMAL", "FAILSAFE"))
    assert res.returncode == 1 and "update the drain reason" in res.stdout
    assert fake.node()["reason"].startswith("modbridge: module b9bddcc21aff..: FAILSAFE")
    # recovered: resumed
    fake.log.write_text("")
    res = hc(fake, _doc())
    assert res.returncode == 0, res.stdout + res.stderr
    assert fake.updates() == [["update", "NodeName=gpu01", "State=RESUME"]]
    assert fake.node() == {"name": "gpu01", "state": "IDLE", "reason": None}
    fake.log.write_text("")
    assert hc(fake, _doc()).returncode == 0 and fake.updates() == []  # healthy, not ours: none


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "MIXED+DRAIN", "DOWN", "DOWN+DRAIN"])
def test_an_admins_drain_or_down_is_never_overridden(fake, state):
    fake.set(state, "admin: bad DIMM, ticket 4711")
    res = hc(fake, _doc("CRITICAL"))
    assert res.returncode == 1 and "left alone" in res.stdout, res.stdout
    assert fake.updates() == []
    res = hc(fake, _doc())  # healthy: the admin's drain stays
    assert res.returncode == 0 and fake.updates() == []
    assert fake.node()["reason"] == "admin: bad DIMM, ticket 4711"


def test_no_bridge_drains_and_exits_3(fake, tmp_path):
    res = cli("healthcheck", "--slurm", "--node", "gpu01", "--control-socket",
              str(tmp_path / "none.sock"), env=fake.env, timeout=60)  # fmt: skip
    assert res.returncode == 3, res.stdout + res.stderr
    assert fake.node()["reason"].startswith("modbridge: no bridge: ")


def test_node_name_from_slurmd_and_dry_run(fake):
    env = {**fake.env, "SLURMD_NODENAME": "gpu01"}
    res = cli("healthcheck", "--slurm", "--input", "-", "--dry-run", "--json",
              input=_doc("CRITICAL"), env=env)  # fmt: skip
    out = json.loads(res.stdout)
    assert res.returncode == 1 and out["action"]["action"] == "drained", out
    assert out["action"]["message"].startswith("gpu01: would drain: modbridge: ")
    assert fake.updates() == [] and fake.node()["state"] == "IDLE"


def test_dry_run_never_fails_on_the_scheduler(fake, tmp_path):
    """A dry run changes nothing and its exit code is the verdict's alone: scontrol
    missing or failing (a machine without Slurm, `--sim`) is said, not an error."""
    for env in ({**fake.env, "PATH": str(tmp_path / "empty")},
                {**fake.env, "FAKE_SLURM_FAIL": "1"}):  # fmt: skip
        res = cli("healthcheck", "--slurm", "--node", "gpu01", "--input", "-", "--dry-run",
                  "--json", input=_doc(), env=env)  # fmt: skip
        out = json.loads(res.stdout)
        assert res.returncode == 0, res.stdout + res.stderr
        assert out["action"]["action"] == "unknown" and "state is unknown" in out["action"][
            "message"], out
        res = cli("healthcheck", "--slurm", "--node", "gpu01", "--input", "-", "--dry-run",
                  input=_doc("CRITICAL"), env=env)  # fmt: skip
        assert res.returncode == 1 and "would drain: modbridge: " in res.stdout, res.stdout
    assert fake.updates() == [] and fake.node()["state"] == "IDLE"


def test_scontrol_missing_or_failing_is_a_clear_error(fake, tmp_path):
    env = {**fake.env, "PATH": str(tmp_path / "empty")}
    res = cli("healthcheck", "--slurm", "--node", "gpu01", "--input", "-",
              input=_doc("CRITICAL"), env=env)  # fmt: skip
    assert res.returncode == 1 and "scontrol not found on PATH" in res.stderr, res.stderr
    res = hc(fake, _doc(), "--scontrol", str(tmp_path / "nope"))
    assert res.returncode == 1 and "cannot run" in res.stderr, res.stderr
    res = cli("healthcheck", "--slurm", "--node", "gpu01", "--input", "-",
              input=_doc(), env={**fake.env, "FAKE_SLURM_FAIL": "1"})  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        "scontrol show node failed (exit 1): slurm_load_node error: Unable to contact" in res.stderr
    )
    # healthy, but the node could not be read: still exit 1 (not told)
    res = hc(fake, _doc(), "--node", "other")
    assert res.returncode == 1 and "Node other not found" in res.stderr


REAL_LINE = ("NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 "
             "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
             "Partitions=debug  CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES= CapWatts=n/a "
             "ExtSensorsTemp=n/s Reason={} [root@2026-12-02T06:34:24]")  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="=[]"),
               min_size=1, max_size=120)
       .filter(lambda r: r.strip() not in ("", "(null)")))  # fmt: skip
def test_a_reason_reads_back_as_written(reason):
    got = slurm.parse_show_node(REAL_LINE.format(reason), "vm")
    assert got.reason == reason.strip() and got.drained and got.state == "IDLE+DRAIN"


def test_our_reasons_read_back_and_are_ours():
    v = health.judge(json.loads(_doc("CRITICAL")))
    reason = slurm.drain_reason(v)
    got = slurm.parse_show_node(REAL_LINE.format(reason), "vm")
    assert got.reason == reason and got.ours
    line = REAL_LINE.replace(" Reason={} [root@2026-12-02T06:34:24]", "").replace("+DRAIN", "")
    got = slurm.parse_show_node(line, "vm")
    assert got.reason is None and not got.drained and not got.ours
    with pytest.raises(slurm.SlurmError, match="no NodeName"):
        slurm.parse_show_node("garbage", "vm")


# ------------------------------------------------------------------ end to end


def test_e2e_fan_stall_drains_through_the_bridge_and_recovery_resumes(fake):
    """`modbridge run --sim` with fan 1 stalled from 20 s to 60 s of world time (10x:
    2..6 s): FAILSAFE fan_stall -> drained; the stall over -> resumed (the policy's
    held WARN is healthy)."""
    seen = []
    with running_bridge("--sim-fault", "fan_stall:1@20s-60s") as (_p, sock, _d):
        t0 = time.monotonic()
        while time.monotonic() - t0 < 45:
            res = cli("healthcheck", "--slurm", "--node", "gpu01", "--control-socket", sock,
                      "--json", env=fake.env, timeout=30)  # fmt: skip
            out = json.loads(res.stdout)
            seen.append((round(time.monotonic() - t0, 1), res.returncode, fake.node()["state"],
                         out["action"]["action"]))  # fmt: skip
            if any(s[2] == "IDLE+DRAIN" for s in seen) and seen[-1][2] == "IDLE":
                break
            time.sleep(0.5)
    drained = [s for s in seen if s[3] == "drained"]
    resumed = [s for s in seen if s[3] == "resumed"]
    assert drained and resumed and drained[0][0] < resumed[0][0], seen
    assert seen[-1][1] == 0 and seen[-1][2] == "IDLE", seen
    ups = fake.updates()
    assert ups[0][2] == "State=DRAIN" and "FAILSAFE" in ups[0][3] and ups[-1][2] == "State=RESUME"


# ------------------------------------------------------------------ real Slurm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tools():
    need = ("munged", "slurmctld", "slurmd", "scontrol")
    missing = [
        t for t in need if shutil.which(t, path="/usr/sbin:/usr/bin:" + os.environ["PATH"]) is None
    ]
    if missing:
        pytest.skip(f"slurm-wlm/munge not installed ({', '.join(missing)} missing): "
                    "apt-get install slurm-wlm munge")  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("a single-node Slurm here runs slurmd as root")


def _snippet(program: Path, interval: int) -> str:
    """packaging/slurm/slurm.conf.modbridge with this test's program and interval."""
    out = []
    for line in (REPO / "packaging" / "slurm" / "slurm.conf.modbridge").read_text().splitlines():
        if line.startswith("HealthCheckProgram="):
            line = f"HealthCheckProgram={program}"
        elif line.startswith("HealthCheckInterval="):
            line = f"HealthCheckInterval={interval}"
        if line and not line.startswith("#"):
            out.append(line)
    assert [x.split("=")[0] for x in out] == ["HealthCheckProgram", "HealthCheckInterval",
                                              "HealthCheckNodeState"], out  # fmt: skip
    return "\n".join(out)


class RealSlurm:
    """munged, slurmctld and slurmd for one node (this host's short name) in ``d``."""

    def __init__(self, d: Path, health_program: Path, interval: int = 2):
        self.d = d
        self.node = slurm.short_hostname()
        self.conf = d / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        self.conf.write_text(textwrap.dedent(f"""\
            ClusterName=mbtest
            SlurmctldHost={self.node}(127.0.0.1)
            SlurmctldPort={_free_port()}
            SlurmdPort={_free_port()}
            AuthType=auth/munge
            AuthInfo=socket={d}/munge.sock
            CredType=cred/munge
            SlurmUser=root
            SlurmdUser=root
            StateSaveLocation={d}/state
            SlurmdSpoolDir={d}/spool
            SlurmctldPidFile={d}/slurmctld.pid
            SlurmdPidFile={d}/slurmd.pid
            SlurmctldLogFile={d}/slurmctld.log
            SlurmdLogFile={d}/slurmd.log
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            SelectType=select/cons_tres
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            MpiDefault=none
            ReturnToService=2
            SlurmdTimeout=30
            {{snippet}}
            NodeName={self.node} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
            PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
        """).replace("{snippet}", _snippet(health_program, interval)))  # fmt: skip
        self.env = {**os.environ, "SLURM_CONF": str(self.conf),
                    "PATH": "/usr/sbin:/usr/bin:" + os.environ["PATH"]}  # fmt: skip

    def _spawn(self, *cmd):
        out = open(self.d / f"{Path(cmd[0]).name}.out", "wb")  # noqa: SIM115 - closed in stop
        p = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)  # fmt: skip
        p.out = out
        self.procs.append(p)
        return p

    def start(self):
        d = self.d
        self._spawn("munged", "-F", f"--key-file={d}/munge.key", f"--socket={d}/munge.sock",
                    f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                    f"--seed-file={d}/munge.seed", "--force")  # fmt: skip
        wait_for(lambda: (d / "munge.sock").exists(), 10, "munged's socket")
        self._spawn("slurmctld", "-D", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        return self

    def scontrol(self, *args):
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True,
                              text=True, timeout=15)  # fmt: skip

    def tails(self) -> str:
        out = []
        for f in sorted(self.d.glob("*.out")) + sorted(self.d.glob("*.log")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-1500:])
        return "\n".join(out)

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
            p.out.close()


@pytest.fixture
def real_slurm():
    _tools()
    d = Path(tempfile.mkdtemp(prefix="mbsl-", dir="/tmp"))
    d.chmod(0o700)
    doc = d / "status.json"
    doc.write_text(_doc())
    runs = d / "hc.runs"
    cfg = d / "modbridge.toml"
    cfg.write_text("")
    prog = d / "hc.sh"
    # slurmd runs it with an empty environment: the wrapper sets PATH; SLURM_CONF is
    # this test's (a site's scontrol finds /etc/slurm/slurm.conf)
    prog.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo run >> {runs}
        export SLURM_CONF={d}/slurm.conf MODBRIDGE={MODBRIDGE} MODBRIDGE_CONFIG={cfg}
        exec {WRAPPER} --input {doc}
    """))  # fmt: skip
    prog.chmod(0o755)
    s = RealSlurm(d, prog)
    s.runs, s.doc = runs, doc
    try:
        s.start()
        try:
            wait_for(lambda: s.scontrol("show", "node", "-o", s.node).returncode == 0
                     and "State=IDLE" in s.scontrol("show", "node", "-o", s.node).stdout,
                     40, "the node IDLE")  # fmt: skip
        except AssertionError:
            pytest.skip("the single-node Slurm did not come up here:\n" + s.tails())
        yield s
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


def _runs(s) -> int:
    return len(s.runs.read_text().splitlines()) if s.runs.exists() else 0


def test_real_slurm_drains_on_critical_and_resumes_on_recovery(real_slurm):
    s = real_slurm
    node = lambda: s.scontrol("show", "node", "-o", s.node).stdout  # noqa: E731
    wait_for(lambda: _runs(s) >= 1, 30, "slurmd to run the HealthCheckProgram")
    s.doc.write_text(_doc("CRITICAL"))
    line = wait_for(lambda: (x := node()) and "+DRAIN" in x and "Reason=modbridge:" in x and x,
                    40, "the node drained by modbridge")  # fmt: skip
    st = slurm.parse_show_node(line, s.node)
    assert st.drained and st.reason == "modbridge: module b9bddcc21aff..: CRITICAL (critical_temp)"
    s.doc.write_text(_doc())
    line = wait_for(lambda: (x := node()) and "DRAIN" not in x.split("State=")[1].split()[0] and x,
                    40, "the node resumed")  # fmt: skip
    assert slurm.parse_show_node(line, s.node).state.startswith("IDLE"), line
    # an admin's drain: a CRITICAL report leaves it as it is, recovery does not resume it
    assert s.scontrol("update", f"NodeName={s.node}", "State=DRAIN",
                      "Reason=admin: bad DIMM").returncode == 0  # fmt: skip
    s.doc.write_text(_doc("CRITICAL"))
    n = _runs(s)
    wait_for(lambda: _runs(s) >= n + 2, 30, "two more health checks")
    assert slurm.parse_show_node(node(), s.node).reason == "admin: bad DIMM"
    s.doc.write_text(_doc())
    n = _runs(s)
    wait_for(lambda: _runs(s) >= n + 2, 30, "two more health checks")
    st = slurm.parse_show_node(node(), s.node)
    assert st.drained and st.reason == "admin: bad DIMM", st


# ------------------------------------------------------------------ NHC


@pytest.mark.parametrize("level, dies", [("NORMAL", False), ("CRITICAL", True)])
def test_the_nhc_check_dies_with_the_first_line_on_unhealthy(tmp_path, level, dies):
    if shutil.which("bash") is None:
        pytest.skip("no bash (NHC is bash)")
    doc = tmp_path / "status.json"
    doc.write_text(_doc(level))
    nhc = REPO / "packaging" / "slurm" / "modbridge.nhc"
    script = (f'die() {{ echo "DIE $1 $2"; }}; MODBRIDGE_CMD={MODBRIDGE}; source {nhc}; '
              f'check_modbridge -t 30 -a "--input {doc}"; echo "rc=$?"')  # fmt: skip
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    if dies:
        assert res.stdout == (
            "DIE 1 check_modbridge:  unhealthy: module b9bddcc21aff..: "
            "CRITICAL (critical_temp)\nrc=1\n"
        ), res.stdout + res.stderr
    else:
        assert res.stdout == "rc=0\n", res.stdout + res.stderr
    res = subprocess.run(["bash", "-c", f"die() {{ echo \"DIE $1 $2\"; }}; source {nhc}; "
                          "MODBRIDGE_CMD=/nonexistent/modbridge check_modbridge"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.stdout.startswith("DIE 1 check_modbridge:  /nonexistent/modbridge not found")
