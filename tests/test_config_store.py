"""device/config.py storage: flash wear (unchanged saves write nothing, a lifetime
write count), the A/B last-good pair, boot candidates, power cuts at every step.

Runs under CPython and the real MicroPython (DUAL). Under MicroPython the same saves
also run on a real littlefs (``os.VfsLfs2`` on a RAM block device), cut at every
block write.
"""

import json
import os

from mpcompat import IS_MICROPYTHON, exists, raises, read_bytes, tmpdir, write_bytes

from device import config
from device.cfg import files as fsfiles
from device.config import ConfigError
from protocol.crc import crc16

DUAL = True
MPY_TIMEOUT = 600


# --- helpers ------------------------------------------------------------------------


def listdir(d):
    return sorted(os.listdir(d))


def cfg_with(kp):
    cfg = config.defaults()
    cfg["pid"]["kp"] = kp
    return cfg


def kp_of(path):
    return config.decode_file(read_bytes(path))[0]["pid"]["kp"]


def writes_of(path):
    return json.loads(read_bytes(path))["writes"]


def old_envelope(cfg):
    """A file as the firmware wrote it before the write count existed."""
    body = config.canonical(cfg)
    return ('{"config":' + body + ',"crc":' + str(crc16(body.encode())) + ',"version":1}\n'
            ).encode()


def sources(cands):
    return [c[0] for c in cands]


class CountingFs:
    """An ``os`` stand-in that logs every call; ``fat``: rename refuses a target."""

    def __init__(self, fat=False, base=os):
        self.fat = fat
        self.base = base
        self.log = []

    def stat(self, path):
        return self.base.stat(path)

    def rename(self, src, dst):
        self.log.append(("rename", src, dst))
        if self.fat and exists(dst):
            raise OSError(17)
        self.base.rename(src, dst)

    def remove(self, path):
        self.log.append(("remove", path))
        self.base.remove(path)

    if hasattr(os, "fsync"):

        def fsync(self, fd):
            self.log.append(("fsync",))
            os.fsync(fd)


class OpenLog:
    """Wraps ``fsfiles.open_file`` (every file the config code opens) and logs the modes."""

    def __init__(self):
        self.log = []
        self.real = None

    def __enter__(self):
        self.real = fsfiles.open_file
        real = self.real

        def logged(path, mode):
            self.log.append((path, mode))
            return real(path, mode)

        fsfiles.open_file = logged
        return self

    def __exit__(self, *exc):
        fsfiles.open_file = self.real
        return False

    def writes(self):
        return [e for e in self.log if "r" not in e[1] or "+" in e[1]]


# --- 4. flash wear --------------------------------------------------------------------------


