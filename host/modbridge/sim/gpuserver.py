"""The virtual GPUs of ``modbridge sim``, published for a bridge in another process.

``modbridge sim`` runs its worlds in its own process; ``modbridge run --port
<module-i.tty> --backend sim-remote`` runs in another. This serves the fleet's GPUs on
a Unix socket, ``gpu.sock`` beside the modules' port symlinks (mode 0600; only root and
this user may connect: the control socket's server, :class:`~modbridge.ops.ctlsock.ControlServer`),
through the same :class:`~modbridge.gpu.virtual.VirtualBackend` that ``run --sim`` uses
in-process: a power limit written over the socket changes the world's heat input
exactly as in-process, is clamped-or-refused like NVML's (a limit outside the
constraints: ``PowerLimitRefused``; ``gpu_lost``: ``GpuLost`` on every call) and is
read back. The client is :class:`modbridge.gpu.remote.SimRemoteBackend`.

Protocol: one JSON object per connection, one line each way::

    {"op": "hello"}
    -> {"ok": true, "simulated": true, "pid": 4242, "speed": 1.0, "keys_dir": "<dir>",
        "gpus": [{"index": 0,
        "uuid": "GPU-...", "name": "...", "pci_bus_id": "...", "module": 0,
        "module_id": "<the module's unique id, as its hello says>",
        "port": "<dir>/module-0.tty"}]}

``keys_dir`` is where the modules' host keys are: the bridge looks there too
(:func:`modbridge.link.keys.attach_dir`), so it signs without ``MODBRIDGE_KEYS_DIR``.
    {"op": "sample_all"}                              -> {"ok": true, "samples": [{...}]}
    {"op": "sample", "uuid": U}                       -> {"ok": true, "sample": {...}}
    {"op": "set_power_limit", "uuid": U, "watts": W}  -> {"ok": true, "enforced_w": W2}
    {"op": "clock_state", "uuid": U}                  -> {"ok": true, "clocks": {...}}
    {"op": "lock_clocks", "uuid": U, "min_mhz": A, "max_mhz": B} -> the same
    {"op": "reset_clocks", "uuid": U}                 -> the same
    -> {"ok": false, "error": "<GpuError class>", "message": "...", ...its fields}

Samples are :class:`~modbridge.gpu.base.GpuSample` fields (no ``timestamp``: the
client stamps its own clock; ``extra`` only when set).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from modbridge.gpu import base
from modbridge.gpu.virtual import VirtualBackend

log = logging.getLogger(__name__)

SOCKET_NAME = "gpu.sock"
#: The GpuError classes a reply may name (the client raises the same class).
ERRORS = {
    cls.__name__: cls
    for cls in (base.GpuError, base.GpuNotFound, base.GpuLost, base.GpuNoPermission,
                base.GpuDriverNotLoaded, base.PowerLimitRefused, base.ClocksRefused)
}  # fmt: skip


def socket_path(state_dir) -> Path:
    """Where the fleet in ``state_dir`` serves its GPUs (beside ``module-<i>.tty``)."""
    return Path(state_dir) / SOCKET_NAME


def sample_dict(s: base.GpuSample) -> dict:
    d = dataclasses.asdict(s)
    d.pop("timestamp", None)
    if not d.get("extra"):
        d.pop("extra", None)
    return d


def clocks_dict(c: base.ClockState) -> dict:
    return dataclasses.asdict(c)


def error_dict(e: base.GpuError) -> dict:
    out = {"ok": False, "error": type(e).__name__ if type(e).__name__ in ERRORS else "GpuError",
           "message": str(e)}  # fmt: skip
    for name in ("requested_w", "enforced_w", "requested_mhz", "not_supported"):
        if hasattr(e, name):
            out[name] = getattr(e, name)
    return out


class GpuHandler:
    """``handler(request) -> reply`` over the fleet's GPUs (module i: GPU i)."""

    def __init__(self, fleet, pid: int):
        self.backend = VirtualBackend(fleet.gpus)
        self.pid = pid
        self.speed = fleet.speed
        self.keys_dir = str(fleet.keys.dir)
        self.gpus = [
            {**dataclasses.asdict(info), "module": i, "module_id": vm.uid.hex(),
             "port": str(vm.port_symlink)}
            for i, (info, vm) in enumerate(zip(self.backend.devices(), fleet.modules,
                                               strict=True))
        ]  # fmt: skip

    def __call__(self, req: dict) -> dict:
        op = req.get("op")
        b = self.backend
        try:
            if op == "hello":
                return {"ok": True, "simulated": True, "pid": self.pid, "speed": self.speed,
                        "keys_dir": self.keys_dir, "gpus": self.gpus}  # fmt: skip
            if op == "sample_all":
                return {"ok": True, "samples": [sample_dict(s) for s in b.sample_all()]}
            uuid = req.get("uuid")
            if not isinstance(uuid, str):
                return {"ok": False, "error": "GpuNotFound", "message": "no uuid given"}
            if op == "sample":
                return {"ok": True, "sample": sample_dict(b.sample(uuid))}
            if op == "set_power_limit":
                watts = req.get("watts")
                if isinstance(watts, bool) or not isinstance(watts, (int, float)):
                    return {"ok": False, "error": "PowerLimitRefused",
                            "message": f"not a number of watts: {watts!r}"}  # fmt: skip
                return {"ok": True, "enforced_w": b.set_power_limit_w(uuid, float(watts))}
            if op == "clock_state":
                return {"ok": True, "clocks": clocks_dict(b.clock_state(uuid))}
            if op == "lock_clocks":
                lo, hi = int(req["min_mhz"]), int(req["max_mhz"])
                return {"ok": True, "clocks": clocks_dict(b.set_locked_clocks_mhz(uuid, lo, hi))}
            if op == "reset_clocks":
                return {"ok": True, "clocks": clocks_dict(b.reset_locked_clocks(uuid))}
        except base.GpuError as e:
            return error_dict(e)
        except (KeyError, TypeError, ValueError) as e:
            return {"ok": False, "error": "malformed", "message": f"bad {op} request: {e}"}
        return {"ok": False, "error": "unknown_op", "message": f"no op {op!r}"}


def serve(fleet, path=None):
    """Start serving ``fleet``'s GPUs at ``path`` (default: ``gpu.sock`` in its state
    directory), mode 0600. Returns the server (``.path``; ``.stop()``). Raises
    :class:`~modbridge.ops.ctlsock.SocketError` (busy, too long a path, unsafe dir)."""
    import os

    from modbridge.fsutil import chmod_chown_nofollow
    from modbridge.ops.ctlsock import ControlServer

    server = ControlServer(GpuHandler(fleet, os.getpid()),
                           path or socket_path(fleet.state_dir))  # fmt: skip
    server.start()
    try:
        chmod_chown_nofollow(server.path, 0o600)  # only this user (and root)
    except OSError:
        server.stop()
        raise
    log.info("virtual GPUs served on %s", server.path)
    return server
