"""The key store (modbridge.link.keys) and ``modbridge pair``: files, modes, garbage, and
pairing against a fake module (tests/ptypeer.py) that verifies signatures."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from ptypeer import PtyPeer

from modbridge.cli.main import main
from modbridge.config import parse
from modbridge.link import keys as K
from modbridge.link.session import ModuleLink
from protocol import sign

UID = "0123456789abcdef01234567"
WAIT = 5.0


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture(autouse=True)
def no_leaked_links():
    yield
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name.startswith("modbridge-link")]:
            return
        time.sleep(0.02)
    pytest.fail("link threads left running")


# ----------------------------------------------------------------------------- store


def test_save_creates_0700_dir_and_0600_file_and_loads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "umask", os.umask)  # restored after the test
    old = os.umask(0o022)
    try:
        store = K.KeyStore(tmp_path / "state" / "keys")
        key = sign.new_key()
        path = store.save(UID.upper(), key)  # ids are case-insensitive hex
    finally:
        os.umask(old)
    assert path == tmp_path / "state" / "keys" / f"{UID}.key"
    assert mode(store.dir) == 0o700 and mode(path) == 0o600
    assert path.read_bytes() == key and store.load(UID) == key
    assert store.has(UID) and store.uids() == [UID]
    assert not list(store.dir.glob("*.tmp"))
    with pytest.raises(K.KeyStoreError, match="exists already"):
        store.save(UID, sign.new_key())
    store.save(UID, key2 := sign.new_key(), overwrite=True)
    assert store.load(UID) == key2
    assert store.remove(UID) and not store.remove(UID) and store.load(UID) is None


def test_missing_dir_is_no_key_and_nothing_is_created(tmp_path):
    store = K.KeyStore(tmp_path / "nowhere" / "keys")
    assert store.load(UID) is None and store.uids() == []
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_a_key_file_of_the_wrong_size_is_refused_saying_what_to_do(tmp_path, size):
    store = K.KeyStore(tmp_path)
    p = tmp_path / f"{UID}.key"
    p.write_bytes(b"k" * size)
    p.chmod(0o600)
    with pytest.raises(K.KeyFileInvalid) as e:
        store.load(UID, "modbridge pair /dev/x")
    msg = str(e.value)
    assert "exactly 32 raw bytes" in msg and "modbridge pair /dev/x" in msg, msg
    assert (f"{size} bytes" if size <= 32 else "more than 32 bytes") in msg


@pytest.mark.parametrize("bits", [0o644, 0o604, 0o640, 0o660, 0o602])
def test_a_key_others_can_read_or_write_is_refused(tmp_path, bits):
    store = K.KeyStore(tmp_path)
    p = tmp_path / f"{UID}.key"
    p.write_bytes(sign.new_key())
    p.chmod(bits)
    with pytest.raises(K.KeyFileInsecure) as e:
        store.load(UID)
    msg = str(e.value)
    assert f"chmod 600 {p}" in msg and f"{bits:04o}" in msg and "--force" in msg, msg


def test_symlinked_and_non_regular_key_files_are_refused(tmp_path):
    real = tmp_path / "real.key"
    real.write_bytes(sign.new_key())
    real.chmod(0o600)
    (tmp_path / f"{UID}.key").symlink_to(real)
    with pytest.raises(K.KeyFileInsecure, match="symlink"):
        K.KeyStore(tmp_path).load(UID)
    d = tmp_path / "d"
    d.mkdir()
    (d / f"{UID}.key").mkdir(mode=0o700)
    with pytest.raises(K.KeyFileInvalid, match="not a regular file"):
        K.KeyStore(d).load(UID)


@pytest.mark.parametrize("uid", ["../../etc/passwd", "", "x", "g" * 24, "a" * 65, "01 23"])
def test_module_ids_that_cannot_name_a_file_are_refused(tmp_path, uid):
    with pytest.raises(K.BadModuleId, match="not a hex unique id"):
        K.KeyStore(tmp_path).load(uid)
    assert list(tmp_path.iterdir()) == []


def test_keys_dir_that_is_a_file_or_not_writable(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(K.KeyDirError, match="is not a directory"):
        K.KeyStore(f).save(UID, sign.new_key())
    with pytest.raises(K.KeyDirError, match="is not a directory"):
        K.KeyStore(f).load(UID)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(K.KeyDirError, match="permission denied.*--keys-dir"):
            K.KeyStore(ro / "keys").save(UID, sign.new_key())


def test_an_existing_loose_dir_is_tightened(tmp_path):
    d = tmp_path / "keys"
    d.mkdir()
    d.chmod(0o755)
    K.KeyStore(d).save(UID, sign.new_key())
    assert mode(d) == 0o700


def test_save_rejects_keys_that_are_not_32_bytes(tmp_path):
    with pytest.raises(K.KeyFileInvalid, match="exactly 32 bytes, got 31"):
        K.KeyStore(tmp_path).save(UID, b"k" * 31)
    assert not list(tmp_path.iterdir())


def test_default_dir_order(tmp_path):
    cfg = parse({"bridge": {"keys_dir": str(tmp_path / "cfg")}})
    env = {"HOME": str(tmp_path / "home")}
    assert K.default_dir(None, env) == tmp_path / "home/.local/state/modbridge/keys"
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    assert K.default_dir(None, env) == tmp_path / "xdg/modbridge/keys"
    env["STATE_DIRECTORY"] = "/var/lib/modbridge:/var/lib/other"
    assert K.default_dir(None, env) == Path("/var/lib/modbridge/keys")
    state = type("Cfg", (), {"keys_dir": None, "state_dir": str(tmp_path / "st")})()
    assert K.default_dir(state, env) == tmp_path / "st" / "keys"
    assert K.default_dir(cfg, env) == tmp_path / "cfg"
    env[K.ENV_KEYS_DIR] = str(tmp_path / "env")
    assert K.default_dir(cfg, env) == tmp_path / "env"
    assert K.KeyStore(tmp_path / "explicit").dir == tmp_path / "explicit"


def test_config_keys_dir_is_checked(tmp_path):
    from modbridge.config import ConfigFileError

    assert parse({"bridge": {"keys_dir": "/var/lib/modbridge/keys"}}).keys_dir == (
        "/var/lib/modbridge/keys"
    )
    with pytest.raises(ConfigFileError, match="bridge.keys_dir: must be non-empty text"):
        parse({"bridge": {"keys_dir": ""}})


def test_attached_dirs_are_found_read_only(tmp_path):
    sim = K.KeyStore(tmp_path / "sim")
    key = sign.new_key()
    sim.save(UID, key)
    mine = K.KeyStore(tmp_path / "mine")
    assert mine.load(UID) is None
    K.attach_dir(sim.dir)
    try:
        assert mine.load(UID) == key and mine.find(UID) == sim.path(UID)
        assert mine.uids() == []  # only its own
        own = sign.new_key()
        mine.save(UID, own)
        assert mine.load(UID) == own  # its own first
    finally:
        K.detach_dir(sim.dir)
    mine.remove(UID)
    assert mine.load(UID) is None


def test_pending_key_commit_and_discard(tmp_path):
    store = K.KeyStore(tmp_path / "k")
    key = sign.new_key()
    store.save_pending(UID, key)
    assert mode(store.pending_path(UID)) == 0o600
    assert store.load(UID) is None and store.load_pending(UID) == key
    store.commit_pending(UID)
    assert store.load(UID) == key and store.load_pending(UID) is None
    store.save_pending(UID, sign.new_key())
    store.discard_pending(UID)
    assert store.load_pending(UID) is None and store.load(UID) == key


# ----------------------------------------------------------------------------- pairing


@pytest.fixture
def linked():
    made = []

    def make(peer, store):
        link = ModuleLink(peer.path, keys=store, heartbeat_period_s=0.1).start()
        made.append(link)
        assert link.wait_up(WAIT)
        return link

    yield make
    for link in made:
        link.stop()


def test_pair_in_the_window_unsigned_then_the_link_signs(tmp_path, linked):
    store = K.KeyStore(tmp_path / "keys")
    with PtyPeer(nonce=True) as peer:  # no key yet: in its pairing window
        link = linked(peer, store)
        assert link.paired is False and link.heartbeats_sent == 0
        res = K.pair_module(link, store)
        assert res.signed_with == "unsigned (pairing window)" and res.paired is True
        assert res.module_id == UID and res.replaced is False
        key = store.load(UID)
        assert peer.paired_keys == [key] and res.key_path == str(store.path(UID))
        assert store.load_pending(UID) is None
        # from now on the heartbeats are signed and count
        assert peer.wait_for(lambda: len(peer.heartbeats) >= 2, WAIT)
        assert link.request("reboot").name == "ack"


def test_a_paired_module_without_the_hosts_key_file_says_where_it_looked(tmp_path, linked):
    """The module has a secret (its hello says paired), this host's store has no file
    for it (MODBRIDGE_KEYS_DIR unset, another user's store): the message names the
    directory and the variable, not 'the module is not paired'."""
    store = K.KeyStore(tmp_path / "elsewhere")
    with PtyPeer(nonce=True, key=bytes(range(32))) as peer:
        link = linked(peer, store)
        assert link.paired is True
        msg = link.key_error
        assert "is paired, but there is no key for it in" in msg, msg
        assert str(tmp_path / "elsewhere") in msg and "MODBRIDGE_KEYS_DIR" in msg, msg
        assert "is not paired" not in msg


def test_pair_outside_the_window_is_refused_with_what_to_do(tmp_path, linked):
    store = K.KeyStore(tmp_path / "keys")
    with PtyPeer(nonce=True, pairing_window=False) as peer:
        link = linked(peer, store)
        with pytest.raises(K.PairingRefused) as e:
            K.pair_module(link, store)
        msg = str(e.value)
        assert "power-cycle the module" in msg and "within 60 s" in msg, msg
        assert store.load(UID) is None and store.load_pending(UID) is None
        assert peer.key is None


def test_repair_is_signed_with_the_stored_key_and_needs_force(tmp_path, linked):
    store = K.KeyStore(tmp_path / "keys")
    old = sign.new_key()
    store.save(UID, old)
    with PtyPeer(nonce=True, key=old) as peer:
        link = linked(peer, store)
        with pytest.raises(K.AlreadyPaired, match="--force"):
            K.pair_module(link, store)
        res = K.pair_module(link, store, force=True)
        assert res.signed_with == "stored key" and res.replaced and res.paired
        new = store.load(UID)
        assert new != old and peer.key == new
        assert link.request("reboot").name == "ack"  # signed with the new key


def test_a_module_paired_elsewhere_says_how_to_recover(tmp_path, linked):
    store = K.KeyStore(tmp_path / "keys")
    with PtyPeer(nonce=True, key=sign.new_key()) as peer:
        link = linked(peer, store)
        with pytest.raises(K.PairingRefused) as e:
            K.pair_module(link, store)
        msg = str(e.value)
        assert "paired with a key this host does not have" in msg
        assert "secret.key" in msg and f"{UID}.key" in msg, msg
        store.save(UID, sign.new_key())  # a wrong key
        with pytest.raises(K.PairingRefused, match="not the key in"):
            K.pair_module(link, store, force=True)


def test_a_lost_ack_is_resolved_by_asking_with_the_new_key(tmp_path, linked, monkeypatch):
    from modbridge.link import session as L

    monkeypatch.setitem(L._REQUEST_TIMEOUTS, "pair", 0.3)
    store = K.KeyStore(tmp_path / "keys")
    with PtyPeer(nonce=True) as peer:
        peer.lose_pair_answers = 1
        link = linked(peer, store)
        res = K.pair_module(link, store)
        assert store.load(UID) == peer.key and res.key_path == str(store.path(UID))
        assert peer.paired_keys == [peer.key, peer.key]  # the probe re-paired the same key


def test_no_answer_at_all_changes_nothing(tmp_path, linked, monkeypatch):
    from modbridge.link import session as L

    monkeypatch.setitem(L._REQUEST_TIMEOUTS, "pair", 0.2)
    store = K.KeyStore(tmp_path / "keys")
    with PtyPeer(nonce=True, ignore={"pair"}) as peer:
        link = linked(peer, store)
        with pytest.raises(K.PairingError, match="nothing changed"):
            K.pair_module(link, store)
        assert store.load(UID) is None and store.load_pending(UID) is None


def test_pair_a_module_without_signing_support(tmp_path, linked):
    with PtyPeer() as peer:  # firmware from before signing: no nonce in its hello
        link = linked(peer, K.KeyStore(tmp_path))
        with pytest.raises(K.PairingError, match="does not sign.*no nonce"):
            K.pair_module(link, K.KeyStore(tmp_path))


def test_force_replaces_an_unusable_key_file(tmp_path, linked):
    store = K.KeyStore(tmp_path / "keys")
    store.dir.mkdir(mode=0o700)
    bad = store.path(UID)
    bad.write_bytes(b"x" * 31)
    bad.chmod(0o600)
    with PtyPeer(nonce=True) as peer:
        link = linked(peer, store)
        assert "exactly 32 raw bytes" in (link.key_error or "")
        with pytest.raises(K.KeyFileInvalid):
            K.pair_module(link, store)
        res = K.pair_module(link, store, force=True)
        assert res.replaced and len(bad.read_bytes()) == 32 and peer.key == bad.read_bytes()


# ----------------------------------------------------------------------------- CLI


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_cli_pair_text_and_json(tmp_path):
    kd = tmp_path / "keys"
    with PtyPeer(nonce=True) as peer:
        r = run("pair", peer.path, "--keys-dir", str(kd))
        assert r.exit_code == 0, r.output
        assert f"paired module {UID} on {peer.path}: key {kd / (UID + '.key')}" in r.output
        assert "(sent unsigned (pairing window))" in r.output
        r = run("pair", peer.path, "--keys-dir", str(kd))
        assert r.exit_code == 2 and "--force" in r.output, r.output
        r = run("pair", peer.path, "--keys-dir", str(kd), "--force", "--json")
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout)
        assert obj == {
            "port": peer.path, "module_id": UID, "key_path": str(kd / f"{UID}.key"),
            "signed_with": "stored key", "replaced": True, "paired": True,
        }  # fmt: skip
        assert peer.key == (kd / f"{UID}.key").read_bytes()


def test_cli_pair_refused_and_no_module(tmp_path):
    with PtyPeer(nonce=True, pairing_window=False) as peer:
        r = run("pair", peer.path, "--keys-dir", str(tmp_path))
        assert r.exit_code == 1 and "power-cycle the module and run" in r.output, r.output
    r = run("pair", str(tmp_path / "ttyNONE"), "--keys-dir", str(tmp_path), "--timeout", "0.3")
    assert r.exit_code == 3 and "no such port" in r.output, r.output


# ----------------------------------------------------------------------------- real firmware


def test_pair_a_virtual_module_in_its_pairing_window(tmp_path):
    """The real firmware (sim board) without a secret: unsigned pair in the window,
    then signed heartbeats make it HOSTED and the module keeps the key across a reset."""
    runner = pytest.importorskip("modbridge.sim.runner")
    from modbridge.sim import World, load_params

    world = World(load_params("default"), seed=5)
    world.set_duties(19661, 19661)
    world.equilibrate()
    vm = runner.VirtualModule(world, tmp_path / "vm", speed=2.0, seed=5,
                              port_symlink=tmp_path / "mod0", provision=False)  # fmt: skip
    store = K.KeyStore(tmp_path / "keys")
    link = None
    try:
        vm.start()
        assert vm.key is None
        link = ModuleLink(str(tmp_path / "mod0"), keys=store, heartbeat_period_s=0.2).start()
        assert link.wait_up(30)
        assert link.paired is False and "is not paired" in link.key_error
        res = K.pair_module(link, store)
        assert res.signed_with == "unsigned (pairing window)" and res.paired is True
        assert vm.key == store.load(vm.uid.hex())
        deadline = time.monotonic() + 30
        while link.status.state != "HOSTED" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.status.state == "HOSTED", link.status.telemetry
        vm.mcu_reset()  # not a power-on: the key stays, no window
        assert link.request("setpoints", {"sp_gpu": 65000}).name == "ack"
        assert link.refresh_hello() is True
    finally:
        if link is not None:
            link.stop()
        vm.stop()
