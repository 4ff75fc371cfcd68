"""Stored configs: decoding a file and choosing what to boot (``device.config``'s
third part: ``decode_file``, ``candidates``, ``load``, ``factory_reset``; saving is
``device.cfg.writer``). The file format, the save's steps and what boot makes of an
interrupted one: device/config.py's docstring."""

import os

from device.cfg import files
from device.cfg.schema import SCHEMA_VERSION, ConfigError, _deeper_than, _show, defaults, validate
from protocol.crc import crc16

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


FILE_NAME = "config.json"
PREV_NAME = "config.prev.json"  # the config before the last save (last good)
TMP_SUFFIX = ".tmp"
BAD_SUFFIX = ".bad"
MAX_FILE_BYTES = 16384  # the factory file is ~1.8 KB; never read a huge one into RAM
_MAX_DEPTH = const(6)  # device.cfg.schema's (module-private constants are not importable)
_HEAD = const(b'{"config":')  # device.cfg.writer's
_CRC_KEY = const(b',"crc":')


def canonical(value):
    """Deterministic compact JSON text (sorted keys, ASCII): same on both interpreters."""
    from protocol.jsonl import dump_value  # not at import: JSON lines stay off the boot path

    return dump_value(value)


def _writes_in(peeked):
    """The ``writes`` count of a peeked file; 0 if none or not a count."""
    if peeked is None or peeked[1] is None:
        return 0
    w = peeked[1].get("writes", 0)
    return w if type(w) is int and w >= 0 else 0


def decode_file(data):
    """Parse and check the bytes of a config file -> ``(cfg, detail)``.

    ``detail`` is "" or says the config was migrated. Raises ``ConfigError`` saying
    what is wrong (the caller treats it as corrupt).
    """
    data, doc = _parse(data)
    return _check_doc(doc, data)


def _parse(data):
    """Bytes -> ``(data, doc)``: UTF-8, JSON, an object, not too deep."""
    if not data:
        raise ConfigError("", "file is empty")
    try:
        if max(data) > 0x7F:  # ASCII (every file save writes) is UTF-8: no copy made
            data.decode()
    except UnicodeError:
        raise ConfigError("", "file is not UTF-8 text") from None
    from protocol import jsonparse  # configuring only: device.app._release forgets it

    try:
        # the protocol's strict parser: bounded depth, duplicate keys and bad UTF-8
        # refused, the same verdict on both interpreters
        doc = jsonparse.loads(data, max_depth=_MAX_DEPTH + 1, max_len=MAX_FILE_BYTES)
    except jsonparse.JSONError as e:
        if e.reason.startswith("nesting deeper"):
            doc = None
        else:
            raise ConfigError("", "file is not valid JSON (truncated?): %s" % e) from None
    if doc is None or _deeper_than(doc, _MAX_DEPTH):
        raise ConfigError("", "file is nested deeper than %d levels" % _MAX_DEPTH)
    if type(doc) is not dict:
        raise ConfigError("", "file holds %s, not an object" % type(doc).__name__)
    return data, doc


def _check_doc(doc, data):
    """The envelope and the config of a parsed file (its bytes ``data``) ->
    ``(cfg, detail)``."""
    for key in doc:
        if key not in ("config", "crc", "version", "writes"):
            raise ConfigError("", "file has an unknown key %s" % _show(key))
    version = doc.get("version")
    crc = doc.get("crc")
    cfg = doc.get("config")
    if type(version) is not int or type(crc) is not int or type(cfg) is not dict:
        raise ConfigError("", "file needs int version, int crc and an object config")
    writes = doc.get("writes", 0)
    if type(writes) is not int or writes < 0:
        raise ConfigError("", "file has a bad writes count %s" % _show(writes))
    if version > SCHEMA_VERSION:
        raise ConfigError(
            "",
            "schema version %d is newer than this firmware supports (%d)"
            % (version, SCHEMA_VERSION),
        )
    span = _body_span(data)
    if span is None or crc != crc16(data, span[0], span[1]):
        computed = crc16(canonical(cfg).encode())  # another layout: rare
        if crc != computed:
            raise ConfigError("", "CRC mismatch (stored %d, computed %d)" % (crc, computed))
    detail = ""
    if version < SCHEMA_VERSION:
        cfg = _migrate(cfg, version)
        detail = "migrated from schema version %d" % version
    filled = _fill_added(cfg)
    if filled:
        detail = (detail + "; " if detail else "") + (
            "%d key(s) added by this firmware set to factory values" % filled
        )
    try:
        validate(cfg)
    except ConfigError as e:
        raise ConfigError(e.path, "invalid value: " + str(e)) from None
    return cfg, detail


