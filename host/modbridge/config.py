"""The bridge's config file (TOML): ports, module -> GPU mapping, policy, exporter.

Example (``docs/bridge.md`` has every key)::

    [bridge]
    heartbeat_period_s = 1.0
    backend = "auto"            # auto | nvml | nvidia-smi | sim | sim-remote
    on_exit = "restore"         # restore | keep
    dry_run = false
    event_log = "/var/log/modbridge/events.jsonl"
    state_dir = "/var/lib/modbridge"       # journal of original limits, GPU locks
    keys_dir = "/var/lib/modbridge/keys"   # the modules' signing keys (docs/pairing.md)
    actuator = "power"          # power | clocks | both (per module: [[module]] actuator)
    fallback = true             # the other actuator stands in when one is refused

    [clocks]                    # the clocks actuator: level -> fraction of the max clock
    warn_fraction = 0.8
    critical_fraction = 0.5

    [exporter]
    address = "127.0.0.1"
    port = 9659

    [policy]
    warn_limit_fraction = 0.7

    [[module]]
    id = "300041000b51333539383137"      # the MCU unique id from `modbridge list`
    gpu = "GPU-5e1f0c2a-7b3d-4c8e-9a61-2d0f4b8e7c13"   # UUID or PCI bus id
    port = "/dev/gpu_moduler"            # optional

With one module and one GPU and no ``[[module]]`` table, the mapping is automatic.
:func:`load` reports every problem with its exact place (``module[1].gpu: ...``);
``modbridge config validate`` prints them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from modbridge.errors import ModbridgeError
from modbridge.policy.engine import PolicyConfig, PolicyConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_PATHS = (Path("/etc/modbridge/modbridge.toml"), Path("~/.config/modbridge.toml"))
BACKENDS = ("auto", "nvml", "nvidia-smi", "sim", "sim-remote")
ON_EXIT = ("restore", "keep")
ACTUATORS = ("power", "clocks", "both")  # modbridge.actuator.ACTUATORS
_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_BUS_ID = re.compile(r"^([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_MODULE_ID = re.compile(r"^[0-9a-f]{2,64}$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")


class ConfigFileError(ModbridgeError):
    """The config file is missing, unreadable or invalid; ``problems`` lists each."""

    exit_code = 2

    def __init__(self, path, problems: list[str]):
        self.path = str(path)
        self.problems = problems
        lines = "; ".join(problems)
        super().__init__(f"{path}: {lines}")


@dataclass
class ModuleMapping:
    module_id: str | None  # None: match whatever module is on ``port``
    gpu: str | None  # UUID or PCI bus id; None: the only GPU
    port: str | None = None
    actuator: str | None = None  # None: [bridge] actuator
    name: str | None = None  # what `modbridge set <name> ...` calls it (docs/control.md)


@dataclass
class BridgeConfig:
    heartbeat_period_s: float = 1.0
    tick_s: float = 0.5
    backend: str = "auto"
    on_exit: str = "restore"
    dry_run: bool = False
    event_log: str | None = None
    keys_dir: str | None = None  # None: modbridge.link.keys.default_dir()
    # the journal of original power limits and the GPU locks; None: the default
    # (modbridge.actuator.journal.default_state_dir: $STATE_DIRECTORY, else /var/lib/modbridge)
    state_dir: str | None = None
    # the control socket (docs/control.md); None: $RUNTIME_DIRECTORY, else the state dir
    control_socket: str | None = None
    control_group: str | None = None  # its group: members may control modules
    exporter_address: str = "127.0.0.1"
    exporter_port: int = 9659
    exporter_enabled: bool = True
    modules: list[ModuleMapping] = field(default_factory=list)
    # which actuator each GPU uses (a [[module]] actuator overrides it for its GPU), and
    # whether the other stands in when it is refused (docs/bridge.md, "Locked clocks")
    actuator: str = "power"
    fallback: bool = True
    clocks_warn_fraction: float = 0.8
    clocks_critical_fraction: float = 0.5
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    path: str | None = None

    def ports(self) -> list[str]:
        return [m.port for m in self.modules if m.port]

    def actuator_for(self, uuid: str, pci_bus_id: str) -> str:
        """The actuator of one GPU: its module mapping's, else ``[bridge] actuator``."""
        for m in self.modules:
            if m.actuator and m.gpu and match_gpu(m.gpu, uuid, pci_bus_id):
                return m.actuator
        return self.actuator


