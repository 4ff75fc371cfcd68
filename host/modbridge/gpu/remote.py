"""The ``sim-remote`` backend: the virtual GPUs of a ``modbridge sim`` in another process.

``modbridge sim`` serves its worlds' GPUs on ``gpu.sock`` beside its ports' symlinks
(:mod:`modbridge.sim.gpuserver`); this backend talks to it, so a bridge started apart
(``modbridge run --port <dir>/module-0.tty --backend sim-remote``) cools virtual GPUs
on a machine without one. The socket is ``--gpu-socket`` (``MODBRIDGE_SIM_GPU_SOCKET``)
or, without it, found beside the ports given (:func:`find_socket`: the directory of
each ``--port`` as given, before the symlink is followed, then after).

Every call is one connection, one JSON line each way; the simulator's errors come
back as the same :class:`~modbridge.gpu.base.GpuError` classes the in-process virtual
backend raises. A simulator that stopped reads as :class:`GpuLost` (its GPUs are gone).
:meth:`SimRemoteBackend.mappings` is the pairing the simulator publishes: module i
(its port symlink and unique id) cools GPU i.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from modbridge.gpu.base import (
    ClocksRefused,
    ClockState,
    GpuBackend,
    GpuDriverNotLoaded,
    GpuError,
    GpuInfo,
    GpuLost,
    GpuNoPermission,
    GpuNotFound,
    GpuSample,
    PowerLimitRefused,
)
from modbridge.link.requests import timeout_scale

SOCKET_NAME = "gpu.sock"  # modbridge.sim.gpuserver.SOCKET_NAME (not imported: no sim here)
ENV = "MODBRIDGE_SIM_GPU_SOCKET"
# a simulator's answer; times $MODBRIDGE_TIMEOUT_SCALE (a simulator on a loaded machine)
TIMEOUT_S = 5.0 * timeout_scale()
MAX_REPLY = 1 << 20
_ERRORS = {cls.__name__: cls for cls in (GpuError, GpuNotFound, GpuLost, GpuNoPermission,
                                         GpuDriverNotLoaded)}  # fmt: skip
_ERRORS["forbidden"] = GpuNoPermission  # the socket's peer check
_SAMPLE_FIELDS = {f for f in GpuSample.__dataclass_fields__ if f != "timestamp"}
HOW = (
    "start `modbridge sim` first and give its port symlink (`--port <dir>/module-0.tty`, "
    "as the sim's module line prints it) or --gpu-socket <dir>/gpu.sock"
)


def find_socket(ports, environ=None) -> Path | None:
    """The simulator's socket for ``ports``: ``$MODBRIDGE_SIM_GPU_SOCKET``, else
    ``gpu.sock`` in the directory of the first port that has one (the path as given,
    then with its symlink followed); None if none has."""
    env = (os.environ if environ is None else environ).get(ENV)
    if env:
        return Path(env)
    for port in ports:
        for d in (Path(port).parent, Path(os.path.realpath(port)).parent):
            cand = d / SOCKET_NAME
            if cand.exists():
                return cand
    return None


class SimRemoteBackend(GpuBackend):
    """The GPUs a ``modbridge sim`` serves at ``path``. Raises GpuError (naming what
    to do) when nothing answers there."""

    name = "sim-remote"
    simulated = True

    def __init__(self, path, timeout_s: float = TIMEOUT_S, clock=time.monotonic):
        if path is None:
            raise GpuDriverNotLoaded(f"--backend sim-remote: no simulator's gpu.sock found: {HOW}")
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._clock = clock
        try:
            hello = self._call({"op": "hello"})
        except GpuLost as e:
            raise GpuDriverNotLoaded(f"{e}: {HOW}") from None
        if not hello.get("simulated"):
            raise GpuError(f"{self.path}: not a modbridge sim's GPU socket")
        self.sim_pid = hello.get("pid")
        self.speed = float(hello.get("speed") or 0.0)  # world s per wall s; 0: flat out
        self.keys_dir = hello.get("keys_dir")  # the modules' host keys
        self.published = [g for g in hello.get("gpus", []) if isinstance(g, dict)]
        self._infos = [
            GpuInfo(int(g["index"]), str(g["uuid"]), str(g["name"]), str(g["pci_bus_id"]))
            for g in self.published
        ]

    # ------------------------------------------------------------------ wire

    def _call(self, req: dict) -> dict:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        buf = bytearray()
        try:
            sock.connect(str(self.path))
            sock.sendall((json.dumps(req, separators=(",", ":")) + "\n").encode())
            while b"\n" not in buf and len(buf) <= MAX_REPLY:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except (FileNotFoundError, ConnectionRefusedError):
            raise GpuLost(f"{self.path}: no simulator answers (modbridge sim stopped?)") from None
        except PermissionError:
            raise GpuNoPermission(f"{self.path}: permission denied: the simulator's GPU "
                                  "socket is for its own user") from None  # fmt: skip
        except OSError as e:  # a timeout too
            raise GpuLost(f"{self.path}: the simulator did not answer: {e}") from None
        finally:
            sock.close()
        try:
            reply = json.loads(bytes(buf).decode("utf-8"))
        except ValueError:
            raise GpuLost(f"{self.path}: no reply from the simulator") from None
        if not isinstance(reply, dict):
            raise GpuError(f"{self.path}: not a modbridge sim's GPU socket")
        if not reply.get("ok"):
            raise _error(reply)
        return reply

    # ------------------------------------------------------------------ GpuBackend

    def devices(self) -> list[GpuInfo]:
        return list(self._infos)

    def owner_key(self, uuid: str) -> str:
        """The GPU lives in one simulator process: its socket and pid tell it apart."""
        return f"{uuid}.sim-remote-{os.path.realpath(self.path)}-{self.sim_pid}"

    def mappings(self, ports=None) -> list[dict]:
        """The pairs the simulator publishes, ``{"port", "module_id", "gpu"}`` each:
        those of ``ports`` (matched with symlinks followed), so only their GPUs are
        the bridge's; when none matches (or ``ports`` is None), every pair by the
        module's unique id alone (``port`` None)."""
        rows = [{"port": g.get("port"), "module_id": g["module_id"], "gpu": g["uuid"]}
                for g in self.published]  # fmt: skip
        wanted = {str(p) for p in ports or ()} | {os.path.realpath(p) for p in ports or ()}
        mine = [r for r in rows if r["port"] and (r["port"] in wanted
                                                  or os.path.realpath(r["port"]) in wanted)]
        return mine or [{**r, "port": None} for r in rows]

    def _sample(self, d: dict) -> GpuSample:
        return GpuSample(**{k: v for k, v in d.items() if k in _SAMPLE_FIELDS},
                         timestamp=self._clock())  # fmt: skip

    def sample(self, uuid: str) -> GpuSample:
        return self._sample(self._call({"op": "sample", "uuid": uuid})["sample"])

    def sample_all(self) -> list[GpuSample]:
        try:
            rows = self._call({"op": "sample_all"})["samples"]
        except GpuError as e:  # the simulator is gone: every GPU with it
            return [GpuSample(uuid=i.uuid, name=i.name, pci_bus_id=i.pci_bus_id,
                              timestamp=self._clock(), state=e.state, error=str(e))
                    for i in self._infos]  # fmt: skip
        return [self._sample(d) for d in rows]

    def set_power_limit_w(self, uuid: str, watts: float) -> float:
        return float(self._call({"op": "set_power_limit", "uuid": uuid,
                                 "watts": float(watts)})["enforced_w"])  # fmt: skip

    def _clocks(self, req: dict) -> ClockState:
        c = self._call(req)["clocks"]
        return ClockState(max_mhz=c["max_mhz"], supported_mhz=tuple(c["supported_mhz"]),
                          current_mhz=c.get("current_mhz"),
                          locked=None if c.get("locked") is None else tuple(c["locked"]),
                          lock_known=c.get("lock_known", True))  # fmt: skip

    def clock_state(self, uuid: str) -> ClockState:
        return self._clocks({"op": "clock_state", "uuid": uuid})

    def set_locked_clocks_mhz(self, uuid: str, min_mhz: int, max_mhz: int) -> ClockState:
        return self._clocks({"op": "lock_clocks", "uuid": uuid, "min_mhz": int(min_mhz),
                             "max_mhz": int(max_mhz)})  # fmt: skip

    def reset_locked_clocks(self, uuid: str) -> ClockState:
        return self._clocks({"op": "reset_clocks", "uuid": uuid})


def _error(reply: dict) -> GpuError:
    """The GpuError a failed reply names, with its fields."""
    name, msg = reply.get("error"), str(reply.get("message", "the simulator refused"))
    if name == "PowerLimitRefused":
        return PowerLimitRefused(msg, requested_w=reply.get("requested_w"),
                                 enforced_w=reply.get("enforced_w"),
                                 not_supported=bool(reply.get("not_supported")))  # fmt: skip
    if name == "ClocksRefused":
        return ClocksRefused(msg, requested_mhz=reply.get("requested_mhz"),
                             not_supported=bool(reply.get("not_supported")))  # fmt: skip
    return _ERRORS.get(name, GpuError)(msg)
