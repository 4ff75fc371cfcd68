"""Chassis the suite never saw: the control suite's method on generated chassis.

    python -m bench.run chassis                       # 8 + 8 chassis + 4 worlds (`make soak`)
    python -m bench.bench_chassis --train 2 --val 2   # a look (prints, writes nothing)
    python -m bench.bench_chassis --rooms both --out chassis_cases.json

Issue 25, item 7. The same machinery as the control suite (bench/bench_control.py:
the real firmware lockstepped with the world, the bench playing the host with signed
heartbeats carrying the GPU's slowdown, ``metrics``, ``limit_cycle``, the curve family
searched with ``fast_curve``, the oracle), on three sets:

``train``    the first ``TRAIN_N`` of ``chassis.TRAIN_SEEDS`` (host/modbridge/sim/
             chassis.py): the only generated chassis tuning may look at
``val``      the first ``VAL_N`` of ``chassis.VAL_SEEDS``: scored separately, never
             tuned on
``shipped``  the four world files (``bench_control.WORLDS``) in ``SHIPPED_ROOMS_C``'s
             hot room (40 degC; ``--no-shipped`` leaves them out)

Each generated chassis runs in its hot room (``--rooms both``: its two rooms,
``Chassis.rooms_c``), every set with five loads: steady, step, bursts30, bursts6 and
the recorded H200 trace scaled to the card (``h200``), 480 s each. Ceiling: the
GPU's slowdown - 3 degC.

Controllers per case, all on the firmware:

``pid``            the firmware's factory controller as it is ("cold": no chassis model)
``curve``          the set's one curve: the suite curve method (``search_suite_width``,
                   ``pick_suite_curve``) over every case of the set, its worst case
                   deciding t0
``chassis_curve``  a curve per chassis (per world for ``shipped``) by the world-curve
                   method (``search_world``: the hot room's step decides t0, the width
                   with the least duty^2 over the chassis's cases wins)

and the per-case ``oracle`` (``oracle_case``: the least constant duty after the onset
that keeps the die under the ceiling; fast model).

Learning (the chassis model of issue 25): ``learn(world)`` is the hook. Before the
cases of a world it may run a learning phase and return the ``model.*`` config keys
the bridge would send (``config_set``); the ``pid_learned`` runs then start from
them. Today it returns None: no learning exists yet, so the learned keys
(``control_val_*``, ``control_train_*``) are the cold runs' numbers and
``control_chassis_learned`` is 0; ``control_val_cold_*`` are always the cold runs.

Keys (``summarize``), for ``<set>`` in ``train``, ``val``, ``shipped`` and
``val_cold``: ``control_<set>_ceiling_violations`` (cases whose die went over the
ceiling), ``_seconds_above_slowdown_without_alarm`` (seconds with the die at or above
the GPU's slowdown while the telemetry's fault bits showed neither ``over_temp`` nor
``critical_temp``, the firmware's warning and critical alarms), ``_duty2_vs_curve``,
``_duty2_vs_chassis_curve``, ``_duty2_oracle_vs_curve`` (summed mean duty^2),
``_duty_changes_per_min_bursts_max``, ``_limit_cycles``; the baselines' own ceiling
violations; and per family (card class, probe placement)
``control_<set>_class_<class>_duty2_vs_chassis_curve`` / ``_duty2_vs_curve`` and
``control_<set>_probe_<placement>_...``. Per-case rows go to
docs/control-benchmark/chassis_cases.json; docs/control-benchmark.md's "Chassis the
suite never saw" tables are generated from both (``update_docs``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import bench_control as B
from modbridge.sim import chassis as gen
from protocol import catalog as C

ROOT = Path(__file__).resolve().parent.parent
CASES_FILE = B.OUT_DIR / "chassis_cases.json"
DOC = ROOT / "docs" / "control-benchmark.md"

TRAIN_N = 8
VAL_N = 8
# What `bench.run chassis` runs: each world in its hot room, the shipped worlds too
# (about 40 minutes of wall on the shared 2-core machine, ~10 on an idle one);
# "--rooms both" doubles it.
ROOMS = "hot"
SHIPPED = True
LOADS = B.LOADS + ("h200",)
SHIPPED_ROOMS_C = (20, 40)
SETS = ("train", "val", "shipped")
ALARM_BITS = C.FAULT_OVER_TEMP | C.FAULT_CRITICAL_TEMP
CONTROLLERS = ("pid", "curve", "chassis_curve")


@dataclass(frozen=True)
class ChassisWorld:
    """A generated chassis as a bench_control world (``params()``, ``load_w``)."""

    chassis: gen.Chassis

    @property
    def name(self):
        return self.chassis.name

    @property
    def load_w(self):
        return self.chassis.card_w

    def params(self):
        return self.chassis.params()


def learn(world) -> dict | None:
    """The learning phase before a world's cases: ``{"model.<key>": int}`` for
    ``config_set`` (the firmware's ``model`` config section, issue 25), or None when there is
    nothing learned (the cold controller). None until the chassis model exists."""
    return None


def world_name(world):
    return world if isinstance(world, str) else world.name


def world_info(world):
    """What the per-case rows say about a world: family labels and its ceiling."""
    if isinstance(world, str):
        p = B.load_params(world)
        return {
            "family": "shipped",
            "card_class": "shipped",
            "probe": "shipped",
            "slowdown_c": p["gpu"]["slowdown_c"],
            "ceiling_c": B.ceiling_c(p),
            "describe": f"{world} (world file)",
        }
    c = world.chassis
    return {
        "family": c.family,
        "card_class": c.card_class,
        "probe": c.probe,
        "slowdown_c": c.slowdown_c,
        "ceiling_c": c.ceiling_c,
        "describe": c.describe(),
    }


def set_worlds(train_n=TRAIN_N, val_n=VAL_N, shipped=SHIPPED):
    """``{set: [world, ...]}``: generated chassis as ``ChassisWorld``, world files as
    names."""
    out = {
        "train": [ChassisWorld(gen.generate(s)) for s in gen.TRAIN_SEEDS[:train_n]],
        "val": [ChassisWorld(gen.generate(s)) for s in gen.VAL_SEEDS[:val_n]],
    }
    if shipped:
        out["shipped"] = list(B.WORLDS)
    return {k: v for k, v in out.items() if v}


def rooms_of(world, rooms="both"):
    """The rooms a world runs in: a chassis's own two (or only its hot one)."""
    all_rooms = SHIPPED_ROOMS_C if isinstance(world, str) else world.chassis.rooms_c
    return (max(all_rooms),) if rooms == "hot" else tuple(all_rooms)


def alarm_gap_s(trace, slowdown_c):
    """Seconds with the die at or above ``slowdown_c`` and no over-temperature or
    critical alarm in the telemetry's fault bits."""
    return float(
        sum(
            1
            for die, f in zip(trace["die_c"], trace["faults"], strict=True)
            if die >= slowdown_c and not (f or 0) & ALARM_BITS
        )
    )


def _fw_job(args):
    """One case on the firmware -> (args, metrics, sim_s)."""
    set_name, world, room, load, controller, points, config = args
    p = B.params_of(world)
    kind = "curve" if controller.endswith("curve") else "pid"
    tr = B.simulate(world, room, load, kind, points, config=config)
    m = B.metrics(tr, load, B.ceiling_c(p), p["gpu"]["slowdown_c"])
    m["above_slowdown_no_alarm_s"] = alarm_gap_s(tr, p["gpu"]["slowdown_c"])
    # what governed: the GPU NTC and the telemetry's target over the last 2 minutes
    m["ntc_tail_c"] = _tail_mean(tr["ntc_c"])
    m["target_tail_c"] = _tail_mean(tr["target_c"])
    return args, m, tr["sim_s"]


def _tail_mean(xs, n=120):
    vals = [v for v in xs[-n:] if v is not None]
    return round(sum(vals) / len(vals), 2) if vals else None


def _job(args):
    kind = args[0]
    if kind == "suite":
        _, set_name, width, cases = args
        return set_name, B.search_suite_width(width, cases=cases)
    if kind == "search":
        _, set_name, world, rooms = args
        return set_name, B.search_world(world, rooms, LOADS, best_per_case=False)
    if kind == "oracle":
        _, set_name, world, rooms = args
        return set_name, B.oracle_world(world, rooms, LOADS)
    if kind == "learn":
        return args[1], learn(args[1])
    return _fw_job(args[1:])


def run(
    workers=None,
    train_n=TRAIN_N,
    val_n=VAL_N,
    shipped=SHIPPED,
    rooms=ROOMS,
    out_path=CASES_FILE,
) -> dict:
    """The benchmark; results.json keys (``summarize``). ``rooms`` "both" or "hot"."""
    workers = workers or min(2, os.cpu_count() or 1)
    start = time.perf_counter()
    sets = set_worlds(train_n, val_n, shipped)
    worlds = [(s, w) for s, ws in sets.items() for w in ws]
    cases = {
        s: [(w, r, ld) for w in ws for r in rooms_of(w, rooms) for ld in LOADS]
        for s, ws in sets.items()
    }
    first = (
        [("suite", s, width, cases[s]) for s in sets for width in B.WIDTHS_C]
        + [("search", s, w, rooms_of(w, rooms)) for s, w in worlds]
        + [("oracle", s, w, rooms_of(w, rooms)) for s, w in worlds]
        + [("learn", w) for s, w in worlds]
        + [("fw", s, w, r, ld, "pid", None, None) for s in sets for w, r, ld in cases[s]]
    )
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(_job, first))
        n_suite = len(sets) * len(B.WIDTHS_C)
        n_w = len(worlds)
        suites = {s: B.pick_suite_curve([r for ss, r in done[:n_suite] if ss == s]) for s in sets}
        searches = {world_name(r["world"]): r for _, r in done[n_suite : n_suite + n_w]}
        oracles = {world_name(r["world"]): r for _, r in done[n_suite + n_w : n_suite + 2 * n_w]}
        learned = {world_name(w): keys for w, keys in done[n_suite + 2 * n_w : n_suite + 3 * n_w]}
        fw_done = done[n_suite + 3 * n_w :]
        second = []
        for s in sets:
            base = B.curve_points(suites[s]["t0_c"], suites[s]["width_c"])
            for w, r, ld in cases[s]:
                sr = searches[world_name(w)]
                own = B.curve_points(sr["t0_c"], sr["width_c"])
                second.append(("fw", s, w, r, ld, "curve", base, None))
                second.append(("fw", s, w, r, ld, "chassis_curve", own, None))
                keys = learned[world_name(w)]
                if keys:
                    second.append(("fw", s, w, r, ld, "pid_learned", None, keys))
        fw_done += list(pool.map(_job, second))
    wall = time.perf_counter() - start
    rows = []
    sim_total = 0
    for (set_name, world, room, load, ctl, _, _), m, sim_s in fw_done:
        sim_total += sim_s
        name = world_name(world)
        row = {"set": set_name, "world": name, "room": room, "load": load, "controller": ctl}
        row.update({k: v for k, v in world_info(world).items() if k != "describe"})
        row.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in m.items()})
        orc = oracles[name]["cases"][f"{room}_{load}"]
        row["oracle_duty"] = round(orc["duty"], 4)
        row["oracle_duty2"] = round(orc["duty2"], 5)
        rows.append(row)
    curves = {f"set:{s}": _curve(suites[s]) for s in sets}
    curves.update({n: _curve(sr) for n, sr in searches.items()})
    described = {world_name(w): world_info(w)["describe"] for _, w in worlds}
    out = summarize(rows, any(learned.values()))
    out["control_chassis_wall_s"] = round(wall, 1)
    out["control_chassis_sim_speedup"] = round(sim_total / wall, 1)
    if out_path is not None:
        doc = {
            "note": "written by bench/bench_chassis.py; docs/control-benchmark.md quotes it",
            "sizes": {"train": train_n, "val": val_n, "shipped": shipped, "rooms": rooms},
            "chassis": described,
            "curves": curves,
            "cases": sorted(rows, key=_row_order),
        }
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return out


