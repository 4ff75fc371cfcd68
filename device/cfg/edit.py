"""Config edits and views (``device.config``'s second part): ``merge`` for
``config_set`` and the commands that change a config, ``flatten``/``unflatten``,
``get_section`` and ``pages`` for ``config_get``. What they guarantee:
device/config.py's docstring."""

from device.cfg.schema import SCHEMA, ConfigError, _err, _show, validate

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


MAX_ENTRIES = 64  # text keys in one config / config_set message (catalog)
_MAX_DEPTH = const(6)  # device.cfg.schema's (module-private constants are not importable)


def _copy(v, parts=None, depth=1):
    """Deep copy of a plain value; ConfigError (at ``parts``) past ``_MAX_DEPTH``."""
    if isinstance(v, dict):
        if depth > _MAX_DEPTH:
            raise _too_deep(parts)
        return {k: _copy(x, parts, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        if depth > _MAX_DEPTH:
            raise _too_deep(parts)
        return [_copy(x, parts, depth + 1) for x in v]
    return v


def _too_deep(parts):
    return _err(parts or [], "nested deeper than %d levels" % _MAX_DEPTH)


# --- merge (config_set) ------------------------------------------------------------------


def merge(base, changes):
    """Return a new config: ``base`` with ``changes`` applied, validated as a whole.

    ``changes`` maps keys to values. A key is a dotted path (``"pid.kp"``,
    ``"channels.1.setpoint_mc"``) or a plain key whose value is a nested dict of
    partial changes (``{"pid": {"kp": 4000}}``, ``{"channels": {"1": {...}}}``). A
    list value replaces the whole list. Keys are applied in sorted order, so a
    deeper key overrides a shallower one on both interpreters. ``base`` is never
    modified; on any error ``ConfigError`` is raised and nothing changed.
    """
    if type(changes) is not dict:
        raise ConfigError("", "changes must be an object, got %s" % _show(changes))
    cfg = _copy(base)
    keys = list(changes)
    for k in keys:
        if type(k) is not str or not k:
            raise ConfigError("", "keys must be non-empty text, got %s" % _show(k))
    for key in sorted(keys):
        parts = [_index_or_key(p) for p in key.split(".")]
        _apply(cfg, parts, _copy(changes[key], parts), [])
    validate(cfg)
    return cfg


def _index_or_key(p):
    return int(p) if p.isdigit() else p


def _apply(node, parts, value, done):
    """Set ``value`` at ``parts`` below ``node``; dicts merge into dicts."""
    head = parts[0]
    here = done + [head]
    if type(node) is dict:
        if type(head) is int:
            head = str(head)
            here = done + [head]
        if len(parts) > 1 and head not in node:
            raise _err(here, "unknown key")
        if len(parts) == 1:
            old = node.get(head)
            if type(value) is dict and type(old) in (dict, list):
                _merge_into(old, value, here)
            else:
                node[head] = value  # an unknown key here is reported by validate()
            return
        _apply(node[head], parts[1:], value, here)
    elif type(node) is list:
        if type(head) is not int or head >= len(node):
            raise _err(here, "no such item (indices 0..%d)" % (len(node) - 1))
        here = done + [head]
        if len(parts) == 1:
            if type(value) is dict and type(node[head]) in (dict, list):
                _merge_into(node[head], value, here)
            else:
                node[head] = value
            return
        _apply(node[head], parts[1:], value, here)
    else:
        raise _err(done, "is a value, not a section (cannot set %s inside it)" % _show(head))


def _merge_into(node, changes, done):
    pairs = sorted([(str(k), v) for k, v in changes.items()], key=lambda kv: kv[0])
    for k, v in pairs:
        _apply(node, [_index_or_key(k)], v, done)


# --- flatten / sections (config_get) ----------------------------------------------------


def _expandable(v):
    if type(v) is dict:
        return True
    if type(v) is list and v:
        for x in v:
            if type(x) is not dict:
                return False
        return True
    return False


def flatten(value, prefix=""):
    """``{"pid": {"kp": 1}}`` -> ``{"pid.kp": 1}``; lists of dicts by index
    (``"channels.0.beta"``), other lists stay whole values. ConfigError for dicts
    nested deeper than ``_MAX_DEPTH``."""
    out = {}
    _flatten_into(out, value, prefix, 1)
    return out


def _flatten_into(out, v, prefix, depth):
    if not _expandable(v):
        out[prefix] = v
        return
    if depth > _MAX_DEPTH:
        raise ConfigError(prefix, "nested deeper than %d levels" % _MAX_DEPTH)
    items = v.items() if type(v) is dict else enumerate(v)
    for k, x in items:
        key = str(k) if not prefix else prefix + "." + str(k)
        _flatten_into(out, x, key, depth + 1)


def unflatten(flat):
    """Inverse of ``flatten``: dotted keys -> nested dicts, with dicts whose keys are
    exactly "0".."n-1" turned back into lists. ConfigError for a key of more than
    ``_MAX_DEPTH`` parts."""
    root = {}
    for key in flat:
        parts = key.split(".")
        if len(parts) > _MAX_DEPTH:
            raise ConfigError(key, "nested deeper than %d levels" % _MAX_DEPTH)
        node = root
        for p in parts[:-1]:
            nxt = node.get(p)
            if type(nxt) is not dict:
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = flat[key]
    return _listify(root)


def _listify(v):
    if type(v) is not dict:
        return v
    for k in list(v):
        v[k] = _listify(v[k])
    n = len(v)
    if n and all([str(i) in v for i in range(n)]):
        return [v[str(i)] for i in range(n)]
    return v


def get_section(cfg, name, limit=MAX_ENTRIES):
    """Flat ``{dotted key: value}`` map of one section for a ``config`` message.

    ``name`` is a top-level key (``"pid"``, ``"watchdog_ms"``) or a dotted path
    (``"channels.2"``, ``"pid.kp"``). Keys are full dotted paths, ready to send back
    in ``config_set``. Raises ``ConfigError`` for an unknown name or when the map has
    more than ``limit`` entries (``limit=None``: no limit).
    """
    if type(name) is not str or not name:
        raise ConfigError("", "section must be non-empty text, got %s" % _show(name))
    node = cfg
    done = []
    for p in name.split("."):
        k = _index_or_key(p)
        if type(node) is dict and p in node:
            node = node[p]
        elif type(node) is list and type(k) is int and k < len(node):
            node = node[k]
        else:
            raise _err(
                done + [k], "no such section; sections are %s" % ", ".join(_section_names(cfg))
            )
        done.append(k)
    flat = flatten(node, name)
    if limit is not None and len(flat) > limit:
        hint = ""
        if type(node) is list:
            hint = ": ask for %s.0 .. %s.%d" % (name, name, len(node) - 1)
        raise ConfigError(
            name, "%d entries do not fit one message (max %d)%s" % (len(flat), limit, hint)
        )
    return flat


def _section_names(cfg):
    names = [f[0] for f in SCHEMA[1]]
    if "_comment" in cfg:
        names.append("_comment")
    return names


def pages(cfg, limit=MAX_ENTRIES):
    """Section names whose ``get_section`` maps each fit in ``limit`` entries and
    together cover the whole config, in schema order: how to answer a ``config_get``
    without a section."""
    out = []
    for name in _section_names(cfg):
        v = cfg[name]
        if len(flatten(v, name)) <= limit or type(v) is not list:
            out.append(name)
        else:
            for i in range(len(v)):
                out.append("%s.%d" % (name, i))
    return out
