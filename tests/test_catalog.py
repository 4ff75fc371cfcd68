"""Message catalog (protocol.catalog): internal consistency of the v1 tables, and their
descriptions (modbridge.firmware_host.catalog_doc)."""

from modbridge.firmware_host import catalog_doc
from protocol import catalog as C
from protocol import jsonl

DUAL = True

KINDS = (C.K_UINT, C.K_INT, C.K_STR, C.K_BYTES, C.K_BOOL, C.K_LIST, C.K_MAP, C.K_NUM, C.K_ENUM)
SCALES = (C.MILLI, C.DUTY_PCT, C.GAIN)


def _constants(prefix):
    """Module-level ints named prefix* (MicroPython keeps public const() names; the
    others are answered by the module's __getattr__ from its _LAZY pairs)."""
    out = {}
    names = list(dir(C))
    for i in range(0, len(C._LAZY), 2):
        names.append(C._LAZY[i])
    for name in names:
        if name.startswith(prefix):
            value = getattr(C, name)
            if isinstance(value, int) and not isinstance(value, bool):
                out[name[len(prefix) :]] = value
    return out


def test_type_ids_and_names_unique():
    ids = [m[C.M_TYPE] for m in C.MESSAGES]
    names = [m[C.M_NAME] for m in C.MESSAGES]
    assert len(set(ids)) == len(ids)
    assert len(set(names)) == len(names)
    for t in ids:
        assert 0 < t <= 0xFF, t


def test_lookups():
    for m in C.MESSAGES:
        assert C.by_type(m[C.M_TYPE]) is m
        assert C.by_name(m[C.M_NAME]) is m
        for i in range(len(m[C.M_FIELDS])):
            assert C.field_index(m, m[C.M_FIELDS][i][C.F_NAME]) == i
        assert C.field_index(m, "no_such_field") == -1
    assert C.by_type(0x7F) is None and C.by_name("nope") is None


def test_message_shape():
    for m in C.MESSAGES:
        assert len(m) == 4, m[C.M_NAME]
        assert m[C.M_DIR] in (C.D2H, C.H2D), m[C.M_NAME]
        assert isinstance(m[C.M_FIELDS], tuple), m[C.M_NAME]


def test_every_message_and_field_has_a_doc():
    # catalog_doc.py is the prose half of the catalog (host-only, for SPEC.md): one
    # entry per message (non-empty) and per field ("" allowed), and nothing stale.
    want = {}
    for m in C.MESSAGES:
        want[m[C.M_NAME]] = True
        for f in m[C.M_FIELDS]:
            want[(m[C.M_NAME], f[C.F_NAME])] = True
    for key in want:
        assert key in catalog_doc.DOCS, ("no doc in modbridge.firmware_host.catalog_doc", key)
        doc = catalog_doc.DOCS[key]
        assert isinstance(doc, str), key
        assert doc == doc.strip() and "\n" not in doc, key  # one table cell
        if type(key) is str:
            assert doc and catalog_doc.message_doc(key) is doc, key
        else:
            assert catalog_doc.field_doc(key[0], key[1]) is doc, key
    for key in catalog_doc.DOCS:
        assert key in want, ("doc for a message or field the catalog lacks", key)


def test_field_keys_unique_and_ascending():
    for m in C.MESSAGES:
        keys = [f[C.F_KEY] for f in m[C.M_FIELDS]]
        names = [f[C.F_NAME] for f in m[C.M_FIELDS]]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), m[C.M_NAME]
        assert len(set(names)) == len(names), m[C.M_NAME]
        for k in keys:
            # one-byte CBOR heads keep the payload map in catalog order
            assert 0 <= k < 24, (m[C.M_NAME], k)


def test_field_definitions():
    for m in C.MESSAGES:
        for f in m[C.M_FIELDS]:
            where = (m[C.M_NAME], f[C.F_NAME])
            assert len(f) == 8, where
            assert f[C.F_KIND] in KINDS, where
            assert f[C.F_REQUIRED] is True or f[C.F_REQUIRED] is False, where
            lo, hi = f[C.F_LO], f[C.F_HI]
            if lo is not None and hi is not None:
                assert lo <= hi, where
            if f[C.F_KIND] in (C.K_STR, C.K_BYTES, C.K_LIST, C.K_MAP) and lo is not None:
                assert lo >= 0, where  # a length
            if f[C.F_KIND] == C.K_UINT:
                assert lo is not None and lo >= 0, where
            if f[C.F_KIND] in (C.K_UINT, C.K_INT, C.K_ENUM):
                # every integer field is bounded and fits CBOR and the 32-bit MCU
                assert lo is not None and hi is not None, where
                assert -(2**31) <= lo and hi <= 2**32 - 1, where
            assert isinstance(f[C.F_UNIT], str), where