def test_unchanged_save_writes_nothing_1000_times():
    # Reproduction: every config_save rewrote the flash (tmp file + rename), even
    # when nothing had changed.
    for fat in (False, True):
        d = tmpdir()
        fs = CountingFs(fat)
        cfg = cfg_with(4321)
        assert config.save(cfg, d, fs=fs) is True
        before = read_bytes(d + "/config.json")
        st = os.stat(d + "/config.json")
        fs.log = []
        with OpenLog() as opened:
            for i in range(1000):
                # the same config as a fresh object, as the app holds it after a reboot
                same = config.load(d)[0] if i % 100 == 0 else cfg
                assert config.save(same, d, fs=fs) is False, i
        assert fs.log == [], fs.log[:5]  # no rename, no remove, no fsync
        assert opened.writes() == [], opened.writes()[:5]  # nothing opened to write
        assert len(opened.log) >= 1000  # it did read the stored file each time
        assert read_bytes(d + "/config.json") == before
        assert listdir(d) == ["config.json"]
        if not IS_MICROPYTHON:
            after = os.stat(d + "/config.json")
            assert (after.st_ino, after.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
        assert config.flash_writes(d) == 1


def test_a_changed_save_writes_once():
    d = tmpdir()
    fs = CountingFs()
    config.save(cfg_with(1), d, fs=fs)
    fs.log = []
    with OpenLog() as opened:
        assert config.save(cfg_with(2), d, fs=fs) is True
    assert opened.writes() == [(d + "/config.json.tmp", "wb")], opened.log
    renames = [e[1:] for e in fs.log if e[0] == "rename"]
    assert renames == [(d + "/config.json", d + "/config.prev.json"),
                       (d + "/config.json.tmp", d + "/config.json")], renames
    assert [e for e in fs.log if e[0] == "remove"] == []


def test_the_flashed_default_file_is_not_rewritten():
    # modbridge flash writes encode_file(defaults()); saving the defaults costs nothing
    d = tmpdir()
    write_bytes(d + "/config.json", config.encode_file(config.defaults()).encode())
    assert config.save(config.defaults(), d) is False
    assert config.flash_writes(d) == 0


def test_writes_counts_every_save():
    d = tmpdir()
    assert config.flash_writes(d) == 0
    for n in range(1, 8):
        assert config.save(cfg_with(1000 + n), d) is True
        assert config.save(cfg_with(1000 + n), d) is False  # not counted
        assert config.flash_writes(d) == n
        assert writes_of(d + "/config.json") == n
        if n > 1:
            assert writes_of(d + "/config.prev.json") == n - 1
        cands, writes, problems = config.candidates(d)
        assert writes == n and problems == []
        _, status, detail = config.load(d)
        assert status == "ok" and detail.endswith(f"; flash writes: {n}"), detail
    assert read_bytes(d + "/config.json") == config.encode_file(cfg_with(1007), 7).encode()


def test_a_file_without_a_write_count_is_zero_and_still_loads():
    d = tmpdir()
    write_bytes(d + "/config.json", old_envelope(cfg_with(555)))
    cfg, status, detail = config.load(d)
    assert status == "ok" and cfg["pid"]["kp"] == 555, detail
    assert config.flash_writes(d) == 0
    assert config.save(cfg_with(555), d) is False  # the same config: no rewrite for a count
    assert config.save(cfg_with(556), d) is True
    assert writes_of(d + "/config.json") == 1
    assert kp_of(d + "/config.prev.json") == 555  # the old file, kept byte for byte
    assert read_bytes(d + "/config.prev.json") == old_envelope(cfg_with(555))


def test_a_bad_write_count_is_corrupt():
    for bad in (b"-1", b'"3"', b"1.5", b"null", b"true"):
        d = tmpdir()
        data = config.encode_file(config.defaults(), 3).encode().replace(b'"writes":3',
                                                                     b'"writes":' + bad)
        write_bytes(d + "/config.json", data)
        _, status, detail = config.load(d)
        assert status == "corrupt" and "bad writes count" in detail, (bad, detail)


def test_a_reformatted_file_is_rewritten_canonically_once():
    d = tmpdir()
    cfg = cfg_with(4000)
    body = config.canonical(cfg)
    text = ('{\n  "version": 1, "writes": 4,\n  "crc": ' + str(crc16(body.encode()))
            + ',\n  "config": ' + body.replace(",", ", ") + "\n}\n")
    write_bytes(d + "/config.json", text.encode())
    assert config.load(d)[1] == "ok"
    assert config.save(cfg, d) is True  # not byte-identical: written canonically
    assert writes_of(d + "/config.json") == 5
    assert config.save(cfg, d) is False


# --- 5. A/B: the current config and the one before it -------------------------------------


def test_save_keeps_the_previous_config():
    d = tmpdir()
    config.save(cfg_with(1), d)
    assert listdir(d) == ["config.json"]
    config.save(cfg_with(2), d)
    assert (kp_of(d + "/config.json"), kp_of(d + "/config.prev.json")) == (2, 1)
    config.save(cfg_with(3), d)
    assert (kp_of(d + "/config.json"), kp_of(d + "/config.prev.json")) == (3, 2)
    assert listdir(d) == ["config.json", "config.prev.json"]


def test_candidates_order_and_details():
    d = tmpdir()
    cands, writes, problems = config.candidates(d)
    assert sources(cands) == ["factory"] and writes == 0 and problems == []
    assert cands[0][1] == config.defaults() and cands[0][2] == "factory defaults"
    config.save(cfg_with(1), d)
    cands, writes, problems = config.candidates(d)
    assert sources(cands) == ["current", "factory"] and writes == 1
    config.save(cfg_with(2), d)
    cands, writes, problems = config.candidates(d)
    assert sources(cands) == ["current", "prev", "factory"], cands
    assert [c[1]["pid"]["kp"] for c in cands] == [2, 1, 5000]
    assert cands[0][2] == "loaded config.json", cands[0][2]
    assert cands[1][2] == "config.prev.json, the config before the last save", cands[1][2]
    assert writes == 2 and problems == []
    # each candidate is a fresh object: the app may keep and change the one it uses
    cands[2][1]["pid"]["kp"] = 1
    assert config.defaults()["pid"]["kp"] == 5000


def boot(d, configure):
    """What the app does at boot: the first candidate that configures wins.

    Returns (source used, events) with events as (reason, value) pairs.
    """
    cands, writes, problems = config.candidates(d)
    events = [("config_corrupt", p) for p in problems]
    for source, cfg, _ in cands:
        try:
            configure(cfg)
        except ValueError:
            continue
        if source != "current" and (len(cands) > 1 or problems):
            events.append(("config_fallback", 1 if source == "prev" else 0))
        return source, events
    raise AssertionError("the factory defaults must configure")


def refuse_kp(kp):
    def configure(cfg):
        if cfg["pid"]["kp"] == kp:
            raise ValueError(f"this hardware does not like kp {kp}")

    return configure


def test_a_config_that_does_not_configure_falls_back_to_the_previous_one():
    d = tmpdir()
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)  # validates, but (say) fails on this board at boot
    assert boot(d, refuse_kp(2)) == ("prev", [("config_fallback", 1)])
    assert boot(d, refuse_kp(999)) == ("current", [])

    def refuse_both(cfg):
        if cfg["pid"]["kp"] in (1, 2):
            raise ValueError("no")

    assert boot(d, refuse_both) == ("factory", [("config_fallback", 0)])
    # first boot: nothing stored, factory is no fallback
    assert boot(tmpdir(), lambda cfg: None) == ("factory", [])


