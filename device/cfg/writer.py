"""Saving the config (``device.config``'s fourth part: ``save``, ``is_saved``,
``flash_writes``, ``encode_file``), imported by ``config_save`` and the host's tools.
The file format and the save's steps: device/config.py's docstring."""

import os

from device.cfg import files
from device.cfg.schema import SCHEMA_VERSION, validate
from device.cfg.store import (
    FILE_NAME,
    MAX_FILE_BYTES,
    PREV_NAME,
    TMP_SUFFIX,
    ConfigError,
    _check_doc,
    _parse,
    _writes_in,
    canonical,
)
from protocol.crc import crc16

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


def _pieces(v):
    """``canonical(v)`` in pieces (a scalar, a key, a bracket): ``"".join`` of them is
    the same text, but saving and comparing never hold it whole (one ~1.8 KB string
    is a block a fragmented 90 KB heap may not have)."""
    from protocol.jsonl import dump_value  # device.app._release() forgets it

    if isinstance(v, dict):
        sep = "{"
        for k in sorted(v):
            yield sep + dump_value(str(k)) + ":"
            yield from _pieces(v[k])
            sep = ","
        yield "}" if sep == "," else "{}"
    elif isinstance(v, (list, tuple)):
        sep = "["
        for x in v:
            yield sep
            yield from _pieces(x)
            sep = ","
        yield "]" if sep == "," else "[]"
    else:
        yield dump_value(v)


_HEAD = const(b'{"config":')
_CRC_KEY = const(b',"crc":')
_CRC_INIT = const(0xFFFF)  # protocol.crc.INIT
_CHUNK = const(256)  # about the bytes per write of a file being saved
_SCAN = const(128)  # save()'s read buffer; a trailer is < 64 bytes


def _trailer(crc, writes):
    return ',"crc":%d,"version":%d,"writes":%d}\n' % (crc, SCHEMA_VERSION, writes)


def encode_file(cfg, writes=0):
    """The exact text ``save`` writes for ``cfg`` as save number ``writes``
    (canonical envelope plus newline)."""
    body = canonical(cfg)
    return _HEAD.decode() + body + _trailer(crc16(body.encode()), writes)


def _write_file(f, cfg, writes):
    """Write ``encode_file(cfg, writes)`` to ``f`` from ``_pieces``, about ``_CHUNK``
    bytes a write, the CRC computed on the way."""
    parts = [_HEAD]
    size = len(_HEAD)
    crc = _CRC_INIT
    for piece in _pieces(cfg):
        b = piece.encode()
        crc = crc16(b, 0, -1, crc)
        parts.append(b)
        size += len(b)
        if size >= _CHUNK:
            f.write(b"".join(parts))
            parts = []
            size = 0
    parts.append(_trailer(crc, writes).encode())
    f.write(b"".join(parts))


def _holds(fs, path, cfg):
    """True if ``path`` stores exactly ``cfg``: its text is ``{"config":`` and the
    canonical text of ``cfg`` followed by the rest of the envelope, with the schema
    version and the CRC of that text, and the whole file is a JSON object (what
    ``_parse`` accepts). Compared piece by piece as read: neither the file nor the
    canonical text is held whole (the first difference ends it). False if the file is
    missing or unreadable."""
    try:
        size = fs.stat(path)[6]
    except OSError:
        return False
    if size > MAX_FILE_BYTES:
        return False  # ``_read`` refuses it: not a stored config
    try:
        with files.open_file(path, "rb") as f:
            if f.read(len(_HEAD)) != _HEAD:
                return False
            crc = _CRC_INIT
            for piece in _pieces(cfg):
                b = piece.encode()
                if f.read(len(b)) != b:
                    return False
                crc = crc16(b, 0, -1, crc)
            rest = f.read()
    except OSError:
        return False
    if rest.rfind(_CRC_KEY) != 0:
        return False  # ``,"crc":`` must end the config's text, as ``_body_span`` finds it
    try:
        # the body is one valid JSON value, so the file parses as an object exactly
        # when it does with a 0 in the body's place
        doc = _parse(b'{"config":0' + rest)[1]
    except ConfigError:
        return False
    return doc.get("version") == SCHEMA_VERSION and doc.get("crc") == crc