def _curve(search):
    return {"t0_c": round(search["t0_c"], 2), "width_c": search["width_c"]}


def _row_order(r):
    ctls = CONTROLLERS + ("pid_learned",)
    return (
        SETS.index(r["set"]),
        r["world"],
        r["room"],
        LOADS.index(r["load"]),
        ctls.index(r["controller"]),
    )


# --- the keys ------------------------------------------------------------------------
def _d2(rows, ctl, pid):
    by = {(r["world"], r["room"], r["load"], r["controller"]): r for r in rows}
    return sum(by[(r["world"], r["room"], r["load"], ctl)]["duty2"] for r in pid)


def block(prefix, rows, pid_ctl="pid"):
    """The keys of one set (or family) of per-case rows, ``pid_ctl`` measured."""
    pid = [r for r in rows if r["controller"] == pid_ctl]
    d2_pid = _d2(rows, pid_ctl, pid)
    d2_cur = _d2(rows, "curve", pid)
    out = {
        "ceiling_violations": sum(1 for r in pid if r["above_ceiling_s"] > 0),
        "seconds_above_slowdown_without_alarm": round(
            sum(r["above_slowdown_no_alarm_s"] for r in pid), 1
        ),
        "duty2_vs_curve": round(d2_pid / d2_cur, 4),
        "duty2_vs_chassis_curve": round(d2_pid / _d2(rows, "chassis_curve", pid), 4),
        "duty2_oracle_vs_curve": round(sum(r["oracle_duty2"] for r in pid) / d2_cur, 4),
        "duty_changes_per_min_bursts_max": round(
            max((r["changes_per_min"] for r in pid if r["load"] in B.BURST_LOADS), default=0.0),
            3,
        ),
        "limit_cycles": sum(1 for r in pid if r["limit_cycle"]),
        "peak_over_ceiling_max_c": round(max(r["peak_c"] - r["ceiling_c"] for r in pid), 2),
    }
    for ctl in ("curve", "chassis_curve"):
        cur = [r for r in rows if r["controller"] == ctl]
        out[ctl + "_ceiling_violations"] = sum(1 for r in cur if r["above_ceiling_s"] > 0)
        out[ctl + "_limit_cycles"] = sum(1 for r in cur if r["limit_cycle"])
        out[ctl + "_duty_changes_per_min_bursts_max"] = round(
            max((r["changes_per_min"] for r in cur if r["load"] in B.BURST_LOADS), default=0.0),
            3,
        )
    return {prefix + k: v for k, v in out.items()}


