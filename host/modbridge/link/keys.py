"""The host's signing keys, one file per module, and the pairing procedure.

A module verifies every command that changes cooling or state with a 32-byte secret
(docs/pairing.md; MAVLink 2 signing is the model, :mod:`protocol.sign` the code). The
host keeps its copy of each module's secret in a :class:`KeyStore`: a directory (mode
0700) holding ``<uid>.key`` files (mode 0600, exactly 32 raw bytes), named after the
MCU unique id from the module's hello. A key file that others can read, or that is not
32 bytes, is refused with a message that says what to do; so is a module id that is
not hex (it becomes a file name: a hello must not be able to name ``../x``).

Where the store lives (:func:`default_dir`), first match wins: an explicit directory
(``--keys-dir``), ``$MODBRIDGE_KEYS_DIR``, the config's ``[bridge] keys_dir``, the
config's state directory + ``/keys``, systemd's ``$STATE_DIRECTORY/keys``
(``StateDirectory=modbridge``), ``$XDG_STATE_HOME/modbridge/keys``, else
``~/.local/state/modbridge/keys``.

Virtual modules (``modbridge sim``, ``--sim``, the tests) are provisioned with fresh
keys in a temporary store; :func:`attach_dir` makes such a store visible to every
:class:`KeyStore` lookup in this process, so a bridge started beside a
:class:`~modbridge.sim.fleet.SimFleet` signs without being told where its keys are.

:func:`pair_module` runs ``modbridge pair`` over an open
:class:`~modbridge.link.session.ModuleLink`: a new key, sent in a ``pair`` command signed with
the key the store already has (or unsigned, which a module accepts only in its pairing
window: the first 60 s after power-on while it has no secret), stored only once the
module acknowledged it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from modbridge.errors import ModbridgeError
from modbridge.fsutil import UnsafeDirectory, atomic_write, check_private_dir, fsync_dir
from modbridge.sanitize import sanitize
from protocol.sign import KEY_LEN, new_key

log = logging.getLogger(__name__)

KEY_SUFFIX = ".key"
PENDING_SUFFIX = ".key.new"  # a key sent to a module whose answer is not in yet
ENV_KEYS_DIR = "MODBRIDGE_KEYS_DIR"
PAIRING_WINDOW_S = 60  # the module's: after power-on, while it has no secret
_UID = re.compile(r"^[0-9a-fA-F]{2,64}$")
_DIR_MODE = 0o700
_FILE_MODE = 0o600


# ----------------------------------------------------------------------------- errors


class KeyStoreError(ModbridgeError):
    """A key or the key directory cannot be used; the message says what to do."""


class KeyFileInvalid(KeyStoreError):
    """A key file that is not exactly ``KEY_LEN`` raw bytes."""


class KeyFileInsecure(KeyStoreError):
    """A key file that the group or others may read or write."""


class KeyDirError(KeyStoreError):
    """The key directory cannot be created, read or written."""


class BadModuleId(KeyStoreError):
    """A module id that cannot name a key file (not hex)."""


class PairingError(ModbridgeError):
    """``modbridge pair`` did not pair the module; the message says what to do."""


class PairingRefused(PairingError):
    """The module refused the new key (not in its pairing window, or a wrong key)."""


class AlreadyPaired(PairingError):
    """The store has a key for the module already and ``--force`` was not given."""

    exit_code = 2


# ----------------------------------------------------------------------------- where


def default_dir(config=None, environ=None) -> Path:
    """The key directory when none is given (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_KEYS_DIR):
        return Path(env[ENV_KEYS_DIR]).expanduser()
    if config is not None:
        if getattr(config, "keys_dir", None):
            return Path(config.keys_dir).expanduser()
        if getattr(config, "state_dir", None):
            return Path(config.state_dir).expanduser() / "keys"
    if env.get("STATE_DIRECTORY"):  # systemd StateDirectory=: may list several, ':'
        return Path(env["STATE_DIRECTORY"].split(":")[0]) / "keys"
    base = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "modbridge" / "keys"


_attached: list[Path] = []
_attached_lock = threading.Lock()


def attach_dir(path) -> None:
    """Let every :class:`KeyStore` in this process also find keys in ``path``
    (read only; keys are still saved in a store's own directory). For virtual
    modules: their keys live in a temporary directory nobody configures."""
    p = Path(path)
    with _attached_lock:
        if p not in _attached:
            _attached.append(p)