def _body_span(data):
    """``(start, end)`` of the config value's text in a file's bytes as ``save`` lays
    it out, or None (another layout)."""
    end = data.rfind(_CRC_KEY)
    if not data.startswith(_HEAD) or end < len(_HEAD):
        return None
    return len(_HEAD), end


_MIGRATIONS = {}  # version n -> fn(cfg) returning the version n+1 config; none yet

# Keys added to schema version 1 after its first release, with the factory value a
# config saved by an older firmware gets for them. Only these may be missing: any
# other missing key is still a corrupt file. (A key that changes meaning needs a
# schema version and a migration instead.)
_ADDED_IN_1 = (
    ("pid", "slew_down_pct_min"),
    ("pid", "deadband_mc"),
    ("pid", "i_band_mc"),
    ("pid", "die_sp_mc"),
    ("pid", "env_window_s"),
    ("pid", "ff_tau_ms"),
)


# Whole sections added to schema version 1 after its first release: a config saved by
# an older firmware gets their factory values (``model``: no chassis model).
_SECTIONS_ADDED_IN_1 = ("model",)


def _fill_added(cfg):
    """Fill the ``_ADDED_IN_1`` keys and ``_SECTIONS_ADDED_IN_1`` sections a stored
    config lacks; how many keys were filled."""
    n = 0
    factory = None
    for section in _SECTIONS_ADDED_IN_1:
        if section not in cfg:
            if factory is None:
                factory = defaults()
            cfg[section] = factory[section]
            n += len(factory[section])
    for section, key in _ADDED_IN_1:
        node = cfg.get(section)
        if type(node) is dict and key not in node:
            if factory is None:
                factory = defaults()
            node[key] = factory[section][key]
            n += 1
    return n


def _migrate(cfg, version):
    while version < SCHEMA_VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise ConfigError("", "no migration from schema version %d" % version)
        cfg = step(cfg)
        version += 1
    return cfg


def candidates(dirpath, fs=os, factory=True):
    """The configs to try at boot -> ``(cands, writes, problems)``.

    ``cands`` is a list of ``(source, cfg, detail)`` in the order the app tries
    them: ``("current", ...)`` if ``config.json`` decodes, ``("prev", ...)`` if
    ``config.prev.json`` decodes, and always last ``("factory", defaults(), ...)``.
    ``detail`` is a line for the boot log. ``writes`` is the lifetime save count
    (``flash_writes``). ``problems`` has one text per stored file found corrupt (it
    was renamed to ``.bad``): the app raises ``config_corrupt`` with it. An
    interrupted save is resolved first (module docstring). Never raises for a bad
    file.

    ``factory=False``: the factory entry's cfg is None, for a caller that
    makes ``defaults()`` only if it gets that far (the app at boot: one config fewer
    in RAM while the first one is built).
    """
    final = files.path(dirpath, FILE_NAME)
    note = _finish_save(fs, final, final + TMP_SUFFIX)
    problems = []
    cands = []
    writes = 0
    for source, name, what in (
        ("current", FILE_NAME, "loaded " + FILE_NAME),
        ("prev", PREV_NAME, PREV_NAME + ", the config before the last save"),
    ):
        got = _candidate(fs, files.path(dirpath, name), name, problems)
        if got is None:
            continue
        cfg, detail, w = got
        writes = w if w > writes else writes
        if cfg is not None:
            cands.append((source, cfg, what + (", " + detail if detail else "")))
    cands.append(("factory", defaults() if factory else None, "factory defaults"))
    if note:
        source, cfg, detail = cands[0]
        cands[0] = (source, cfg, detail + " (" + note + ")")
    return cands, writes, problems


