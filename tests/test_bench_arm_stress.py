"""The stress bench's bookkeeping (bench/bench_arm_stress.py): which pool counts as the
smallest passing one, and the long run's keys. The runs themselves are qemu's (make
bench / make soak); here they are result rows as ``run_seed`` returns them."""

from bench import bench_arm_stress as S


def _rows(pool, fails=()):
    """Both modes of seeds 1..3 at ``pool``; ``fails``: (seed, mode) that failed."""
    out = []
    for seed in (1, 2, 3):
        for mode, _ in S.MODES:
            ok = (seed, mode) not in fails
            row = {"seed": seed, "mode": mode, "pool": pool, "ok": int(ok), "secs": 1.0}
            if ok:
                row.update(ops=1000, low_free=64 * seed)
            else:
                row.update(op=17, what="config_get", error="MemoryError")
            out.append(row)
    return out


def test_probed_min_is_the_lowest_pool_with_every_pool_above_it_passing():
    cache = {86656: _rows(86656), 73728: _rows(73728), 70656: _rows(70656)}
    assert S.probed_min_kb(cache) == 69.0
    # a failure above makes the pools under it not count, whatever they did
    cache[73728] = _rows(73728, fails={(2, "collect")})
    assert S.probed_min_kb(cache) == round(86656 / 1024, 2)
    cache[86656] = _rows(86656, fails={(1, "garbage")})
    assert S.probed_min_kb(cache) is None


def test_goal_keys_when_both_sweeps_pass():
    k = S.goal_keys(_rows(86656), _rows(73728), 50, 1000)
    assert k["arm_stress_long_memoryerrors"] == 0
    assert k["arm_stress_long_goal_memoryerrors"] == 0
    assert k["arm_stress_long_seeds"] == 50 and k["arm_stress_long_ops"] == 1000
    assert k["arm_stress_long_pool_bytes"] == 86656
    assert k["arm_stress_long_low_free_bytes"] == 64
    assert k["arm_stress_long_goal_kb"] == S.GOAL_KB == 72
    assert k["arm_stress_min_heap_kb"] == 72.0
    assert k["arm_stress_min_heap_margin_pct"] == round(100 * (1 - 73728 / 86656), 1)
    assert k["arm_stress_min_heap_probes"] == 2


def test_goal_keys_when_the_goal_pool_fails():
    k = S.goal_keys(_rows(86656), _rows(73728, fails={(3, "garbage")}), 50, 1000)
    assert k["arm_stress_long_goal_memoryerrors"] == 1
    assert k["arm_stress_min_heap_kb"] == round(86656 / 1024, 2)  # only the F411 pool


def test_goal_keys_when_the_f411_pool_fails():
    k = S.goal_keys(_rows(86656, fails={(1, "collect")}), _rows(73728), 50, 1000)
    assert k["arm_stress_long_memoryerrors"] == 1
    # no pool qualifies: the answer is above the F411's pool, the margin negative
    assert k["arm_stress_min_heap_kb"] == 85.0
    assert k["arm_stress_min_heap_margin_pct"] < 0


def test_nonmonotone_names_a_failure_above_a_pass():
    cache = {70656: _rows(70656), 71680: _rows(71680, fails={(2, "garbage")})}
    assert S.nonmonotone(cache) == [(71680, 2, "garbage")]