def detach_dir(path) -> None:
    with _attached_lock, contextlib.suppress(ValueError):
        _attached.remove(Path(path))


def check_uid(uid: str) -> str:
    """The module id as a key file stem (lowercase hex), or :class:`BadModuleId`."""
    if not isinstance(uid, str) or not _UID.match(uid):
        raise BadModuleId(
            f"module id {uid!r} is not a hex unique id: no key can be kept for it "
            "(is the modbridge firmware running on the module?)"
        )
    return uid.lower()


# ----------------------------------------------------------------------------- files


def read_key_file(path, pair_hint: str = "modbridge pair <port>") -> bytes | None:
    """The key in ``path``; None if there is no such file.

    Refuses (with what to do) a file that is not exactly ``KEY_LEN`` bytes, is not a
    regular file, or that the group or others may read or write. The file is opened
    without following a symlink and checked on the open descriptor.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise KeyDirError(f"{p.parent} is not a directory: give a directory for the keys") from None
    except PermissionError:
        raise KeyFileInsecure(
            f"{p}: permission denied: run as the user that owns the keys "
            f"(the one that ran `{pair_hint}`)"
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise KeyFileInsecure(
                f"{p} is a symlink: a key file must be a regular file (copy it in place)"
            ) from None
        raise KeyDirError(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        _check_dir(p.parent)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileInvalid(f"{p} is not a regular file: remove it and run `{pair_hint}`")
        if st.st_uid not in (0, os.geteuid()):
            raise KeyFileInsecure(
                f"{p} is owned by uid {st.st_uid}, neither root nor this user: "
                f"`chown {os.geteuid()} {p}` if it is yours, else run `{pair_hint} --force`"
            )
        if st.st_mode & 0o077:
            raise KeyFileInsecure(
                f"{p} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                f"`chmod 600 {p}`; if others may have read it, run `{pair_hint} --force` "
                "for a new key"
            )
        data = os.read(fd, KEY_LEN + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_LEN:
        size = f"{len(data)} bytes" if len(data) <= KEY_LEN else f"more than {KEY_LEN} bytes"
        raise KeyFileInvalid(
            f"{p} holds {size}, a key is exactly {KEY_LEN} raw bytes: "
            f"remove it and run `{pair_hint}`"
        )
    return data


def write_key_file(path, key: bytes) -> Path:
    """Write ``key`` to ``path`` atomically (temp file 0600, fsync, rename, fsync dir)."""
    key = _check_key(key)
    p = Path(path)
    try:
        atomic_write(p, key, _FILE_MODE)
    except OSError as e:
        raise KeyDirError(f"{p}: cannot write the key: {e.strerror or e}") from None
    return p


def _check_dir(d: Path) -> None:
    """Refuse a key directory others can write or that another user owns (KeyDirError
    with the chmod/chown that fixes it): :func:`modbridge.fsutil.check_private_dir`."""
    try:
        check_private_dir(d, "key directory")
    except UnsafeDirectory as e:
        raise KeyDirError(str(e)) from None


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fsync_dir(d)


def _check_key(key) -> bytes:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_LEN:
        n = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
        raise KeyFileInvalid(f"a key is exactly {KEY_LEN} bytes, got {n}")
    return bytes(key)


# ----------------------------------------------------------------------------- store


class KeyStore:
    """``<dir>/<uid>.key`` files: the host's copy of each module's signing secret.

    ``KeyStore()`` uses :func:`default_dir`; ``KeyStore.for_config(cfg)`` the config's.
    Reading never creates anything; :meth:`save` creates the directory (0700).
    """

    def __init__(self, directory=None, *, config=None):
        self.dir = Path(directory).expanduser() if directory is not None else default_dir(config)

    @classmethod
    def for_config(cls, config) -> KeyStore:
        return cls(None, config=config)

    def __repr__(self) -> str:
        return f"KeyStore({str(self.dir)!r})"

    def path(self, uid: str) -> Path:
        """Where the key of module ``uid`` is (or would be) kept."""
        return self.dir / (check_uid(uid) + KEY_SUFFIX)

    def pending_path(self, uid: str) -> Path:
        return self.dir / (check_uid(uid) + PENDING_SUFFIX)

    def find(self, uid: str) -> Path | None:
        """The key file for ``uid``: in this store, else in an attached directory."""
        own = self.path(uid)
        if own.exists() or own.is_symlink():
            return own
        if self.dir.exists() and not self.dir.is_dir():
            raise KeyDirError(f"{self.dir} is not a directory: give a directory for the keys")
        name = own.name
        with _attached_lock:
            extra = list(_attached)
        for d in extra:
            p = d / name
            if p.exists():
                return p
        return None

    def load(self, uid: str, pair_hint: str = "modbridge pair <port>") -> bytes | None:
        """The key for module ``uid``, or None if there is none.

        Raises :class:`KeyFileInvalid` / :class:`KeyFileInsecure` for a file that
        exists but must not be used, :class:`BadModuleId` for a non-hex id."""
        p = self.find(uid)
        if p is None:
            return None
        return read_key_file(p, pair_hint)

    def has(self, uid: str) -> bool:
        return self.find(uid) is not None

    def save(self, uid: str, key: bytes, *, overwrite: bool = False) -> Path:
        """Store ``key`` for ``uid`` (atomically); refuses to replace one unless asked."""
        p = self.path(uid)
        self._ensure_dir()
        if not overwrite and p.exists():
            raise KeyStoreError(f"{p} exists already: remove it first, or pair with --force")
        return write_key_file(p, key)

    def save_pending(self, uid: str, key: bytes) -> Path:
        """Keep a key that is being sent to the module (see :func:`pair_module`)."""
        self._ensure_dir()
        return write_key_file(self.pending_path(uid), key)

    def load_pending(self, uid: str) -> bytes | None:
        try:
            return read_key_file(self.pending_path(uid))
        except KeyStoreError as e:
            log.warning("ignoring the pending key: %s", e)
            return None

    def commit_pending(self, uid: str) -> Path:
        """The module took the pending key: it becomes the key."""
        p = self.path(uid)
        try:
            os.replace(self.pending_path(uid), p)
        except OSError as e:
            raise KeyDirError(f"{p}: cannot store the key: {e.strerror or e}") from None
        _fsync_dir(self.dir)
        return p

    def discard_pending(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pending_path(uid).unlink()

    def remove(self, uid: str) -> bool:
        try:
            self.path(uid).unlink()
        except FileNotFoundError:
            return False
        return True

    def uids(self) -> list[str]:
        """Module ids with a key in this store (not the attached directories)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise KeyDirError(f"{self.dir}: cannot list: {e.strerror or e}") from None
        out = []
        for n in names:
            stem = n[: -len(KEY_SUFFIX)]
            if n.endswith(KEY_SUFFIX) and _UID.match(stem):
                out.append(stem)
        return sorted(out)

    def _ensure_dir(self) -> None:
        d = self.dir
        if d.exists() and not d.is_dir():
            raise KeyDirError(f"{d} is not a directory: give a directory for the keys")
        try:
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                d.mkdir(mode=_DIR_MODE)
            except FileExistsError:
                st = d.stat()
                if st.st_mode & 0o077 and st.st_uid == os.getuid():
                    os.chmod(d, _DIR_MODE)
                    log.info("%s: tightened to mode 0700", d)
            else:
                os.chmod(d, _DIR_MODE)  # whatever the umask
            _check_dir(d)
        except PermissionError:
            raise KeyDirError(
                f"{d}: permission denied: give a directory you may write (--keys-dir), "
                "or run as the user that owns it"
            ) from None
        except OSError as e:
            raise KeyDirError(f"{d}: cannot create the key directory: {e.strerror or e}") from None


