"""The twin's calibrated simulator run again on a stored live run, with the moldable and CEM launchers'
``start_lag`` and without it: whether modelling it brings the simulated starts closer to the live ones.

``python -m coorm.experiments.twin_resim twin-spaced --start-lag 2`` reads ``experiments/twin-spaced.json``
(the live runs' starts, their delay samples and policy settings, stored by ``coorm experiment twin-spaced``),
calibrates the simulator from them as :func:`coorm.experiments.twin.compare` does, runs the same applications
with start_lag 0 (the papers' simulator, and the twin's before it modelled the live run's) and with the
given one, and prints |Δstart| against the first live run: over all applications, over those the live system
reproduces, over those whose start is determined (the live runs and the sampled simulator's seeds agree),
before the schedules fork, and the adaptive choices that differ. Some seconds; no live run. ``--views apart``:
the simulated views heard with their own measured latency, apart from the starts (``in-order``: behind them).
The last column: the calibrated simulator held to the first live run's choices (each moldable and CEM
application waits for the configuration it started in live; a run stored before the requests' clusters
were pins its moldables only).
``--start-lag`` defaults to the one stored with the run (runs stored before it was recorded need it given:
the live launchers' ``START_LAG`` when the run was made).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from coorm.experiments import common, twin, twin_large
from coorm.experiments import twin_sim as tsim
from coorm.experiments.twin_workload import CLUSTERS, QUICK_CLUSTERS, workload
from coorm.shared.requests import RequestType
from coorm.simulator.delays import Delays

DOC = Path(__file__).resolve().parents[2] / "EXPERIMENTS.md"


def resimulate(rows: list[dict], start_lags: tuple[float, ...], views_apart: bool | None = None,
               exit_model: str | None = None, quantile: float | None = None, current: bool = False,
               reply: float | None = None) -> list[dict]:
    """One summary per start_lag: the calibrated simulator (from ``rows``' stored samples and settings)
    against the stored first live run; ``views_apart``: its views heard apart from the starts
    (``Delays.view_notify``; None: as the stored run's simulator had them). The applications whose start is
    determined (:func:`~coorm.experiments.twin.determined`) are those the stored live runs reproduce and the
    sampled simulator's seeds, run again here, start alike. ``exit_model``: how a rigid job's exit is modelled
    (:data:`~coorm.experiments.twin_sim.EXIT_MODELS`; None: as the stored run's simulator had it).
    ``quantile``: each delay calibrated at that quantile of its samples, not their mean. The views are modelled
    as the stored run's simulator modelled them (a run stored before :data:`~.twin_sim.OPENING_VIEWS` and
    :data:`~.twin_sim.VIEWS_QUANTILE` were: not followed on opening, their mean); ``current``: as this code's.
    ``reply``: the time a launcher waits for each command's answer (``Delays.reply``), instead of the mean of the
    run's samples of it (a run stored before they were measured has none: 0)."""
    run = next(r for r in rows if r["row"] == "run")
    apps = [dict(a) for a in rows if a["row"] == "app"]
    quick = run["apps"] < 100
    specs = workload(quick, spaced=bool(run.get("spaced")), count=run.get("count"))
    if [s.name for s in specs] != [a["name"] for a in apps]:
        raise ValueError("the stored applications are not the twin workload's")
    samples = {r["delay"]: r["values"] for r in rows if r["row"] == "samples"}
    exit_model = run.get("exit_model", "constant") if exit_model is None else exit_model
    if exit_model != "constant" and "work_overhead_launching" not in samples:
        samples.update(work_overheads(rows, specs))  # (the constant keeps the stored samples: their order
        # is the sampled seeds' draws)
    settings = tsim.policy(run["settings"])
    apart = bool(run.get("views_apart")) if views_apart is None else views_apart
    opening, views_at = ((tsim.OPENING_VIEWS, tsim.VIEWS_QUANTILE) if current
                         else (bool(run.get("opening_views")), run.get("views_quantile")))
    delays = tsim.calibrate(samples, run["settings"], views_apart=apart, exit_model=exit_model, quantile=quantile,
                            opening_views=opening, views_quantile=views_at)
    if reply is not None:
        delays = replace(delays, reply=reply)
    clusters = QUICK_CLUSTERS if quick else CLUSTERS
    pins = tsim.pins(specs, [r for r in rows if r["row"] == "request" and r["run"] == 1])
    out = []
    for lag in start_lags:
        sim = tsim.simulate(specs, clusters, settings, delays, lag)
        held = tsim.simulate(specs, clusters, settings, delays, lag, pins=pins)
        m = f"lag{lag:g}"
        # the sampled simulator's seeds, for the applications whose start is a race in the model itself
        seeds = [tsim.simulate(specs, clusters, settings, tsim.sampled(delays, samples, k), lag)
                 for k in range(twin.SEEDS)]
        for a in apps:
            rec = sim.result.apps[a["name"]]
            a[f"{m}_start"] = rec.heard_started
            a[f"{m}_choice"] = tsim.first_choice(sim.requests, a["name"])
            a.update(twin.seeds_spread(seeds, a["name"]))
        started = [a for a in apps if a["live_start"] is not None and a[f"{m}_start"] is not None]
        adaptive = [a for a in apps if a["kind"] in ("moldable", "cem")]
        reproduced = [a for a in twin.reproduced(apps) if a[f"{m}_start"] is not None]
        determined = [a for a in twin.determined(apps) if a[f"{m}_start"] is not None]
        early = twin.before_fork(apps, m)
        out.append({
            "start_lag": lag, "views_apart": apart,
            "all": twin.spread([abs(a["live_start"] - a[f"{m}_start"]) for a in started]),
            "reproduced": twin.spread([abs(a["live_start"] - a[f"{m}_start"]) for a in reproduced]),
            "determined": twin.spread([abs(a["live_start"] - a[f"{m}_start"]) for a in determined]),
            "before_fork": early, "choices_differ": sum(a["live_choice"] != a[f"{m}_choice"] for a in adaptive),
            "pinned": twin.spread([abs(a["live_start"] - t) for a in apps if a["live_start"] is not None
                                   and (t := held.result.apps[a["name"]].heard_started) is not None]),
            "pins": len(pins),
            "adaptive": len(adaptive),
            "held_back": sum(getattr(sim.result.launchers[a["name"]], "held_back", 0) for a in adaptive),
        })
    return out


def work_overheads(rows: list[dict], specs: list) -> dict[str, list[float]]:
    """A run stored before what its rigid jobs' overheads depend on was (``work_overhead_nodes``,
    ``work_overhead_launching``): each rigid job's overhead from its stored live start and end heard (the
    same measure as ``work_overhead``, to the 1 ms they are stored to), its nodes, and the nodes of the
    other applications' requests (pre-allocations aside) the first live run started in the ``exit_window``
    before its own or with it (as the live twin now measures them)."""
    spec = {s.name: s for s in specs}
    started = [r for r in rows if r["row"] == "request" and r["run"] == 1 and r["start"] is not None
               and r["type"] != RequestType.PRE_ALLOCATION.value]
    window = Delays().exit_window
    done = [(a, spec[a["name"]]) for a in rows if a["row"] == "app" and spec[a["name"]].process_work
            and a["live_start"] is not None and a["live_end"] is not None]
    out: dict[str, list[float]] = {"work_overhead": [], "work_overhead_nodes": [], "work_overhead_launching": []}
    for a, s in done:
        own = min(r["start"] for r in started if r["name"] == a["name"])
        out["work_overhead"].append(a["live_end"] - a["live_start"] - s.params["work"])
        out["work_overhead_nodes"].append(float(s.params["nodes"]))
        out["work_overhead_launching"].append(float(sum(r["nodes"] for r in started if r["name"] != a["name"]
                                                        and own - window <= r["start"] <= own)))
    return out


def compare_again(name: str, runs_path: Path, doc: Path, wall_s: float) -> Path:
    """The live runs a twin run pickled (``OUT/NAME-live.pickle``, as measured) compared again with this code's
    simulators and stored next to ``doc`` as ``name``'s run (``wall_s``: the run's own, printed by it): a
    change to the simulated half needs no new live run. Render it with ``coorm experiment NAME --stored
    --update-doc DOC``."""
    import pickle

    runs = pickle.loads(runs_path.read_bytes())
    quick = len(runs) == 1
    count = twin_large.COUNT if name == twin_large.NAME and not quick else None
    spaced = name == "twin-spaced"
    specs = workload(quick, spaced=spaced, count=count)
    if set(runs[0].apps) != {s.name for s in specs}:
        raise ValueError(f"{runs_path} is not {name}'s applications")
    rows = twin.compared(specs, QUICK_CLUSTERS if quick else CLUSTERS, runs, spaced=spaced, count=count)
    return common.store(doc, name, rows, wall_s=wall_s)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a stored twin run: twin, twin-spaced, twin-large")
    ap.add_argument("--quantile", type=float, default=None,
                    help="each delay calibrated at this quantile of its live samples instead of their mean")
    ap.add_argument("--current", action="store_true",
                    help="model the views as this code does (default: as the stored run's simulator did)")
    ap.add_argument("--live-runs", type=Path, default=None,
                    help="instead: compare again the live runs a twin run pickled (OUT/NAME-live.pickle) and store "
                         "the rows next to --doc (with --wall-s, the run's own)")
    ap.add_argument("--wall-s", type=float, default=None, help="with --live-runs: the run's wall time it printed")
    ap.add_argument("--start-lag", type=float, default=None, help="the live launchers' (default: stored)")
    ap.add_argument("--doc", type=Path, default=DOC, help="the doc the run is stored next to")
    ap.add_argument("--views", choices=("stored", "apart", "in-order"), default="stored",
                    help="the simulated views heard apart from the starts (view_notify) or behind them")
    ap.add_argument("--exit", choices=tsim.EXIT_MODELS, default=None,
                    help="a rigid job's exit: one constant (their mean), a line in its nodes, or a plane in its "
                         "nodes and the launches around it (default: as stored)")
    ap.add_argument("--reply", type=float, default=None,
                    help="seconds a launcher waits for each command's answer (default: the run's measured mean; "
                         "0 for a run stored before it was measured)")
    args = ap.parse_args(argv)
    if args.live_runs is not None:
        if args.wall_s is None:
            ap.error("--live-runs needs --wall-s: the run's wall time, as its command printed it")
        print(compare_again(args.name, args.live_runs, args.doc, args.wall_s))
        return
    rows = common.load(args.doc, args.name)["rows"]
    stored = next(r for r in rows if r["row"] == "run")["settings"].get("start_lag")
    lag = args.start_lag if args.start_lag is not None else stored
    if lag is None:
        ap.error(f"{args.name} was stored without its start_lag: give --start-lag")
    f = twin._f
    print(f"{args.name}: the calibrated simulator against the stored first live run (live start_lag {lag:g} s, "
          f"exit {args.exit or 'as stored'}, "
          + ("" if args.reply is None else f"answers awaited {args.reply:g} s, ")
          + "delays at their "
          + ("mean" if args.quantile is None else f"{args.quantile:g} quantile")
          + (", views as this code models them" if args.current else ", views as stored") + ")")
    views = {"stored": None, "apart": True, "in-order": False}[args.views]
    print(common.md_table(
        ["simulated start_lag (s)", "views apart", "all: n, median, p95 |Δstart| (s)", "reproduced: n, median, p95",
         "determined: n, median, p95", "before the fork: n, median, p95", "adaptive choices that differ",
         "views held back", "held to the live choices (pinned): all: n, median, p95"],
        [[f"{r['start_lag']:g}", "yes" if r["views_apart"] else "no",
          *(f"{d['n']}, {f(d['median'])}, {f(d['p95'])}"
            for d in (r["all"], r["reproduced"], r["determined"], r["before_fork"])),
          f"{r['choices_differ']} of {r['adaptive']}", r["held_back"],
          f"{r['pinned']['n']}, {f(r['pinned']['median'])}, {f(r['pinned']['p95'])} ({r['pins']} pinned)"]
         for r in resimulate(rows, (0.0, lag), views, exit_model=args.exit, quantile=args.quantile,
                             current=args.current, reply=args.reply)]))


if __name__ == "__main__":
    main()
