"""Module configuration: factory defaults, validation, merge, and storage in flash.

Runs unchanged on MicroPython and CPython. Config is read at boot and changed by
commands only, never in the control tick, so this module allocates freely and uses
floats (Steinhart-Hart coefficients).

The configuration is a nested dict of plain JSON values (see ``defaults()``). Units
are in the names (``_mc`` milli-degC, ``_ms``, ``_mv``, ``_ma``, ``_uohm``, ``_us``);
duties are ints 0..65535 like ``machine.PWM.duty_u16``; PID gains are in milli-units
as in the ``pid_gains`` message (``kp`` 5000 = 5 % duty per degC).

API
---
``defaults()``, ``DEFAULTS``    a fresh factory config (built per call: no RAM copy)
``SCHEMA``                      every key, its type and range (a constant, in flash)
``validate(cfg)``               raises ``ConfigError`` naming the path and the problem
``merge(base, changes)``        new validated config with ``config_set`` changes applied
``save(cfg, dirpath)``          -> bool: store atomically, keep the previous config;
                                False (nothing written) when nothing changed
``is_saved(cfg, dirpath)``      -> bool: config.json stores exactly ``cfg``
``candidates(dirpath)``         -> ``(cands, writes, problems)``: what to try at boot
``load(dirpath)``               -> ``(cfg, status, detail)``, the first candidate,
                                status ``ok|prev|missing|corrupt``
``flash_writes(dirpath)``       lifetime number of saves (flash wear)
``factory_reset(dirpath)``      delete the stored configs, return the defaults
``get_section(cfg, name)``      flat ``{dotted key: value}`` map for ``config_get``
``pages(cfg)``                  section names whose maps each fit one ``config`` message
``flatten`` / ``unflatten``     nested config <-> dotted keys
``encode_file`` / ``decode_file``  the bytes of a stored file <-> a config

Storage functions take ``fs=os`` (a stand-in with ``stat``, ``rename``, ``remove``
and optionally ``fsync``/``sync``, for tests).

Where it lives: this module is the API for the host's tools and the tests, and
holds nothing itself: a name read from it is looked up in the parts (module
``__getattr__``), which the firmware imports one by one, each when a command needs it
(a configuring command that imported all of it needed one 776 B block for its module
dict, the first block the fragmentation stress found missing; each part's dict is at
most 296 B): ``device.cfg.schema`` (``defaults``, ``SCHEMA``, ``validate``,
``ConfigError``), ``device.cfg.edit`` (``merge``, ``flatten``, ``unflatten``,
``get_section``, ``pages``), ``device.cfg.store`` (``decode_file``, ``candidates``,
``load``, ``factory_reset``, ``canonical``), ``device.cfg.writer`` (``save``,
``is_saved``, ``flash_writes``, ``encode_file``) and ``device.cfg.files`` (the file
primitives, every file opened through ``files.open_file``, and the learned record).

Errors carry the path twice: ``str(e)`` reads ``channels[2].crit_mc: must be > warn_mc
(110000), got 100000`` for a human; ``e.path`` is the dotted key ``channels.2.crit_mc``
that ``config_set`` uses (the nack ``field``) and ``e.problem`` the text after it.

What validation guarantees
--------------------------
Besides types and ranges of every field and the rules between fields:

- floors are code (``device/floors.py``), config can raise them, never lower them:
  every ``safety.<key>`` >= its ``floors.SAFETY_MINIMUMS`` entry (``critical`` is
  exactly 100 %), ``fans.*.min_duty`` >= the fan model's ``min_spin``,
  ``kick_duty`` >= its ``kick`` and ``kick_ms`` >= its ``kick_ms``. The board's fan
  model is not known here, so the default model (``floors.fan_model(None)``) is the
  floor; ``device.safety`` applies the board's own at run time;
- a channel's ``correction`` (added to the model temperature, as ``device.calib``
  does) stays within +-``floors.CAL_BAND_MC`` at every whole degC from -20 to 150;
- no value nests containers deeper than ``_MAX_DEPTH`` (6; the schema needs 4):
  ``merge``, ``flatten``, ``unflatten`` and file decoding refuse deeper values with
  a ``ConfigError`` ("nested deeper than 6 levels") before anything recursive walks
  them, and error messages never ``repr`` such a value.

Dotted keys (the protocol form)
-------------------------------
``config``/``config_set`` carry a map with text keys, at most 64 entries. A key is the
path of a leaf: dict keys and list indices joined by dots, ``"pid.kp"``,
``"channels.1.setpoint_mc"``, ``"fans.0.min_duty"``. Only dicts and lists of dicts
(``channels``, ``fans``) are expanded; every other list travels whole as one value:
``"curve.points": [[30000, 13107], ...]``, ``"channels.0.sh": [A, B, C]`` (floats)
or null, ``"channels.0.correction": []``. The whole config is about 100 entries, so
``config_get`` without a section is answered page by page (``pages()``); each page
is a top-level section, and a list section too big for one message is split per
item (``"channels.0"``...).

Storage
-------
Two files in ``<fs_dir>``: ``config.json``, the current config, and
``config.prev.json``, the config that was current before the last save (the
last-good copy). Each holds one line of canonical JSON (below)::

    {"config":{...},"crc":12345,"version":1,"writes":7}

``crc`` is the CRC-16 (``protocol.crc``) of the bytes of the ``config`` value exactly
as written. Decoding checks those raw bytes, so the check never depends on how an
interpreter prints a float (single-precision MCU builds print fewer digits than
CPython); a file rewritten by hand or by a host tool in another layout is accepted if
the CRC matches the canonical serialisation of its parsed ``config`` instead.
``writes`` is the lifetime number of saves (this file was save number ``writes``);
the CRC does not cover it. A file without it (written before it existed, or by
``encode_file(cfg)``, e.g. ``modbridge flash``) counts as 0.

Canonical JSON is ``protocol.jsonl.dump_value``: compact, keys sorted, ASCII only,
identical bytes on both interpreters (MicroPython's ``json.dumps`` has neither
``sort_keys`` nor a stable dict order).

Flash wear: ``save`` first reads ``config.json``; if it stores exactly the canonical
bytes of ``cfg`` (same schema version, CRC good) it returns False without opening
anything for writing, renaming or removing. Otherwise the new file is save number
``max(writes of config.json, writes of config.prev.json) + 1``. ``flash_writes``
reports that count; ``factory_reset`` deletes the files, so it restarts from 0, and
a file set aside as corrupt no longer counts.

A save, step by step (a power cut can stop it anywhere; no ack is sent before it
returns):

1. write ``config.json.tmp``, flush it (``os.fsync`` on CPython, ``os.sync()`` on
   MCU ports that have it);
2. if ``config.json`` decodes: rename it to ``config.prev.json`` (the older prev is
   replaced; a corrupt current is not kept as the last good copy);
3. rename ``config.json.tmp`` to ``config.json``; sync.

Rename replaces the target on littlefs and POSIX (checked on the MicroPython unix
port, and on its ``VfsLfs2`` and ``VfsFat``). A FAT driver that refuses with EEXIST
gets the target removed first (``_rename_over``). An OSError in step 3 renames the
current config back from ``config.prev.json`` (the older prev is then gone) and
removes the ``.tmp``. What an interrupted save leaves, and what boot
(``candidates``) makes of it:

- cut in step 1 or 2 (``config.json`` present, ``.tmp`` partial or complete; on
  FAT maybe ``config.prev.json`` already removed): the save never happened; the
  ``.tmp`` is deleted and ``config.json`` is current (without a prev, in the FAT
  case);
- cut between the renames (``config.prev.json`` and a complete ``.tmp``, no
  ``config.json``; also a first save cut before its rename, or FAT replacing a
  corrupt current): the ``.tmp`` was flushed in step 1, so it is checked and
  renamed into place: the save completes (the detail says "recovered from an
  interrupted save"); a ``.tmp`` that does not decode is deleted ("removed an
  unfinished config.json.tmp") and boot falls back to ``config.prev.json`` (the
  config that was running) or the factory defaults;
- cut after step 3: done.

Boot: ``candidates`` -> ``(cands, writes, problems)``.

- ``cands``: ``(source, cfg, detail)`` tuples in the order to try, each ``cfg`` a
  fresh object: ``("current", ...)`` if config.json decodes, ``("prev", ...)`` if
  config.prev.json decodes, always last ``("factory", defaults(), ...)``;
  ``detail`` is a line for the boot log;
- ``writes``: the lifetime save count (of the files as found);
- ``problems``: one text per stored file that did not decode (unreadable, not
  UTF-8, not JSON, nested too deep, wrong envelope, CRC mismatch, schema version
  newer than this firmware or with no migration, invalid values), e.g.
  ``"config.json: CRC mismatch (stored 1, computed 2); kept as config.json.bad"``.
  The file is renamed to ``<name>.bad`` for diagnosis, so the next boot no longer
  sees it and the problem is reported once.

The app configures the real objects from each candidate in turn and uses the first
that works. It raises ``REASON_CONFIG_CORRUPT`` for the problems (their text as the
event text) and ``REASON_CONFIG_FALLBACK`` when it runs a candidate other than
``"current"`` while something was stored, i.e. ``source != "current" and
(len(cands) > 1 or problems)``: value 1 for ``"prev"``, 0 for ``"factory"``. A
first boot (nothing stored: ``cands`` is the factory entry alone, no problems) is
not a fallback.

Status of ``load`` (the first candidate, for callers that need no fallback):

- ``ok``       config.json (maybe migrated from an older schema version, or
  recovered from an interrupted save);
- ``prev``     config.json is missing (set aside as corrupt at an earlier boot, or
  an interrupted save's ``.tmp`` did not decode): config.prev.json;
- ``missing``  nothing stored: factory defaults, a normal first boot, no event;
- ``corrupt``  a stored file was corrupt and set aside; config.prev.json or the
  factory defaults are in use; the caller raises ``REASON_CONFIG_CORRUPT`` with the
  detail as its text.

``detail`` ends with the lifetime save count (``"...; flash writes: 7"``).

Schema versions and migration: ``SCHEMA_VERSION`` is 1, the only version so far, so
``_MIGRATIONS`` is empty. When the schema changes, bump ``SCHEMA_VERSION``
(device.cfg.schema) and add ``_MIGRATIONS[n] = fn`` (device.cfg.store) where
``fn(cfg)`` turns a version-n config into version n+1 (including its ``"version"``
field); decoding chains them and validates the result. A stored version without a
migration path is corrupt.
"""

from device.cfg import edit, files, schema, store, writer

_PARTS = (schema, edit, store, writer, files)


def __getattr__(name):
    """A name of the API, from the part that holds it; ``DEFAULTS`` (for host tools and
    tests) is the factory config, a fresh copy from ``defaults()`` on every access."""
    if name == "DEFAULTS":
        return schema.defaults()
    for part in _PARTS:
        try:
            return getattr(part, name)
        except AttributeError:
            pass
    raise AttributeError(name)