# ----------------------------------------------------------------------------- pairing


@dataclass
class PairResult:
    """What :func:`pair_module` did (the CLI prints it, as text or JSON)."""

    port: str
    module_id: str
    key_path: str
    signed_with: str  # "stored key", "pending key" or "unsigned (pairing window)"
    replaced: bool  # an older key for the module was replaced
    paired: bool | None  # the module's hello after pairing says so

    def as_dict(self) -> dict:
        return {
            "port": self.port,
            "module_id": self.module_id,
            "key_path": self.key_path,
            "signed_with": self.signed_with,
            "replaced": self.replaced,
            "paired": self.paired,
        }


def pair_module(link, store: KeyStore, *, force: bool = False, key: bytes | None = None):
    """Give the module on ``link`` (up) a new signing key and keep the host's copy.

    Tried in order until the module acks: signed with the store's key for the module,
    signed with a pending key left by an interrupted pair, unsigned (accepted only in
    the module's pairing window). The new key is written as ``<uid>.key.new`` before
    it is sent and becomes ``<uid>.key`` only once the module acknowledged it; if the
    answer never comes, one more ``pair`` signed with the new key tells whether the
    module took it. Raises :class:`AlreadyPaired` (a key exists, no ``force``),
    :class:`PairingRefused` (with what to do) or a :class:`~modbridge.link.session.LinkError`.
    """
    from modbridge.link.session import CommandRefused, LinkError, RequestTimeout

    port = link.port
    uid = link.status.module_id
    if uid is None:
        raise PairingError(f"{port}: no hello from the module yet: is it running the firmware?")
    check_uid(uid)
    if not link.signing_supported:
        raise PairingError(
            f"{port}: module {uid} (firmware {sanitize(link.status.fw_version)}) does not "
            "sign: its hello has no nonce; flash a firmware with signed commands "
            "(`modbridge flash`)"
        )
    hint = f"modbridge pair --force {port}"
    try:
        existing = store.load(uid, hint)
        bad_existing = None
    except (KeyFileInvalid, KeyFileInsecure) as e:
        if not force:
            raise
        existing, bad_existing = None, str(e)
    if existing is not None and not force and link.paired is not False:
        raise AlreadyPaired(
            f"module {uid} is paired already (key {store.path(uid)}): "
            f"`{hint}` makes a new key (the old one stops working)"
        )
    if bad_existing:
        log.warning("replacing an unusable key: %s", bad_existing)
    pending = store.load_pending(uid)
    attempts = []
    if link.paired is not False:  # a module without a secret verifies nothing: skip
        if existing is not None:
            attempts.append(("stored key", existing))
        if pending is not None and pending != existing:
            attempts.append(("pending key", pending))
    attempts.append(("unsigned (pairing window)", None))
    new = _check_key(key) if key is not None else new_key()
    store.save_pending(uid, new)
    for how, signing_key in attempts:
        try:
            link.request_with_key("pair", {"key": new}, signing_key)
        except CommandRefused as e:
            if e.code_name != "unauthorized":
                store.discard_pending(uid)
                raise PairingRefused(f"{port}: module {uid} refused the new key: {e}") from None
            continue
        except RequestTimeout:
            if not _took_key(link, new):
                store.discard_pending(uid)
                raise PairingError(
                    f"{port}: no answer to pair from module {uid}, and it does not "
                    "know the new key: nothing changed; try again"
                ) from None
        signed_with = how
        break
    else:
        store.discard_pending(uid)
        raise PairingRefused(_refusal_text(port, uid, link.paired, existing, store))
    path = store.commit_pending(uid)
    link.use_key(new)
    try:
        paired = link.refresh_hello()
    except LinkError:  # paired all the same; the hello only confirms it
        paired = None
    replaced = existing is not None or bad_existing is not None
    return PairResult(port, uid, str(path), signed_with, replaced, paired)