def save(cfg, dirpath, fs=os):
    """Validate ``cfg`` and store it as ``<dirpath>/config.json``; the config it
    replaces becomes ``config.prev.json``. True if written; False if the stored
    config is already exactly ``cfg`` (then nothing is opened for writing, renamed
    or removed: a repeated ``config_save`` costs no flash wear).

    Raises ``ConfigError`` (nothing written) or ``OSError`` from the filesystem
    (``config.json`` is as before, though a failure after the rotation loses the
    older ``config.prev.json``; a partial ``.tmp`` is removed when possible). ``fs``
    is the ``os`` module or a stand-in with ``rename``, ``remove``, ``stat`` (tests).
    The steps and what a power cut between them leaves: the module docstring.
    """
    validate(cfg)
    final = files.path(dirpath, FILE_NAME)
    prev = files.path(dirpath, PREV_NAME)
    tmp = final + TMP_SUFFIX
    if _holds(fs, final, cfg):
        return False
    # the stored files are scanned in pieces, never read whole (a 2 KB block is what
    # a fragmented heap refuses first): the trailer's writes count and the body's CRC
    buf = bytearray(_SCAN)
    crc_ok, writes = _scan(fs, final, buf)
    rotate = crc_ok  # a corrupt current is not kept
    writes = max(writes, _scan(fs, prev, buf)[1]) + 1
    buf = None
    files.write_tmp(fs, tmp, _write_file, cfg, writes)
    files.sync(fs)  # the .tmp is complete on flash before any rename
    if rotate:
        try:
            files.rename_over(fs, final, prev)
        except OSError:
            files.remove_quiet(fs, tmp)
            raise
    try:
        files.rename_over(fs, tmp, final)
    except OSError:
        if rotate:
            try:
                fs.rename(prev, final)  # put the current one back
            except OSError:
                pass
        files.remove_quiet(fs, tmp)
        raise
    files.sync(fs)
    return True


def is_saved(cfg, dirpath, fs=os):
    """True if ``config.json`` stores exactly ``cfg``: what ``save`` would skip (the
    app asks before it spends a flash-write token; it keeps no copy to compare)."""
    return _holds(fs, files.path(dirpath, FILE_NAME), cfg)


def flash_writes(dirpath, fs=os):
    """Lifetime number of saves: the ``writes`` count of the stored files (0 if none)."""
    final = files.path(dirpath, FILE_NAME)
    buf = bytearray(_SCAN)
    return max(_scan(fs, final, buf)[1], _scan(fs, files.path(dirpath, PREV_NAME), buf)[1])


def _scan(fs, path, buf):
    """``(intact, writes)`` of a stored file, read in ``len(buf)`` pieces: ``intact``
    if it is laid out as ``save`` writes it (``{"config":``, the body, a trailer that
    parses with this schema's version) and the body's CRC matches; ``writes`` its
    lifetime save count (0 if none or unreadable). What ``save`` needs of the
    current and the last-good file; ``load`` checks the whole file at boot."""
    try:
        size = fs.stat(path)[6]
        if size > MAX_FILE_BYTES or size < len(_HEAD) + len(_CRC_KEY):
            return False, 0
        with files.open_file(path, "rb") as f:
            n = len(buf)
            tail = size - n if size > n else 0
            f.seek(tail)
            got = f.readinto(buf)
            cut = bytes(buf[:got])
            at = cut.rfind(_CRC_KEY)
            if at < 0 or tail + at < len(_HEAD):
                return _scan_whole(fs, path)
            try:
                doc = _parse(b'{"config":0' + cut[at:])[1]
            except ConfigError:
                return _scan_whole(fs, path)
            w = doc.get("writes", 0)
            writes = w if type(w) is int and w >= 0 else 0
            f.seek(0)
            if f.read(len(_HEAD)) != _HEAD:
                return _scan_whole(fs, path)
            crc = _CRC_INIT
            left = tail + at - len(_HEAD)
            while left > 0:
                k = f.readinto(buf)  # whole pieces (CPython's readinto has no size)
                if not k:
                    return False, writes
                k = k if k < left else left
                crc = crc16(buf, 0, k, crc)
                left -= k
    except (OSError, ConfigError):
        return False, 0
    return doc.get("version") == SCHEMA_VERSION and doc.get("crc") == crc, writes


def _scan_whole(fs, path):
    """``_scan`` of a file in another layout (edited by hand; ``save`` rewrites it
    canonically once): read and checked whole, as ``load`` does."""
    try:
        data = files.read(fs, path, MAX_FILE_BYTES)
        if data is None:
            return False, 0
        data, doc = _parse(data)
    except (OSError, ConfigError):
        return False, 0
    writes = _writes_in((data, doc))
    try:
        _check_doc(doc, data)
    except ConfigError:
        return False, writes
    return True, writes