def test_corrupt_current_falls_back_to_prev_and_is_set_aside_once():
    d = tmpdir()
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)
    data = read_bytes(d + "/config.json").replace(b'"kp":2', b'"kp":3')
    write_bytes(d + "/config.json", data)
    cands, writes, problems = config.candidates(d)
    assert sources(cands) == ["prev", "factory"] and cands[0][1]["pid"]["kp"] == 1
    assert len(problems) == 1, problems
    assert problems[0].startswith("config.json: CRC mismatch"), problems
    assert problems[0].endswith("; kept as config.json.bad"), problems
    assert writes == 2  # the corrupt file still told its count
    assert read_bytes(d + "/config.json.bad") == data
    assert listdir(d) == ["config.json.bad", "config.prev.json"]
    # next boot: no second problem, still running the last good one
    cands, writes, problems = config.candidates(d)
    assert sources(cands) == ["prev", "factory"] and problems == [] and writes == 1
    cfg, status, detail = config.load(d)
    assert status == "prev" and cfg["pid"]["kp"] == 1, (status, detail)
    # saving makes it current again; prev stays the last good one
    config.save(cfg, d)
    assert sources(config.candidates(d)[0]) == ["current", "prev", "factory"]
    assert writes_of(d + "/config.json") == 2


def test_load_statuses():
    d = tmpdir()
    assert config.load(d)[1] == "missing"
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)
    cfg, status, detail = config.load(d)
    assert (status, cfg["pid"]["kp"]) == ("ok", 2), detail
    write_bytes(d + "/config.json", b"{garbage")
    cfg, status, detail = config.load(d)
    assert (status, cfg["pid"]["kp"]) == ("corrupt", 1), detail
    assert "config.json: file is not valid JSON" in detail, detail
    assert "kept as config.json.bad" in detail and "in use: config.prev.json" in detail
    cfg, status, detail = config.load(d)
    assert (status, cfg["pid"]["kp"]) == ("prev", 1), detail
    write_bytes(d + "/config.prev.json", b"")
    cfg, status, detail = config.load(d)
    assert status == "corrupt" and cfg == config.defaults(), detail
    assert "config.prev.json: file is empty; kept as config.prev.json.bad" in detail, detail
    assert "in use: factory defaults" in detail
    assert config.load(d)[1] == "missing"
    assert listdir(d) == ["config.json.bad", "config.prev.json.bad"]


