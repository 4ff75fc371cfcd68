"""Port discovery: explicit --port values plus CH340 adapters by VID:PID, deduped."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from serial.tools.list_ports_common import ListPortInfo

from modbridge.link.discovery import CH340, PortInfo, find_modules


def ch340(device, location="1-1.2:1.0"):
    """What pyserial's lister reports for a CH340 on Linux (no serial number)."""
    p = ListPortInfo(str(device), skip_link_detection=True)
    p.vid, p.pid = CH340
    p.serial_number = None
    p.location = location
    p.product = "USB Serial"
    p.apply_usb_info()  # what the Linux lister does: fills hwid and description
    return p


def other(device, vid=0x0403, pid=0x6001, serial="A50285BI"):
    p = ListPortInfo(str(device), skip_link_detection=True)
    p.vid, p.pid, p.serial_number = vid, pid, serial
    p.description = "FT232R USB UART"
    return p


def lister(*ports):
    return lambda: list(ports)


def fake_devices(tmp_path, *names):
    """Files standing in for /dev nodes, so paths exist and resolve."""
    out = []
    for n in names:
        p = tmp_path / n
        p.write_text("")
        out.append(p)
    return out


def test_auto_discovers_ch340_only_in_natural_order(tmp_path):
    usb10, usb2, ftdi, acm = fake_devices(tmp_path, "ttyUSB10", "ttyUSB2", "ttyUSB0", "ttyACM0")
    plain = ListPortInfo(str(tmp_path / "ttyS0"), skip_link_detection=True)  # no USB at all
    found = find_modules(
        lister=lister(
            ch340(usb10), other(ftdi), ch340(usb2), plain, other(acm, 0xF055, 0x9800, "306A")
        )
    )
    assert [p.device for p in found] == [str(usb2), str(usb10)]
    p = found[0]
    assert p.source == "auto" and p.exists
    assert p.vid == 0x1A86 and p.pid == 0x7523 and p.usb_id == "1a86:7523"
    assert p.serial_number is None  # CH340s have none: the module uid identifies it
    assert p.description == "USB Serial" and p.location == "1-1.2:1.0"
    assert "VID:PID=1A86:7523" in p.hwid


def test_matches_by_hwid_when_ids_are_missing(tmp_path):
    (dev,) = fake_devices(tmp_path, "ttyUSB0")
    p = SimpleNamespace(
        device=str(dev), hwid="USB VID:PID=1a86:7523 LOCATION=3-2", description="USB2.0-Serial"
    )
    found = find_modules(lister=lister(p))
    assert len(found) == 1 and found[0].usb_id == "1a86:7523"
    assert found[0].serial_number is None and found[0].location is None


def test_explicit_ports_first_as_given_and_deduped(tmp_path):
    usb0, usb1 = fake_devices(tmp_path, "ttyUSB0", "ttyUSB1")
    link = tmp_path / "gpu-module-0"
    os.symlink(usb1, link)
    missing = tmp_path / "not-plugged"
    found = find_modules(
        ports=[str(link), str(missing), str(usb1), str(link)],
        lister=lister(ch340(usb0), ch340(usb1)),
    )
    # the symlink is kept as given; its target (given again, and auto-found) is not repeated
    assert [p.device for p in found] == [str(link), str(missing), str(usb0)]
    given, absent, auto = found
    assert given.source == "explicit" and given.resolved == str(usb1)
    assert given.usb_id == "1a86:7523" and given.description == "USB Serial"  # from lister
    assert absent.source == "explicit" and not absent.exists and absent.usb_id is None
    assert auto.source == "auto"
    assert "NOT PRESENT" in absent.describe()
    assert given.describe() == (f"{link} -> {usb1} USB Serial [1a86:7523] at 1-1.2:1.0 (given)")


def test_auto_can_be_disabled_and_nothing_found_is_empty(tmp_path):
    (usb0,) = fake_devices(tmp_path, "ttyUSB0")
    assert find_modules(lister=lister()) == []
    assert find_modules(lister=lister(ch340(usb0)), auto=False) == []
    found = find_modules(ports=[usb0], lister=lister(ch340(usb0)), auto=False)
    assert [p.device for p in found] == [str(usb0)]


def test_stable_order_regardless_of_lister_order(tmp_path):
    devs = fake_devices(tmp_path, "ttyUSB3", "ttyUSB1", "ttyUSB2")
    a = find_modules(lister=lister(*[ch340(d) for d in devs]))
    b = find_modules(lister=lister(*[ch340(d) for d in reversed(devs)]))
    assert a == b
    assert [os.path.basename(p.device) for p in a] == ["ttyUSB1", "ttyUSB2", "ttyUSB3"]


def test_as_dict_is_json_ready(tmp_path):
    (usb0,) = fake_devices(tmp_path, "ttyUSB0")
    (p,) = find_modules(lister=lister(ch340(usb0)))
    d = json.loads(json.dumps(p.as_dict()))
    assert d["device"] == str(usb0) and d["usb_id"] == "1a86:7523"
    assert d["serial_number"] is None and d["source"] == "auto"
    assert isinstance(p, PortInfo)


def test_default_lister_is_pyserial():
    # the real lister runs (this machine has no CH340: nothing, or no crash)
    for p in find_modules():
        assert p.usb_id == "1a86:7523"