def _candidate(fs, path, name, problems):
    """None if ``path`` is missing, else ``(cfg or None, detail, writes)``."""
    try:
        data = files.read(fs, path, MAX_FILE_BYTES)
    except OSError as e:
        problems.append(_set_aside(fs, path, name, "cannot read it: %s" % e))
        return None
    if data is None:
        return None
    writes = 0
    try:
        data, doc = _parse(data)
        writes = _writes_in((data, doc))
        cfg, detail = _check_doc(doc, data)
    except ConfigError as e:
        problems.append(_set_aside(fs, path, name, e.problem))
        return None, "", writes
    return cfg, detail, writes


def _finish_save(fs, final, tmp):
    """Resolve a ``.tmp`` left by an interrupted save; returns a note or ""."""
    if not files.exists(fs, tmp):
        return ""
    if files.exists(fs, final):
        files.remove_quiet(fs, tmp)  # cut before the renames: the old file stands
        return ""
    try:
        data = files.read(fs, tmp, MAX_FILE_BYTES)
        if data is None:
            return ""
        decode_file(data)
        fs.rename(tmp, final)  # cut between the renames: complete the save
    except (ConfigError, OSError):
        files.remove_quiet(fs, tmp)
        return "removed an unfinished %s%s" % (FILE_NAME, TMP_SUFFIX)
    return "recovered from an interrupted save"


def _set_aside(fs, path, name, why):
    """Rename a corrupt file to ``.bad`` (once: the next boot finds it missing)."""
    try:
        files.rename_over(fs, path, path + BAD_SUFFIX)
        kept = "kept as %s%s" % (name, BAD_SUFFIX)
    except OSError:
        kept = "could not rename it to %s%s" % (name, BAD_SUFFIX)
    return "%s: %s; %s" % (name, why, kept)


def load(dirpath, fs=os):
    """The config to boot -> ``(cfg, status, detail)``: the first of ``candidates``.

    ``status`` is ``"ok"`` (config.json), ``"prev"`` (config.prev.json: config.json
    is missing), ``"missing"`` (nothing stored: factory defaults) or ``"corrupt"``
    (a stored file was corrupt and set aside; config.prev.json or the factory
    defaults in use). ``detail`` says what was found and the flash write count.
    Never raises for a bad file. The app uses ``candidates`` directly, to fall back
    when the first config does not configure.
    """
    cands, writes, problems = candidates(dirpath, fs)
    source, cfg, detail = cands[0]
    if source == "current":
        status = "ok"
    elif problems:
        status = "corrupt"
        detail = "; ".join(problems) + "; in use: " + detail
    else:
        status = "prev" if source == "prev" else "missing"
        if source == "factory":
            detail = "no %s: %s" % (FILE_NAME, detail)
    if source == "current" and problems:
        detail += "; " + "; ".join(problems)
    return cfg, status, "%s; flash writes: %d" % (detail, writes)


def factory_reset(dirpath, fs=os):
    """Delete the stored configs (and any ``.tmp``); return fresh factory defaults.

    The next boot then loads defaults with status ``missing``. ``.bad`` files are
    left for diagnosis. The flash write count starts again from 0. Removal order
    (``.tmp``, ``config.prev.json``, ``config.json``) means a power cut leaves the
    current config in place: the reset, never acknowledged, did not happen.
    """
    final = files.path(dirpath, FILE_NAME)
    files.remove_quiet(fs, final + TMP_SUFFIX)
    for path in (files.path(dirpath, PREV_NAME), final):
        if files.exists(fs, path):
            fs.remove(path)  # an OSError here means flash trouble: let the caller nack
    return defaults()