def test_corrupt_prev_is_reported_while_current_runs():
    d = tmpdir()
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)
    write_bytes(d + "/config.prev.json", b"\xff\xfe")
    cands, _, problems = config.candidates(d)
    assert sources(cands) == ["current", "factory"]
    assert problems == ["config.prev.json: file is not UTF-8 text; kept as "
                        "config.prev.json.bad"], problems
    cfg, status, detail = config.load(d)
    assert status == "ok" and cfg["pid"]["kp"] == 2


def test_save_after_corruption_does_not_keep_the_corrupt_file_as_prev():
    d = tmpdir()
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)
    write_bytes(d + "/config.json", b'{"config":{"chan')  # rotted since boot
    for fs in (os, CountingFs(fat=True)):
        assert config.save(cfg_with(3), d, fs=fs) is True
        assert kp_of(d + "/config.json") == 3
        assert kp_of(d + "/config.prev.json") == 1  # the last good one stays
        assert writes_of(d + "/config.json") == 2  # counted from prev (the current lost it)
        write_bytes(d + "/config.json", b'{"config":{"chan')


def test_factory_reset_removes_both_and_keeps_bad_files():
    d = tmpdir()
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)
    write_bytes(d + "/config.json.tmp", b"x")
    write_bytes(d + "/config.json.bad", b"y")
    write_bytes(d + "/config.prev.json.bad", b"z")
    assert config.factory_reset(d) == config.defaults()
    assert listdir(d) == ["config.json.bad", "config.prev.json.bad"]
    cands, writes, problems = config.candidates(d)
    assert sources(cands) == ["factory"] and writes == 0 and problems == []
    assert config.save(config.defaults(), d) is True  # nothing stored: the defaults too


def test_rename_failure_after_the_rotation_puts_the_current_back():
    class FailSecondRename(CountingFs):
        def rename(self, src, dst):
            if src.endswith(".tmp"):
                raise OSError(28)  # ENOSPC, say
            CountingFs.rename(self, src, dst)

    d = tmpdir()
    config.save(cfg_with(1), d)
    config.save(cfg_with(2), d)
    with raises(OSError):
        config.save(cfg_with(3), d, fs=FailSecondRename())
    # the current config is back in place; the rotation had replaced the older prev
    assert listdir(d) == ["config.json"]
    assert kp_of(d + "/config.json") == 2
    assert config.load(d)[0]["pid"]["kp"] == 2


