"""Finding module ports: the ones given with ``--port`` plus CH340 adapters by USB id.

CH340 adapters (VID:PID ``1a86:7523``) have no serial number, so a port says nothing
about which module is behind it: the module's own unique id, read by the link's
handshake, is what identifies it. Ports given explicitly (paths or udev symlinks) are
kept as given, first and in the order given; auto-discovered ones follow in natural
order (``ttyUSB2`` before ``ttyUSB10``). A port reached both ways (a symlink given
with ``--port`` and the device it points to) is listed once, as given.

Native-USB boards (pyboard, Pico: USB CDC-ACM with MicroPython's own ids) are not
picked up automatically, since their port is also the REPL that ``mpremote`` uses:
give them with ``--port``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

CH340 = (0x1A86, 0x7523)
MODULE_USB_IDS: tuple[tuple[int, int], ...] = (CH340,)

_HWID_RE = re.compile(r"VID:PID=([0-9A-Fa-f]{4}):([0-9A-Fa-f]{4})")


@dataclass(frozen=True)
class PortInfo:
    """One candidate module port."""

    device: str  # path to open, as given or as listed
    resolved: str  # the device after following symlinks (dedupe key)
    source: str  # "explicit" (--port) or "auto" (matched by USB id)
    exists: bool
    description: str = ""
    hwid: str = ""
    vid: int | None = None
    pid: int | None = None
    serial_number: str | None = None  # None for a CH340: it has none
    location: str | None = None

    @property
    def usb_id(self) -> str | None:
        if self.vid is None or self.pid is None:
            return None
        return f"{self.vid:04x}:{self.pid:04x}"

    def describe(self) -> str:
        """One line for ``modbridge list``."""
        parts = [self.device]
        if self.resolved != self.device:
            parts.append(f"-> {self.resolved}")
        if self.description and self.description != "n/a":
            parts.append(self.description)
        if self.usb_id:
            parts.append(f"[{self.usb_id}]")
        if self.location:
            parts.append(f"at {self.location}")
        parts.append("(given)" if self.source == "explicit" else "(auto)")
        if not self.exists:
            parts.append("NOT PRESENT")
        return " ".join(parts)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["usb_id"] = self.usb_id
        return d


def _default_lister():
    from serial.tools import list_ports

    return list_ports.comports()


def _ids(p) -> tuple[int | None, int | None]:
    vid, pid = getattr(p, "vid", None), getattr(p, "pid", None)
    if vid is None or pid is None:
        m = _HWID_RE.search(getattr(p, "hwid", "") or "")
        if m:
            vid, pid = int(m.group(1), 16), int(m.group(2), 16)
    return vid, pid


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _resolve(path: str) -> str:
    return os.path.realpath(path)


def _info(p, device: str, source: str) -> PortInfo:
    vid, pid = _ids(p) if p is not None else (None, None)
    return PortInfo(
        device=device,
        resolved=_resolve(device),
        source=source,
        exists=os.path.exists(device),
        description=(getattr(p, "description", "") or "") if p is not None else "",
        hwid=(getattr(p, "hwid", "") or "") if p is not None else "",
        vid=vid,
        pid=pid,
        serial_number=getattr(p, "serial_number", None) if p is not None else None,
        location=getattr(p, "location", None) if p is not None else None,
    )


def find_modules(
    ports: Iterable[str] | None = None,
    lister: Callable[[], Iterable] | None = None,
    usb_ids: Iterable[tuple[int, int]] = MODULE_USB_IDS,
    auto: bool = True,
) -> list[PortInfo]:
    """Ports to serve: ``ports`` (``--port`` values, kept as given) then, with
    ``auto``, every port the ``lister`` (``serial.tools.list_ports.comports``) shows
    with a module USB id. Deduplicated by resolved path; stable order."""
    listed = list((lister or _default_lister)())
    by_resolved = {}
    for p in listed:
        dev = getattr(p, "device", None)
        if dev:
            by_resolved.setdefault(_resolve(dev), p)
    wanted = {tuple(i) for i in usb_ids}
    out: list[PortInfo] = []
    seen: set[str] = set()
    for dev in ports or ():
        dev = os.fspath(dev)
        info = _info(by_resolved.get(_resolve(dev)), dev, "explicit")
        if info.resolved not in seen:
            seen.add(info.resolved)
            out.append(info)
    if auto:
        matches = [p for p in listed if getattr(p, "device", None) and _ids(p) in wanted]
        for p in sorted(matches, key=lambda p: _natural(p.device)):
            info = _info(p, p.device, "auto")
            if info.resolved not in seen:
                seen.add(info.resolved)
                out.append(info)
    return out