def test_enum_scales_are_tuples_of_names():
    seen = 0
    for m in C.MESSAGES:
        for f in m[C.M_FIELDS]:
            scale = f[C.F_SCALE]
            if f[C.F_KIND] == C.K_ENUM:
                assert isinstance(scale, tuple) and len(scale) > 0, f[C.F_NAME]
                for name in scale:
                    assert isinstance(name, str) and name, f[C.F_NAME]
                lowered = [n.lower() for n in scale]
                assert len(set(lowered)) == len(lowered), f[C.F_NAME]  # case-insensitive
                assert f[C.F_LO] == 0 and f[C.F_HI] >= len(scale) - 1, f[C.F_NAME]
                seen += 1
            elif scale is not None:
                # display scales only on integer fields, and only the known ones
                assert f[C.F_KIND] in (C.K_INT, C.K_UINT), f[C.F_NAME]
                assert scale in SCALES, f[C.F_NAME]
    assert seen >= 8


def test_display_scales():
    for mul, div, dec in SCALES:
        assert mul == 1 or mul % 1000 == 0
        assert 0 < div and 0 <= dec < 7
    # the duty scale keeps its intermediates small (see jsonl.mul_div_round)
    assert C.DUTY_MAX * (C.DUTY_PCT[0] // 1000) < 2**30


def test_header_names_do_not_collide():
    for m in C.MESSAGES:
        for f in m[C.M_FIELDS]:
            assert f[C.F_NAME] not in jsonl.HEADER_KEYS, (m[C.M_NAME], f[C.F_NAME])


def test_state_constants():
    consts = _constants("STATE_")
    assert len(consts) == len(C.STATES)
    for name in consts:
        assert C.STATES[consts[name]] == name, name


def test_reason_constants():
    consts = _constants("REASON_")
    assert len(consts) == len(C.REASONS) == 28
    for name in consts:
        assert C.REASONS[consts[name]] == name.lower(), name


def test_error_constants():
    consts = _constants("ERR_")
    assert len(consts) == len(C.ERRORS)
    for name in consts:
        assert C.ERRORS[consts[name]] == name.lower(), name
    assert C.ERR_OK == 0


def test_severity_constants():
    consts = _constants("SEV_")
    assert len(consts) == len(C.SEVERITIES)
    for name in consts:
        assert C.SEVERITIES[consts[name]] == name.lower(), name


def test_type_constants_match_messages():
    consts = _constants("T_")
    assert len(consts) == len(C.MESSAGES)
    for name in consts:
        m = C.by_type(consts[name])
        assert m is not None, name
        assert m[C.M_NAME] == name.lower(), (name, m[C.M_NAME])


def test_fault_bits():
    consts = _constants("FAULT_")
    assert len(consts) == len(C.FAULT_BITS)
    for name in consts:
        bit = consts[name]
        assert bit & (bit - 1) == 0 and bit > 0, name  # a single bit
        assert name.lower() in C.FAULT_BITS, name
        assert bit == 1 << C.FAULT_BITS.index(name.lower()), name
    # the mask fits the telemetry faults field
    faults = C.by_name("telemetry")[C.M_FIELDS][3]
    assert faults[C.F_NAME] == "faults"
    assert (1 << len(C.FAULT_BITS)) - 1 <= faults[C.F_HI]


def test_enumerations_are_distinct_names():
    for table in (
        C.STATES,
        C.REASONS,
        C.SEVERITIES,
        C.ERRORS,
        C.CHANNELS,
        C.FAN_MODES,
        C.CAL_MODELS,
    ):
        assert len(set(table)) == len(table)
        for name in table:
            assert isinstance(name, str) and name


def test_bounds_constants():
    assert C.TEMP_MIN_MC < 0 < C.TEMP_MAX_MC
    assert C.DUTY_MAX == C.U16 == 0xFFFF
    assert C.U32 == 2**32 - 1 and C.I32_MIN == -(2**31) and C.I32_MAX == 2**31 - 1