def test_deeply_nested_files_are_corrupt_not_a_crash():
    # 3. a file nested 100, 1000 or ~8000 levels deep (the whole 16 KB allowance)
    for n in (100, 1000, config.MAX_FILE_BYTES // 2 - 50):
        for data in (
            b'{"config":' + b"[" * n + b"]" * n + b',"crc":0,"version":1}',
            b"[" * n + b"]" * n,
            config.encode_file(config.defaults()).encode().replace(
                b'"correction":[]', b'"correction":' + b"[" * n + b"]" * n, 1),
        ):
            if len(data) > config.MAX_FILE_BYTES:
                continue
            d = tmpdir()
            write_bytes(d + "/config.json", data)
            cfg, status, detail = config.load(d)
            assert status == "corrupt" and cfg == config.defaults(), (n, detail)
            assert "file is nested deeper than 6 levels" in detail, (n, detail)
            with raises(ConfigError, match="nested deeper than 6 levels"):
                config.decode_file(data)


# --- power cuts at every step ---------------------------------------------------------------


class PowerLost(BaseException):
    """The power went: not an OSError, so no cleanup code runs."""


class CutFs(CountingFs):
    """Counts every step that changes the flash and loses power at step ``cut``.

    Steps: opening a file for writing (creates/truncates it), each write (cut
    inside it: half the data reaches the file), fsync, rename, remove. A cut
    rename or remove does not happen.
    """

    def __init__(self, cut, fat=False):
        CountingFs.__init__(self, fat)
        self.cut = cut
        self.steps = 0

    def step(self):
        if self.steps == self.cut:
            raise PowerLost()
        self.steps += 1

    def rename(self, src, dst):
        self.step()
        CountingFs.rename(self, src, dst)

    def remove(self, path):
        self.step()
        CountingFs.remove(self, path)

    if hasattr(os, "fsync"):

        def fsync(self, fd):
            self.step()
            os.fsync(fd)


class CutFile:
    def __init__(self, f, fs):
        self.f = f
        self.fs = fs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False

    def write(self, data):
        if self.fs.steps == self.fs.cut:
            self.f.write(data[: len(data) // 2])
        self.fs.step()
        return self.f.write(data)

    def flush(self):
        self.f.flush()

    def fileno(self):
        return self.f.fileno()


def save_with_cut(cfg, d, fs):
    real = fsfiles.open_file

    def cut_open(path, mode):
        if "w" in mode:
            fs.step()
            return CutFile(real(path, mode), fs)
        return real(path, mode)

    fsfiles.open_file = cut_open
    try:
        config.save(cfg, d, fs=fs)
        return True
    except PowerLost:
        return False
    finally:
        fsfiles.open_file = real


def _setups():
    """(name, files before the save {name: bytes}, kp of the current and the prev
    file (None: none or corrupt), the prev kp and the write count after the save)."""
    a = config.encode_file(cfg_with(1), 1).encode()
    b = config.encode_file(cfg_with(2), 2).encode()
    return (
        ("first save", {}, None, None, None, 1),
        ("second save", {"config.json": a}, 1, None, 1, 2),
        ("current and prev", {"config.json": b, "config.prev.json": a}, 2, 1, 2, 3),
        ("corrupt current", {"config.json": b"{rot", "config.prev.json": a}, None, 1, 1, 2),
    )


def test_a_power_cut_at_any_step_of_a_save_boots_the_old_or_the_new_config():
    new_kp = 7
    checked = 0
    for fat in (False, True):
        for name, files, old_kp, prev_kp, new_prev_kp, new_writes in _setups():
            cut = 0
            while True:
                d = tmpdir()
                for fname in files:
                    write_bytes(d + "/" + fname, files[fname])
                fs = CutFs(cut, fat)
                done = save_with_cut(cfg_with(new_kp), d, fs)
                where = (fat, name, cut)
                cands, writes, problems = config.candidates(d)
                first = cands[0]
                assert not exists(d + "/config.json.tmp"), where
                if name == "corrupt current" and first[0] != "current":
                    # the rotten file is set aside; the last good one runs
                    assert first[0] == "prev" and first[1]["pid"]["kp"] == prev_kp, where
                    assert problems, where
                elif first[0] == "current" and first[1]["pid"]["kp"] == new_kp:
                    # the save took effect: the one before it is the last good copy
                    if new_prev_kp is not None:
                        assert cands[1][0] == "prev", where
                        assert cands[1][1]["pid"]["kp"] == new_prev_kp, where
                    else:
                        assert sources(cands) == ["current", "factory"], where
                    assert writes == new_writes, (where, writes)
                    assert problems == [], where
                else:
                    # the save did not happen (it was never acknowledged)
                    assert not done, where
                    if old_kp is None:
                        assert sources(cands) == ["factory"], (where, cands)
                    else:
                        assert first[0] == "current", where
                        assert first[1]["pid"]["kp"] == old_kp, where
                        if len(cands) > 2:  # FAT may lose prev while rotating: never more
                            assert cands[1][1]["pid"]["kp"] == prev_kp, where
                    assert problems == [], where
                checked += 1
                if done:
                    assert first[1]["pid"]["kp"] == new_kp, where
                    break
                cut += 1
    assert checked > 30, checked


def test_a_power_cut_during_factory_reset_never_boots_the_previous_config():
    cut = 0
    while True:
        d = tmpdir()
        config.save(cfg_with(1), d)
        config.save(cfg_with(2), d)
        write_bytes(d + "/config.json.tmp", b"x")
        fs = CutFs(cut)
        try:
            config.factory_reset(d, fs=fs)
            done = True
        except PowerLost:
            done = False
        cands = config.candidates(d)[0]
        if done:
            assert sources(cands) == ["factory"]
            break
        assert cands[0][0] == "current" and cands[0][1]["pid"]["kp"] == 2, (cut, cands)
        cut += 1
    assert cut == 3, cut  # .tmp, prev, current


# --- a real littlefs (MicroPython's VfsLfs2), cut at every block write ------------------------


class RamBlocks:
    """A block device in RAM that logs each block write (the extended interface)."""

    def __init__(self, blocks, size=512):
        self.size = size
        self.data = bytearray(blocks * size)
        self.log = None

    def readblocks(self, n, buf, off=0):
        a = n * self.size + off
        buf[:] = self.data[a : a + len(buf)]

    def writeblocks(self, n, buf, off=None):
        if off is None:
            self.ioctl(6, n)
            off = 0
        a = n * self.size + off
        if self.log is not None:
            self.log.append((a, bytes(buf)))
        self.data[a : a + len(buf)] = buf

    def ioctl(self, op, arg):
        if op == 4:
            return len(self.data) // self.size
        if op == 5:
            return self.size
        if op == 6:
            a = arg * self.size
            if self.log is not None:
                self.log.append((a, b"\xff" * self.size))
            self.data[a : a + self.size] = b"\xff" * self.size
            return 0
        return None


def test_littlefs_power_cut_at_every_block_write():
    if not IS_MICROPYTHON or not hasattr(os, "VfsLfs2"):
        return  # littlefs is MicroPython's; CPython runs the model above
    mnt = "/cfglfs"
    bd = RamBlocks(64)
    os.VfsLfs2.mkfs(bd)
    os.mount(os.VfsLfs2(bd), mnt)
    try:
        config.save(cfg_with(1), mnt)
        config.save(cfg_with(2), mnt)
    finally:
        os.umount(mnt)
    image = bytes(bd.data)
    bd.log = []
    os.mount(os.VfsLfs2(bd), mnt)
    try:
        assert config.save(cfg_with(3), mnt) is True
        assert config.save(cfg_with(3), mnt) is False
    finally:
        os.umount(mnt)
    log = bd.log
    assert len(log) > 3, len(log)
    seen = {}
    for k in range(len(log) + 1):
        bd.log = None
        bd.data[:] = image
        for a, chunk in log[:k]:
            bd.data[a : a + len(chunk)] = chunk
        os.mount(os.VfsLfs2(bd), mnt)
        try:
            if "config.json" not in os.listdir(mnt):
                seen["between the renames"] = True
            cands, writes, problems = config.candidates(mnt)
            kps = [c[1]["pid"]["kp"] for c in cands]
            assert problems == [], (k, problems)
            assert kps in ([2, 1, 5000], [3, 2, 5000]), (k, kps)
            assert "config.json.tmp" not in os.listdir(mnt), k
        finally:
            os.umount(mnt)
        seen[kps[0]] = True
    assert seen == {2: True, 3: True, "between the renames": True}, seen


def test_a_file_from_before_the_adaptive_pid_keys_loads_with_their_factory_values():
    # written by the firmware before slew_down_pct_min ... ff_tau_ms existed: an update
    # must not turn the user's saved config (calibration, setpoints) into a corrupt one
    cfg = cfg_with(7000)
    for _, key in config._ADDED_IN_1:
        del cfg["pid"][key]
    got, detail = config.decode_file(old_envelope(cfg))
    assert got["pid"]["kp"] == 7000, got["pid"]
    for section, key in config._ADDED_IN_1:
        assert got[section][key] == config.defaults()[section][key], key
    assert "key(s) added by this firmware" in detail, detail


def test_only_the_keys_added_later_may_be_missing():
    cfg = cfg_with(7000)
    del cfg["pid"]["kp"]  # a key of the first release: the file is corrupt
    with raises(ConfigError, match="missing"):
        config.decode_file(old_envelope(cfg))
