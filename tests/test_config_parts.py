"""device.config in parts (device/cfg/): the facade answers every name of its API from
the parts, a configuring command imports only small module dicts, and boot makes the
factory defaults only when it needs them.

DUAL: runs on CPython and under MicroPython (the unix port and qemu-arm).
"""

from fakehal import FakeHal
from mpcompat import IS_MICROPYTHON, raises, tmpdir

from device import commands, config
from device.cfg import edit, files, schema, store, writer

DUAL = True

# A MicroPython dict holding n names has a table of the first of these sizes >= n
# (py/map.c), 8 bytes a slot: 37 slots are 296 B. device.config's module dict was 97
# slots (776 B), the block the fragmentation stress at 74 KB pools found missing.
_SIZES = (0, 2, 4, 6, 8, 10, 12, 17, 23, 29, 37, 47, 59, 73, 97)
_MAX_SLOTS = 37


def _slots(n):
    for s in _SIZES:
        if s >= n:
            return s
    return 1000


def test_each_part_and_the_commands_module_dict_is_small():
    if not IS_MICROPYTHON:
        return  # CPython keeps the const() names as globals: MicroPython's count counts
    for mod in (schema, edit, store, writer, files, commands):
        names = len(mod.__dict__)
        assert _slots(names) <= _MAX_SLOTS, (mod.__name__, names)


def test_the_facade_answers_from_the_parts():
    assert config.validate is schema.validate
    assert config.ConfigError is schema.ConfigError
    assert config.merge is edit.merge and config.pages is edit.pages
    assert config.candidates is store.candidates and config.decode_file is store.decode_file
    assert config.save is writer.save and config.encode_file is writer.encode_file
    assert config.load_learned is files.load_learned
    assert config._MIGRATIONS is store._MIGRATIONS
    assert config.DEFAULTS == schema.defaults() and config.DEFAULTS is not config.DEFAULTS
    with raises(AttributeError):
        config.no_such_name  # noqa: B018 - the lookup is the test


def test_the_parts_share_one_error_class():
    with raises(schema.ConfigError):
        edit.merge(schema.defaults(), {"pid.kp": -1})
    with raises(schema.ConfigError):
        store.decode_file(b"{}")


def test_candidates_can_leave_the_factory_config_unmade():
    d = tmpdir()
    writer.save(schema.defaults(), d)
    made, w1, p1 = store.candidates(d)
    lazy, w2, p2 = store.candidates(d, factory=False)
    assert [c[0] for c in lazy] == [c[0] for c in made] == ["current", "factory"]
    assert lazy[0] == made[0] and (w1, p1) == (w2, p2)
    assert made[-1][1] == schema.defaults() and lazy[-1][1] is None
    assert lazy[-1][2] == made[-1][2] == "factory defaults"


def test_boot_from_factory_makes_the_defaults():
    from device.app import App

    app = App(FakeHal())  # nothing stored: the factory entry is the one built
    assert app.config_source == "factory" and app.cfg == schema.defaults()
