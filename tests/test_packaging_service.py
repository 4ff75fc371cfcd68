"""Running as a service (packaging/): the udev rule and the systemd unit.

The udev rule is parsed line by line (every key known, every operator legal, every
GOTO has its LABEL) and run through a small evaluator of the subset it uses, against
made-up devices: a CH340 gets the group, mode, tag, ModemManager flag and a
by-path symlink; other adapters, other subsystems and removals get nothing. The unit
is checked by ``systemd-analyze verify`` (a copy whose ExecStart points at a stand-in
executable: verify needs it to exist) and ``systemd-analyze security --offline``, and
held to what the bridge expects: its state directory is the bridge's default, its
runtime directory is where the control socket's clients look, its ExecStart parses
as a ``modbridge run`` command line.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from modbridge.actuator.journal import DEFAULT_STATE_DIR, default_state_dir
from modbridge.link.discovery import CH340

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "packaging" / "udev" / "99-modbridge.rules"
UNIT = ROOT / "packaging" / "systemd" / "modbridge.service"
ANALYZE = shutil.which("systemd-analyze") or (
    "/usr/bin/systemd-analyze" if Path("/usr/bin/systemd-analyze").exists() else None
)

# ----------------------------------------------------------------------------- udev

_KEY = re.compile(r'\s*([A-Z_]+)(?:\{([^}]*)\})?\s*(==|!=|\+=|-=|:=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
_MATCH_KEYS = {"ACTION", "SUBSYSTEM", "SUBSYSTEMS", "KERNEL", "KERNELS", "ATTR", "ATTRS",
               "ENV", "DRIVERS", "TAG"}  # fmt: skip
_ASSIGN_KEYS = {"GROUP", "MODE", "OWNER", "TAG", "ENV", "SYMLINK", "IMPORT", "GOTO", "LABEL"}


def parse_rules(text: str) -> list[list[tuple]]:
    """One list of ``(key, attr, op, value)`` per rule line; ValueError naming the line
    for anything that is not ``KEY[{attr}] OP "value"`` separated by commas."""
    rules = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pos, items = 0, []
        while pos < len(line):
            m = _KEY.match(line, pos)
            if m is None:
                raise ValueError(f"line {n}: cannot parse at {line[pos:]!r}")
            items.append(m.groups())
            pos = m.end()
            if pos < len(line):
                if line[pos] != ",":
                    raise ValueError(f"line {n}: expected ',' at {line[pos:]!r}")
                pos += 1
        for key, _attr, op, _value in items:
            if op in ("==", "!=") and key not in _MATCH_KEYS:
                raise ValueError(f"line {n}: {key} cannot be matched")
            if op not in ("==", "!=") and key not in _ASSIGN_KEYS:
                raise ValueError(f"line {n}: {key} cannot be assigned")
        rules.append(items)
    return rules


def _glob(pattern: str, value: str) -> bool:
    from fnmatch import fnmatchcase

    return any(fnmatchcase(value, p) for p in pattern.split("|"))


def evaluate(rules, device: dict) -> dict:
    """The subset of udev the rule uses, over ``device`` (``action``, ``subsystem``,
    ``parents``: attribute dicts, ``env``): the assignments that apply."""
    env = dict(device.get("env", {}))
    out = {"GROUP": None, "MODE": None, "TAG": [], "SYMLINK": [], "ENV": {}, "IMPORT": []}
    labels = {r[0][3]: i for i, r in enumerate(rules) if r[0][0] == "LABEL"}
    i = 0
    while i < len(rules):
        rule, goto = rules[i], None
        i += 1
        matched = True
        for key, attr, op, value in rule:
            if op not in ("==", "!="):
                continue
            if key == "ACTION":
                ok = _glob(value, device.get("action", "add"))
            elif key == "SUBSYSTEM":
                ok = _glob(value, device["subsystem"])
            elif key == "ATTRS":
                ok = any(_glob(value, p.get(attr, "")) for p in device.get("parents", []))
            elif key == "ENV":
                ok = _glob(value, env.get(attr, "")) if value else attr not in env
            else:
                raise AssertionError(f"the evaluator does not know {key}")
            if ok != (op == "=="):
                matched = False
                break
        if not matched:
            continue
        for key, attr, op, value in rule:
            if op in ("==", "!="):
                continue
            value = re.sub(r"\$env\{([^}]*)\}", lambda m: env.get(m.group(1), ""), value)
            if key == "GOTO":
                goto = value
            elif key == "LABEL":
                pass
            elif key == "IMPORT":
                out["IMPORT"].append(f"{attr} {value}")
                if (attr, value) == ("builtin", "path_id"):
                    env.update(device.get("path_id", {}))
            elif key == "ENV":
                env[attr] = value
                out["ENV"][attr] = value
            elif key in ("TAG", "SYMLINK"):
                out[key].append(value)
            else:
                out[key] = value
        if goto is not None:
            assert goto in labels, f"GOTO {goto} has no LABEL"
            i = labels[goto] + 1
    return out


def _tty(vid="1a86", pid="7523", action="add", subsystem="tty", path_id=True):
    return {
        "action": action,
        "subsystem": subsystem,
        "parents": [{"interface": "00"}, {"idVendor": vid, "idProduct": pid,
                                          "product": "USB Serial"}],
        "path_id": {"ID_PATH": "pci-0000:00:14.0-usb-0:1.2:1.0",
                    "ID_PATH_TAG": "pci-0000_00_14_0-usb-0_1_2_1_0"} if path_id else {},
    }  # fmt: skip


@pytest.fixture(scope="module")
def rules():
    return parse_rules(RULES.read_text(encoding="utf-8"))


def test_rule_lines_parse_and_every_goto_has_its_label(rules):
    labels = [r[0][3] for r in rules if r[0][0] == "LABEL"]
    gotos = [v for r in rules for k, _a, _o, v in r if k == "GOTO"]
    assert gotos and set(gotos) <= set(labels)
    assert len(labels) == len(set(labels))


def test_the_parser_refuses_garbage():
    for bad in ('SUBSYSTEM=="tty" GROUP="x"', 'SUBSYSTEM="tty', 'GROUP=="x"', 'FOO="1"',
                'SUBSYSTEM=="tty",, MODE="0660"'):  # fmt: skip
        with pytest.raises(ValueError, match="line 1"):
            parse_rules(bad)


def test_the_rule_matches_the_ch340_the_bridge_discovers(rules):
    vid, pid = (f"{x:04x}" for x in CH340)
    text = RULES.read_text(encoding="utf-8")
    assert f'ATTRS{{idVendor}}=="{vid}"' in text and f'ATTRS{{idProduct}}=="{pid}"' in text
    matching = [r for r in rules if ("ATTRS", "idVendor", "==", vid) in r]
    assert len(matching) == 1 and ("SUBSYSTEM", None, "==", "tty") in matching[0]
    assert ("ATTRS", "idProduct", "==", pid) in matching[0]


def test_a_ch340_gets_group_mode_tag_symlink_and_modemmanager_ignore(rules):
    got = evaluate(rules, _tty())
    assert got["GROUP"] == "modbridge" and got["MODE"] == "0660"
    assert got["TAG"] == ["systemd"]
    assert got["ENV"] == {"ID_MM_DEVICE_IGNORE": "1"}
    assert got["SYMLINK"] == ["modbridge/by-path/pci-0000:00:14.0-usb-0:1.2:1.0"]
    assert got["IMPORT"] == ["builtin path_id"]


def test_other_devices_and_removals_are_left_alone(rules):
    nothing = {"GROUP": None, "MODE": None, "TAG": [], "SYMLINK": [], "ENV": {}, "IMPORT": []}
    for dev in (_tty(vid="0403", pid="6001"),  # an FTDI adapter
                _tty(pid="55d4"),  # another WCH chip
                _tty(subsystem="usb"),  # the USB device itself, not its tty
                _tty(action="remove")):  # fmt: skip
        assert evaluate(rules, dev) == nothing, dev


def test_no_symlink_without_a_usb_path(rules):
    got = evaluate(rules, _tty(path_id=False))
    assert got["SYMLINK"] == [] and got["GROUP"] == "modbridge"


# ----------------------------------------------------------------------------- unit


def unit_entries(text: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values in order]}}`` (keys repeat in unit files)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        assert section is not None and "=" in line, f"line {n}: {line!r}"
        key, value = line.split("=", 1)
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture(scope="module")
def unit():
    return unit_entries(UNIT.read_text(encoding="utf-8"))


def _one(unit, key, section="Service"):
    values = unit[section][key]
    assert len(values) == 1, (key, values)
    return values[0]


def test_unit_hardening(unit):
    assert _one(unit, "Restart") == "always"
    assert _one(unit, "RestartPreventExitStatus") == "2"  # a bad config: no restart loop
    assert _one(unit, "ProtectSystem") == "strict"
    for key in ("ProtectHome", "PrivateTmp", "NoNewPrivileges", "ProtectKernelTunables",
                "ProtectKernelModules", "ProtectControlGroups", "RestrictSUIDSGID"):
        assert _one(unit, key) == "yes", key  # fmt: skip
    assert _one(unit, "DevicePolicy") == "closed"
    allowed = unit["Service"]["DeviceAllow"]
    for dev in ("char-ttyUSB rw", "char-ttyACM rw", "/dev/nvidiactl rw"):
        assert dev in allowed, dev
    assert _one(unit, "SupplementaryGroups") == "modbridge"
    assert set(_one(unit, "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET",
                                                                  "AF_INET6"}  # fmt: skip
    assert "@system-service" in unit["Service"]["SystemCallFilter"]
    assert _one(unit, "CapabilityBoundingSet") == "CAP_SYS_ADMIN"
    assert "User" not in unit["Service"]  # root: NVML's limit writes (see the unit)
    assert _one(unit, "WantedBy", "Install") == "multi-user.target"


def test_unit_state_dir_is_the_bridges_default(unit):
    name = _one(unit, "StateDirectory")
    # what systemd sets for StateDirectory=<name> on a system unit
    env = {"STATE_DIRECTORY": f"/var/lib/{name}"}
    assert default_state_dir(None, environ=env) == Path(DEFAULT_STATE_DIR)
    assert default_state_dir(None, environ={}) == Path(DEFAULT_STATE_DIR)  # no env: same
    assert _one(unit, "StateDirectoryMode") == "0700"  # the keys and the journal
    assert "--state-dir" not in _one(unit, "ExecStart")


def test_unit_runtime_dir_is_where_control_clients_look(unit):
    from modbridge.ops import ctlsock

    name = _one(unit, "RuntimeDirectory")
    served = ctlsock.default_path(environ={"RUNTIME_DIRECTORY": f"/run/{name}"})
    assert served == Path("/run/modbridge/control.sock")
    src = Path(ctlsock.__file__).read_text(encoding="utf-8")
    assert "/run/modbridge" in src  # client_paths looks there without $RUNTIME_DIRECTORY


def test_unit_execstart_is_a_modbridge_run_command_line(unit):
    from modbridge.cli.main import main

    argv = shlex.split(_one(unit, "ExecStart"))
    assert Path(argv[0]).name == "modbridge" and argv[1] == "run"
    cmd = main.commands["run"]
    ctx = cmd.make_context("run", argv[2:])  # click raises on an unknown option
    assert ctx.params["config_path"] == "/etc/modbridge/modbridge.toml"
    assert _one(unit, "KillSignal") == "SIGTERM"  # modbridge restores limits on it


def test_no_logrotate_file_while_the_event_log_rotates_itself():
    from modbridge.exporter import eventlog

    assert eventlog.DEFAULT_MAX_BYTES > 0 and eventlog.DEFAULT_BACKUP_COUNT > 0
    assert not (ROOT / "packaging" / "logrotate").exists()


def _verifiable_copy(tmp_path, text: str) -> Path:
    exe = tmp_path / "modbridge"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    unit = tmp_path / "modbridge.service"
    unit.write_text(text.replace("/usr/local/bin/modbridge", str(exe)))
    return unit


def _analyze(*args):
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify(tmp_path):
    res = _analyze("verify", str(_verifiable_copy(tmp_path, UNIT.read_text())))
    assert res.returncode == 0 and "modbridge.service" not in res.stderr, res.stderr
    # and verify does catch a mistake in this unit (the check is not vacuous)
    bad = UNIT.read_text().replace("Restart=always", "Restart=sometimes")
    res = _analyze("verify", str(_verifiable_copy(tmp_path, bad)))
    assert "modbridge.service" in res.stderr and "sometimes" in res.stderr, res.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_security_offline(tmp_path):
    res = _analyze("security", "--offline=yes", str(_verifiable_copy(tmp_path, UNIT.read_text())))
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", res.stdout)
    if res.returncode != 0 and m is None:
        pytest.skip(f"systemd-analyze security --offline does not run here: {res.stderr[:200]}")
    assert m, res.stdout[-500:]
    # 10 is an unhardened root service (the old examples/modbridge.service scored 8.9 on
    # systemd 252); this unit scored 2.4 there. "OK" is below 5.
    assert float(m.group(1)) < 5.0, res.stdout[-2000:]