def _took_key(link, new: bytes) -> bool:
    """After a lost answer: does the module verify with ``new``? (a ``pair`` of the same
    key signed with it is accepted only if so, and changes nothing)."""
    from modbridge.link.session import LinkError

    try:
        link.request_with_key("pair", {"key": new}, new)
    except LinkError:
        return False
    return True


def _refusal_text(port, uid, paired, existing, store) -> str:
    if paired:
        if existing is not None:
            return (
                f"{port}: module {uid} refused the pairing: it has a secret that is not "
                f"the key in {store.path(uid)} (paired by another host?). Copy that host's "
                f"key file here, or remove secret.key from the module's filesystem "
                f"(`mpremote fs rm`, docs/pairing.md), power-cycle it and run pair within "
                f"{PAIRING_WINDOW_S} s"
            )
        return (
            f"{port}: module {uid} is paired with a key this host does not have "
            f"(none in {store.dir}). Copy the key file from the host that paired it "
            f"({uid}{KEY_SUFFIX}), or remove secret.key from the module's filesystem "
            f"(`mpremote fs rm`, docs/pairing.md), power-cycle it and run pair within "
            f"{PAIRING_WINDOW_S} s"
        )
    return (
        f"{port}: module {uid} refused the unsigned pairing (its pairing window is over): "
        f"power-cycle the module and run `modbridge pair {port}` within {PAIRING_WINDOW_S} s"
    )