_SECTIONS = {
    "bridge": {
        "heartbeat_period_s": (float, 0.1, 60.0),
        "tick_s": (float, 0.05, 10.0),
        "backend": (BACKENDS,),
        "on_exit": (ON_EXIT,),
        "dry_run": (bool,),
        "event_log": (str,),
        "keys_dir": (str,),
        "state_dir": (str,),
        "actuator": (ACTUATORS,),
        "fallback": (bool,),
        "control_socket": (str,),
        "control_group": (str,),
    },
    "clocks": {
        "warn_fraction": (float, 0.05, 0.99),
        "critical_fraction": (float, 0.05, 0.99),
    },
    "exporter": {
        "address": (str,),
        "port": (int, 0, 65535),
        "enabled": (bool,),
    },
}


def _check(section: str, key: str, value, spec, problems: list[str]):
    where = f"{section}.{key}"
    kind = spec[0]
    if isinstance(kind, tuple):
        if value not in kind:
            problems.append(f"{where}: must be one of {', '.join(kind)}, got {value!r}")
        return
    if kind is bool:
        if not isinstance(value, bool):
            problems.append(f"{where}: must be true or false, got {value!r}")
        return
    if kind is str:
        if not isinstance(value, str) or not value:
            problems.append(f"{where}: must be non-empty text, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{where}: must be a number, got {value!r}")
        return
    if kind is int and not isinstance(value, int):
        problems.append(f"{where}: must be an integer, got {value!r}")
        return
    lo, hi = spec[1], spec[2]
    if not lo <= value <= hi:
        problems.append(f"{where}: must be within {lo}..{hi}, got {value!r}")