FAMILY_KEYS = ("duty2_vs_curve", "duty2_vs_chassis_curve")


def summarize(rows, learned=False):
    """results.json keys from the per-case rows (the module docstring)."""
    out = {"control_chassis_learned": int(bool(learned))}
    measured = "pid_learned" if learned else "pid"
    for s in SETS:
        rs = [r for r in rows if r["set"] == s]
        if not rs:
            continue
        out.update(block(f"control_{s}_", rs, measured if s != "shipped" else "pid"))
        if s == "val":
            out.update(block("control_val_cold_", rs, "pid"))
        if s == "shipped":
            continue
        for label, field in (("class", "card_class"), ("probe", "probe")):
            for value in sorted({r[field] for r in rs}):
                fam = block("", [r for r in rs if r[field] == value], measured)
                for k in FAMILY_KEYS:
                    out[f"control_{s}_{label}_{value}_{k}"] = fam[k]
    return out


# --- the docs tables -----------------------------------------------------------------
_SET_COLS = (
    ("ceiling_violations", "ceiling violations", "{:d}"),
    ("seconds_above_slowdown_without_alarm", "s ≥ slowdown, no alarm", "{:.0f}"),
    ("duty2_vs_curve", "duty² / set curve's", "{:.3f}"),
    ("duty2_vs_chassis_curve", "duty² / chassis curve's", "{:.3f}"),
    ("duty2_oracle_vs_curve", "oracle duty² / set curve's", "{:.3f}"),
    ("duty_changes_per_min_bursts_max", "duty chg/min, bursts (max)", "{:.2f}"),
    ("limit_cycles", "limit cycles", "{:d}"),
    ("peak_over_ceiling_max_c", "peak die - ceiling (max)", "{:+.1f}"),
    ("curve_ceiling_violations", "set curve: ceiling violations", "{:d}"),
    ("curve_limit_cycles", "set curve: limit cycles", "{:d}"),
    ("curve_duty_changes_per_min_bursts_max", "set curve: chg/min bursts", "{:.2f}"),
    ("chassis_curve_ceiling_violations", "chassis curves: ceiling violations", "{:d}"),
    ("chassis_curve_limit_cycles", "chassis curves: limit cycles", "{:d}"),
    ("chassis_curve_duty_changes_per_min_bursts_max", "chassis curves: chg/min bursts", "{:.2f}"),
)