def parse(data: dict, path: str = "<config>") -> BridgeConfig:
    """Validate a parsed TOML document; raise ConfigFileError listing every problem."""
    problems: list[str] = []
    cfg = BridgeConfig(path=path)
    known = {"bridge", "exporter", "clocks", "policy", "module"}
    for key in data:
        if key not in known:
            problems.append(f"{key}: unknown section (sections are {', '.join(sorted(known))})")
    for section, specs in _SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            problems.append(f"{section}: must be a table ([{section}])")
            continue
        for key, value in table.items():
            if key not in specs:
                problems.append(f"{section}.{key}: unknown key (keys are {', '.join(specs)})")
                continue
            before = len(problems)
            _check(section, key, value, specs[key], problems)
            if len(problems) == before:
                attr = key if section == "bridge" else f"{section}_{key}"
                setattr(cfg, attr, float(value) if specs[key][0] is float else value)
    if cfg.clocks_critical_fraction > cfg.clocks_warn_fraction:
        problems.append(
            f"clocks.critical_fraction: must not be above warn_fraction "
            f"({cfg.clocks_critical_fraction} > {cfg.clocks_warn_fraction})"
        )
    try:
        cfg.policy = PolicyConfig.from_dict(data.get("policy"))
    except PolicyConfigError as e:
        problems += e.problems
    modules = data.get("module", [])
    if not isinstance(modules, list):
        problems.append("module: must be an array of tables ([[module]])")
        modules = []
    seen_ids: dict[str, int] = {}
    seen_gpus: dict[str, int] = {}
    seen_names: dict[str, int] = {}
    for i, m in enumerate(modules):
        where = f"module[{i}]"
        if not isinstance(m, dict):
            problems.append(f"{where}: must be a table")
            continue
        for key in m:
            if key not in ("id", "gpu", "port", "actuator", "name"):
                problems.append(f"{where}.{key}: unknown key (keys are id, gpu, port, "
                                "actuator, name)")  # fmt: skip
        mid = m.get("id")
        gpu = m.get("gpu")
        port = m.get("port")
        if mid is not None:
            if not isinstance(mid, str) or not _MODULE_ID.match(mid):
                problems.append(
                    f"{where}.id: must be the module's unique id in lowercase hex (as shown "
                    f"by `modbridge list`), got {mid!r}"
                )
            elif mid in seen_ids:
                problems.append(f"{where}.id: {mid} is already mapped in module[{seen_ids[mid]}]")
            else:
                seen_ids[mid] = i
        if gpu is not None:
            if not isinstance(gpu, str) or not (_UUID.match(gpu) or _BUS_ID.match(gpu)):
                problems.append(
                    f"{where}.gpu: must be a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) "
                    f"or a PCI bus id (00000000:00:06.0), got {gpu!r}"
                )
            elif gpu.lower() in seen_gpus:
                problems.append(
                    f"{where}.gpu: {gpu} is already mapped in module[{seen_gpus[gpu.lower()]}]"
                )
            else:
                seen_gpus[gpu.lower()] = i
        if port is not None and (not isinstance(port, str) or not port):
            problems.append(f"{where}.port: must be a device path, got {port!r}")
        if mid is None and port is None:
            problems.append(f"{where}: needs an id or a port to know which module it is")
        actuator = m.get("actuator")
        if actuator is not None and actuator not in ACTUATORS:
            problems.append(f"{where}.actuator: must be one of {', '.join(ACTUATORS)}, "
                            f"got {actuator!r}")  # fmt: skip
            actuator = None
        if actuator is not None and gpu is None:
            problems.append(f"{where}.actuator: needs the module's gpu (the actuator acts "
                            "on a GPU; [bridge] actuator sets it for every GPU)")  # fmt: skip
        name = m.get("name")
        if name is not None:
            if not isinstance(name, str) or not _NAME.match(name):
                problems.append(f"{where}.name: letters, digits, '_', '-', '.', starting with a "
                                f"letter, at most 32, got {name!r}")  # fmt: skip
                name = None
            elif name in seen_names:
                problems.append(f"{where}.name: {name} is already used by "
                                f"module[{seen_names[name]}]")  # fmt: skip
            else:
                seen_names[name] = i
        cfg.modules.append(ModuleMapping(mid, gpu, port, actuator, name))
    if problems:
        raise ConfigFileError(path, problems)
    return cfg


def load(path: str | Path) -> BridgeConfig:
    """Read and validate a config file."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(p, ["no such file"]) from None
    except PermissionError:
        raise ConfigFileError(p, ["permission denied: run as a user that can read it"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigFileError(p, [f"cannot read: {e}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(p, [f"not valid TOML: {e}"]) from None
    return parse(data, str(p))


def find_default() -> Path | None:
    for p in DEFAULT_PATHS:
        p = p.expanduser()
        if p.exists():
            return p
    return None


def load_given_or_default(path: str | Path | None) -> BridgeConfig | None:
    """The config at ``path``, else the first default file that exists, else None (no
    file: the caller's defaults). Raises :class:`ConfigFileError` like :func:`load`."""
    found = path if path is not None else find_default()
    return load(found) if found is not None else None


def match_gpu(spec: str, uuid: str, pci_bus_id: str) -> bool:
    """Does a mapping's ``gpu`` (UUID or PCI bus id, any domain width) name this GPU?"""
    s = spec.lower()
    if s.startswith("gpu-"):
        return s == uuid.lower()
    return _norm_bus(s) == _norm_bus(pci_bus_id.lower())


def _norm_bus(b: str) -> str:
    parts = b.split(":")
    if len(parts) == 3:
        return f"{int(parts[0], 16):08x}:{parts[1]}:{parts[2]}"
    return f"00000000:{b}"