def summary_table(results):
    head = "| set | " + " | ".join(c[1] for c in _SET_COLS) + " |"
    lines = [head, "|" + "---|" * (len(_SET_COLS) + 1)]
    for scope in ("train", "val", "val_cold", "shipped"):
        if f"control_{scope}_duty2_vs_curve" not in results:
            continue
        cells = [B._fmt(fmt, results[f"control_{scope}_{k}"]) for k, _, fmt in _SET_COLS]
        lines.append(f"| {scope} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def family_table(results):
    lines = [
        "| set | family | duty² / set curve's | duty² / chassis curve's |",
        "|---|---|---|---|",
    ]
    for s in ("train", "val"):
        for label, values in (("class", [k for k, _, _ in gen.CLASSES]), ("probe", gen.PLACEMENTS)):
            for v in values:
                key = f"control_{s}_{label}_{v}_"
                if key + "duty2_vs_curve" not in results:
                    continue
                lines.append(
                    f"| {s} | {label} {v} | {results[key + 'duty2_vs_curve']:.3f} | "
                    f"{results[key + 'duty2_vs_chassis_curve']:.3f} |"
                )
    return "\n".join(lines)


def chassis_table(doc):
    """Per world: what it is, its curves, the controller's duty² against each."""
    lines = [
        "| set | world | what it is | chassis curve | pid duty² | set curve's | "
        "chassis curve's | oracle's | pid peak - ceiling | s ≥ slowdown, no alarm |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = doc["cases"]
    seen = []
    for r in rows:
        if (r["set"], r["world"]) not in seen:
            seen.append((r["set"], r["world"]))
    for s, w in seen:
        rs = [r for r in rows if r["world"] == w and r["set"] == s]
        pid = [r for r in rs if r["controller"] == "pid"]
        d2 = {c: _d2(rs, c, pid) for c in CONTROLLERS}
        orc = sum(r["oracle_duty2"] for r in pid)
        cur = doc["curves"][w]
        what = doc["chassis"][w].split(": ", 1)[-1]
        peak = max(r["peak_c"] - r["ceiling_c"] for r in pid)
        gap = sum(r["above_slowdown_no_alarm_s"] for r in pid)
        lines.append(
            f"| {s} | {w} | {what} | {cur['t0_c']:.1f}+{cur['width_c']} degC | "
            f"{d2['pid']:.3f} | {d2['curve']:.3f} | {d2['chassis_curve']:.3f} | {orc:.3f} | "
            f"{peak:+.1f} | {gap:.0f} |"
        )
    return "\n".join(lines)


def curves_table(doc):
    lines = ["| set | one curve for the set (20 % at t0, 100 % at t0 + width) |", "|---|---|"]
    for s in SETS:
        c = doc["curves"].get(f"set:{s}")
        if c:
            lines.append(f"| {s} | t0 {c['t0_c']:.2f} degC, width {c['width_c']} degC |")
    return "\n".join(lines)


GPU_NTC_SETPOINT_C = B._CH_SP[0] / 1000  # the factory GPU channel's setpoint
SUSTAINED = ("steady", "step")  # a settled last 2 minutes


def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def why_table(doc):
    """Per set and family, the sustained loads' last 2 minutes: where the controller
    and the chassis curve hold the die, and in how many cases the GPU NTC's setpoint
    governed (the NTC at or above it, less 1.5 degC: that channel, not the die's
    margin, set the duty)."""
    lines = [
        "| set | family | duty² / chassis curve's | die - ceiling: controller | "
        "chassis curve | GPU NTC (controller) | NTC setpoint governed |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = doc["cases"]
    by = {(r["world"], r["room"], r["load"], r["controller"]): r for r in rows}
    fams = []
    for r in rows:
        if (r["set"], r["family"]) not in fams and r["set"] != "shipped":
            fams.append((r["set"], r["family"]))
    for s, fam in fams:
        pid = [r for r in rows if (r["set"], r["family"], r["controller"]) == (s, fam, "pid")]
        cc = [by[(r["world"], r["room"], r["load"], "chassis_curve")] for r in pid]
        ratio = sum(r["duty2"] for r in pid) / sum(r["duty2"] for r in cc)
        sus = [r for r in pid if r["load"] in SUSTAINED]
        sus_cc = [by[(r["world"], r["room"], r["load"], "chassis_curve")] for r in sus]
        gov = sum(
            1
            for r in sus
            if r["ntc_tail_c"] is not None and r["ntc_tail_c"] >= GPU_NTC_SETPOINT_C - 1.5
        )
        lines.append(
            f"| {s} | {fam} | {ratio:.3f} | "
            f"{_mean([r['steady_c'] - r['ceiling_c'] for r in sus]):+.1f} | "
            f"{_mean([r['steady_c'] - r['ceiling_c'] for r in sus_cc]):+.1f} | "
            f"{_mean([r['ntc_tail_c'] for r in sus if r['ntc_tail_c'] is not None]):.1f} | "
            f"{gov} of {len(sus)} |"
        )
    return "\n".join(lines)


def docs_sections(results, doc):
    return {
        "chassis-summary": summary_table(results),
        "chassis-families": family_table(results),
        "chassis-curves": curves_table(doc),
        "chassis-worlds": chassis_table(doc),
        "chassis-why": why_table(doc),
    }


def update_docs(results_path=ROOT / "bench" / "results.json"):
    """Regenerate the chassis tables of docs/control-benchmark.md."""
    results = json.loads(Path(results_path).read_text())
    doc = json.loads(CASES_FILE.read_text())
    DOC.write_text(B.render_docs(DOC.read_text(), docs_sections(results, doc)))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_chassis", description=__doc__.split("\n")[0]
    )
    p.add_argument("--train", type=int, default=TRAIN_N)
    p.add_argument("--val", type=int, default=VAL_N)
    p.add_argument("--no-shipped", action="store_true", help="leave the shipped worlds out")
    p.add_argument("--rooms", choices=("both", "hot"), default=ROOMS)
    p.add_argument("--out", type=Path, default=None, help="per-case JSON (default: none)")
    p.add_argument("--update-docs", action="store_true", help="only regenerate the docs tables")
    a = p.parse_args(argv)
    if a.update_docs:
        update_docs()
        return
    res = run(train_n=a.train, val_n=a.val, shipped=not a.no_shipped, rooms=a.rooms, out_path=a.out)
    for k, v in sorted(res.items()):
        print(f"{k:64s} {v}")


if __name__ == "__main__":
    main()
