"""The simulator against the live system (CooRM Fig. 8, done better): one scenario live and simulated.

The same applications (:mod:`.twin_workload`: rigid, moldable, CEM, PSA, AMR, NEXT, the shipped launcher
objects; rigid jobs' work a real ``sleep``) run over ``coorm up`` -- nats-server, valkey, every service,
one agent per cluster starting and killing real processes (:mod:`.twin_live`) -- and then twice in the
simulator with the same cores (:mod:`.twin_sim`): as the papers simulate (an instant RMS), and with the
live system's delays (:class:`~coorm.simulator.delays.Delays`: notification and command latencies, view
pacing, process launch and exit, session opening) calibrated from the live run's own measurements, which
are stored with the results (``experiments/twin.json``); the simulators calibrated from the run give the
moldable and CEM launchers the live run's ``start_lag`` (stored with its settings), and the calibrated one
with start_lag 0, as the papers' simulator has it, is shown beside them (:data:`NO_LAG`). Per application:
when it heard of its start, when it ended, the node-seconds it held, its notifications and their bytes,
side by side; the distribution of the differences (median, p95, max); the paper's Fig. 8 (traffic and CPU,
live over simulated).

The stated tolerance: the calibrated simulator's starts agree with the live ones within
:data:`TOLERANCE_P95_START` seconds at the 95th percentile of the applications whose start is determined --
those the live system reproduces (its two runs start them within :data:`AGREE_S` of each other, with the
same configuration) and the model reproduces too (the sampled simulator's :data:`SEEDS` seeds start them
within :data:`RACE_S` of each other, with one configuration): a start that is a race in the model itself is
reproducible by no model, whatever two live runs did. The p95 over the applications only the live system
reproduces is reported beside it. Over all
applications no model can be held to it: each live run's schedule forks on races (two arrivals a few
milliseconds apart reach the policy core in either order, an adaptive launcher chooses on whichever view it
saw last), so the live system differs from itself by seconds; the run reports that noise floor beside the
simulators' differences, and says whether the tolerance held. A quick run has one live run: its tolerance is
over all applications.

``spaced``: the same applications with arrivals at least :data:`~.twin_workload.MIN_GAP` apart (beyond the
live system's decision latency, so that no two arrivals race), the same mean gap
(``coorm experiment twin-spaced``).
"""

from __future__ import annotations

import pickle
import statistics
from dataclasses import replace
from pathlib import Path

from coorm.experiments import common
from coorm.experiments import twin_sim as tsim
from coorm.experiments.twin_workload import CLUSTERS, ENV, MIN_GAP, QUICK_CLUSTERS, workload

NAME = "twin"
TOLERANCE_P95_START = 1.0  # seconds: p95 over the applications of |start live - start simulated|
# seconds: an application the live system reproduces -- its two live runs start it within this of each other
# (the p95 of a start's notification is 0.14 s, a launch's 0.5 s) with the same configuration
AGREE_S = 0.5
# seconds: over all applications, the calibrated simulator may be this much further from the first live run
# than the second live run is (the live system's noise floor)
NOISE_MARGIN = 1.0
# the papers' simulator; with the live run's delays (their means); with each delay drawn from its samples
MODELS = ("instant", "calibrated", "sampled")
# the calibrated simulator with the moldable and CEM launchers' start_lag at 0, as it ran before it modelled the
# live run's (shown only when the live run had one): whether modelling it brings the starts closer
NO_LAG = "calibrated_no_lag"
SEEDS = 8  # the sampled simulator's seeds: how far it is from itself, against how far the live system is
# seconds: a start the sampled simulator's seeds spread wider than this is a race in the model (which end or
# choice comes first is drawn): no model can be held to the tolerance on it, so it is left out of the judged
RACE_S = TOLERANCE_P95_START
# the calibrated simulator with the views heard behind the starts, in the order taken (Delays.view_notify None,
# as before): whether the live view publisher's own path (a start heard after the views that show it) matters
VIEWS_IN_ORDER = "calibrated_views_in_order"
# the calibrated simulator with its launchers' commands all sent at once, no answer awaited (Delays.reply 0, as
# before; shown only when the live run measured the answers): whether the live runner's awaits matter
NO_REPLY = "calibrated_no_reply"
SELF = "start (s), against itself with another seed"
# a rigid job's exit in the calibrated simulators (twin_sim.EXIT_MODELS): a plane in its nodes and the nodes
# launched around it (the agents share the machine), fitted to the live run's overheads. Before the answers a
# launcher awaits were modelled it did not help and the constant (their mean) was kept; with them it keeps
# every stored run as close or closer (twin_resim NAME --exit ...: EXPERIMENTS.md, twin)
EXIT_MODEL = "launching"


def seeds_spread(seeds: list[tsim.SimRun], name: str) -> dict:
    """How far the seeds' starts of ``name`` are apart (None: a seed never started it) and in how many
    configurations."""
    starts = [sim.result.apps[name].heard_started for sim in seeds]
    heard = [t for t in starts if t is not None]
    return {"seeds_range": _r(max(heard) - min(heard)) if len(heard) == len(starts) else None,
            "seeds_choices": len({tsim.first_choice(sim.requests, name) for sim in seeds})}


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def spread(values: list[float]) -> dict[str, float]:
    """median, p95 and max of ``values`` (absolute differences), ``n`` of them."""
    v = sorted(values)
    if not v:
        return {"n": 0, "median": float("nan"), "p95": float("nan"), "max": float("nan")}
    p95 = v[min(len(v) - 1, max(0, int(round(0.95 * len(v) + 0.5)) - 1))]  # nearest rank
    return {"n": len(v), "median": statistics.median(v), "p95": p95, "max": v[-1]}


def run(out: Path, quick: bool = False, *, spaced: bool = False, name: str = NAME,
        count: int | None = None) -> list[dict]:
    """The quick run: one live run. The full one: two, the second to measure how far the live system is from
    itself (the noise floor of any comparison) and to check the calibration on a run it was not taken from.
    ``count``: applications besides the PSAs (:func:`~.twin_workload.workload`; None: the mode's)."""
    from coorm.experiments import twin_live

    clusters = QUICK_CLUSTERS if quick else CLUSTERS
    specs = workload(quick, spaced=spaced, count=count)
    # the live run's limit: the arrivals' span, with room for the tail of a loaded machine
    limit = 120.0 if quick else max(900.0, 3 * specs[-1].at)
    runs = [twin_live.run(specs, clusters, ENV, limit=limit) for _ in range(1 if quick else 2)]
    # the live runs as measured (the rows are derived from them): to compare again without running them
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-live.pickle").write_bytes(pickle.dumps(runs))
    rows = compared(specs, clusters, runs, spaced=spaced, count=count)
    common.write_csv(out / f"{name}.csv", [r for r in rows if r["row"] == "app"])
    plot(rows, out / f"{name}.png")
    return rows


def compared(specs, clusters: dict[str, int], runs: list, *, spaced: bool, count: int | None) -> list[dict]:
    """The rows of the live ``runs`` (one, or two: :func:`run`'s) of ``specs``, compared with the simulators,
    and how the scenario was made (``spaced``, ``count``: :func:`~.twin_workload.workload`'s)."""
    rows = compare(specs, clusters, runs[0], runs[1] if len(runs) > 1 else None)
    rows[0]["spaced"] = spaced
    rows[0]["count"] = count
    return rows


def completed(app, spec) -> bool:
    """The application did its work live: a rigid job's processes all exited 0; the other kinds' work is
    their timers, and a launch refused on nodes their request no longer held (it ended or was cancelled
    between its start and the launch: ``not_owner``) is a race, not a failure. A PSA ends with the run."""
    if app.error is not None:
        return False
    if spec.process_work:
        return app.exit_code == 0
    return spec.kind == "psa" or all("not_owner" in r for r in app.refused)


def _live_half(live, spec) -> dict:
    la = live.apps[spec.name]
    return {"start": _r(la.heard_started), "end": _r(la.ended) if spec.kind != "psa" else None,
            "node_s": _r(tsim.node_seconds(live.requests, spec.name, live.wall), 1),
            "notes": la.notifications, "bytes": la.notification_bytes,
            "choice": tsim.first_choice(live.requests, spec.name), "resubmissions": la.resubmissions,
            "held_back": la.held_back}


def _sim_half(sim: tsim.SimRun, spec) -> dict:
    rec = sim.result.apps[spec.name]
    return {"start": _r(rec.heard_started), "end": _r(rec.ended) if spec.kind != "psa" else None,
            "node_s": _r(tsim.node_seconds(sim.requests, spec.name, sim.result.now), 1),
            "notes": rec.notifications, "bytes": rec.notification_bytes,
            "choice": tsim.first_choice(sim.requests, spec.name),
            "resubmissions": getattr(sim.result.launchers[spec.name], "resubmissions", None),
            "held_back": getattr(sim.result.launchers[spec.name], "held_back", None)}


FORK = "start (s), before the schedules fork"
FORK_GAP = 0.25  # seconds: two starts closer than this may be heard in either order (notify jitter), not forked


def fork(apps: list[dict], m: str) -> float:
    """When the live schedule and ``m``'s fork (the arrival of the first application concerned): an adaptive
    launcher chooses another configuration, or two applications start in the other order. Until then both
    run the same schedule, shifted by the delays; after, two different valid schedules."""
    at = min((a["arrived"] for a in apps if a["kind"] in ("moldable", "cem")
              and a["live_choice"] != a[f"{m}_choice"]), default=float("inf"))
    started = [a for a in apps if a["live_start"] is not None and a[f"{m}_start"] is not None]
    for i, a in enumerate(started):
        for b in started[i + 1:]:
            live, other = a["live_start"] - b["live_start"], a[f"{m}_start"] - b[f"{m}_start"]
            if abs(live) > FORK_GAP and abs(other) > FORK_GAP and (live > 0) != (other > 0):
                at = min(at, a["arrived"], b["arrived"])
    return at


REPRODUCED = "start (s), where the two live runs agree"


def reproduced(apps: list[dict]) -> list[dict]:
    """The applications the live system reproduces: its two runs start each within :data:`AGREE_S` of each
    other, in the same configuration (the nodes it first started on)."""
    return [a for a in apps if a.get("again_start") is not None and a["live_start"] is not None
            and abs(a["live_start"] - a["again_start"]) <= AGREE_S and a["live_choice"] == a["again_choice"]]


DETERMINED = "start (s), where both live runs and the model's seeds agree"


def determined(apps: list[dict]) -> list[dict]:
    """The applications whose start is determined: the live system reproduces them (:func:`reproduced`) and
    so does the model -- the sampled simulator's seeds start each within :data:`RACE_S` of each other, in one
    configuration (``seeds_range``, ``seeds_choices``)."""
    return [a for a in reproduced(apps) if a.get("seeds_range") is not None and a["seeds_range"] <= RACE_S
            and a.get("seeds_choices") == 1]


def before_fork(apps: list[dict], m: str) -> dict:
    """|start live - start ``m``| over the applications that arrive before the two schedules fork, and the
    ``bias``: the mean of start live - start ``m`` (signed; None when there is none)."""
    first = fork(apps, m)
    d = [a["live_start"] - a[f"{m}_start"] for a in apps if a["arrived"] < first
         and a["live_start"] is not None and a[f"{m}_start"] is not None]
    return {"row": "diff", "what": FORK, "model": m, **{k: _r(v) for k, v in spread([abs(x) for x in d]).items()},
            "bias": _r(statistics.fmean(d)) if d else None, "until": None if first == float("inf") else first}


def compare(specs, clusters: dict[str, int], live, again=None) -> list[dict]:
    """The rows of the experiment: the run, the delays measured (on ``live``), each application live and
    simulated (and live ``again``), the distributions of the differences from ``live``, Fig. 8."""
    settings = tsim.policy(live.settings)
    lag = live.settings["start_lag"]  # the launchers' live: the simulators calibrated from the run use it too
    # the views heard with their own latency, apart from the starts (the live view publisher's path), when the
    # run measured it; the calibrated simulator with them in order is shown beside
    apart = bool(live.delays.get("views"))
    delays = tsim.calibrate(live.delays, live.settings, views_apart=apart, exit_model=EXIT_MODEL)
    sims = {"instant": tsim.simulate(specs, clusters, settings),
            "calibrated": tsim.simulate(specs, clusters, settings, delays, lag),
            "sampled": tsim.simulate(specs, clusters, settings, tsim.sampled(delays, live.delays, 0), lag)}
    simulated = [*MODELS]
    if lag > 0:
        sims[NO_LAG] = tsim.simulate(specs, clusters, settings, delays)
        simulated.append(NO_LAG)
    if apart:
        sims[VIEWS_IN_ORDER] = tsim.simulate(specs, clusters, settings, tsim.calibrate(live.delays, live.settings,
                                                                                            exit_model=EXIT_MODEL),
                                             lag)
        simulated.append(VIEWS_IN_ORDER)
    if delays.reply > 0:
        sims[NO_REPLY] = tsim.simulate(specs, clusters, settings, replace(delays, reply=0.0), lag)
        simulated.append(NO_REPLY)
    # the sampled simulator forks on its draws as the live system forks on its jitter: the other seeds
    seeds = [sims["sampled"], *(tsim.simulate(specs, clusters, settings, tsim.sampled(delays, live.delays, k), lag)
                                for k in range(1, SEEDS))]
    others = [*simulated, *(["again"] if again is not None else [])]
    apps: list[dict] = []
    for s in specs:
        la = live.apps[s.name]
        row: dict = {"row": "app", "name": s.name, "kind": s.kind, "arrived": s.at, "live_ok": completed(la, s),
                     "live_exit": la.exit_code, "live_refused": la.refused[:1], "live_error": la.error}
        halves = {"live": _live_half(live, s), **{m: _sim_half(sims[m], s) for m in simulated}}
        if again is not None:
            halves["again"] = _live_half(again, s)
            row["live_ok"] = row["live_ok"] and completed(again.apps[s.name], s)
        for half, values in halves.items():
            row.update({f"{half}_{k}": v for k, v in values.items()})
        row.update(seeds_spread(seeds, s.name))
        apps.append(row)
    # (up to the end of the last application each run waited for: the PSAs' share after it is the run's end)
    horizon = min([max((a[f"{h}_end"] or 0.0) for a in apps) for h in ["live", *others]])
    curves = {"live": tsim.held_curve(live.requests, horizon),
              **{m: tsim.held_curve(sims[m].requests, horizon) for m in simulated}}
    if again is not None:
        curves["again"] = tsim.held_curve(again.requests, horizon)
    diffs: list[dict] = []
    for m in others:
        for what, key in (("start (s)", "start"), ("end (s)", "end"), ("node-seconds", "node_s"),
                          ("notifications", "notes")):
            d = [abs(a[f"live_{key}"] - a[f"{m}_{key}"]) for a in apps
                 if a[f"live_{key}"] is not None and a[f"{m}_{key}"] is not None
                 and not (key == "node_s" and a["kind"] == "psa")]  # (a PSA's share runs to each run's end)
            diffs.append({"row": "diff", "what": what, "model": m, **{k: _r(v) for k, v in spread(d).items()}})
        diffs.append({"row": "diff", "what": "nodes held, every 0.5 s", "model": m,
                      **{k: _r(v) for k, v in spread([abs(x - y) for x, y in
                                                     zip(curves["live"], curves[m], strict=True)]).items()}})
        adaptive = [a for a in apps if a["kind"] in ("moldable", "cem")]
        differ = [a for a in adaptive if a["live_choice"] != a[f"{m}_choice"]]
        diffs.append({"row": "diff", "what": "moldable and CEM choices that differ", "model": m, "n": len(adaptive),
                      "median": None, "p95": None, "max": None, "count": len(differ)})
        diffs.append(before_fork(apps, m))
        if again is not None:
            for what, over in ((REPRODUCED, reproduced(apps)), (DETERMINED, determined(apps))):
                d = [abs(a["live_start"] - a[f"{m}_start"]) for a in over if a[f"{m}_start"] is not None]
                diffs.append({"row": "diff", "what": what, "model": m, **{k: _r(v) for k, v in spread(d).items()}})
    # how sensitive the schedule itself is: the calibrated simulator against itself with every delay 10 % longer
    perturbed = tsim.simulate(specs, clusters, settings, tsim.scaled(delays, 1.1), lag)
    d = [abs(perturbed.result.apps[a["name"]].heard_started - a["calibrated_start"]) for a in apps
         if a["calibrated_start"] is not None and perturbed.result.apps[a["name"]].heard_started is not None]
    diffs.append({"row": "diff", "what": "start (s), against itself with every delay +10 %", "model": "calibrated",
                  **{k: _r(v) for k, v in spread(d).items()}})
    # how far the sampled simulator is from itself
    d = [abs(other.result.apps[a["name"]].heard_started - a["sampled_start"]) for other in seeds[1:] for a in apps
         if a["sampled_start"] is not None and other.result.apps[a["name"]].heard_started is not None]
    diffs.append({"row": "diff", "what": SELF, "model": "sampled", **{k: _r(v) for k, v in spread(d).items()}})
    if again is not None:  # the calibration checked on the run it was not taken from
        d = [abs(a["again_start"] - a["calibrated_start"]) for a in apps
             if a["again_start"] is not None and a["calibrated_start"] is not None]
        diffs.append({"row": "diff", "what": "start (s), against the second live run", "model": "calibrated",
                      **{k: _r(v) for k, v in spread(d).items()}})
    # the schedule as a whole: waits (start - arrival) and the last end, whatever application had which
    dist: list[dict] = []
    for h in ["live", *others]:
        waits = [a[f"{h}_start"] - a["arrived"] for a in apps if a[f"{h}_start"] is not None]
        dist.append({"row": "dist", "model": h, "mean_wait": _r(statistics.fmean(waits)),
                     "median_wait": _r(statistics.median(waits)), "p95_wait": _r(spread(waits)["p95"]),
                     "last_end": _r(max((a[f"{h}_end"] or 0.0) for a in apps))})
    start = {d["model"]: d for d in diffs if d["what"] == "start (s)"}
    # the tolerance is over the applications whose start is determined (over all of them in a quick run)
    judged = {d["model"]: d for d in diffs if d["what"] == (DETERMINED if again is not None else "start (s)")}
    agree, fixed = {a["name"] for a in reproduced(apps)}, {a["name"] for a in determined(apps)}
    for a in apps:
        a["reproduced"] = a["name"] in agree if again is not None else None
        a["determined"] = a["name"] in fixed if again is not None else None
    rows: list[dict] = [{
        "row": "run", "apps": len(specs), "clusters": ",".join(f"{c}={n}" for c, n in clusters.items()),
        "live_runs": 1 + (again is not None), "live_wall_s": _r(live.wall, 1),
        "live_failed": sum(not a["live_ok"] for a in apps), "tolerance_p95_start_s": TOLERANCE_P95_START,
        "p95_start_instant": start["instant"]["p95"], "p95_start_calibrated": start["calibrated"]["p95"],
        "p95_start_again": start["again"]["p95"] if again is not None else None,
        "tolerance_over": "determined" if again is not None else "all", "judged_n": judged["calibrated"]["n"],
        "race_s": RACE_S, "views_apart": apart, "exit_model": EXIT_MODEL, "opening_views": tsim.OPENING_VIEWS,
        "views_quantile": tsim.VIEWS_QUANTILE,
        "holds": bool(judged["calibrated"]["p95"] <= TOLERANCE_P95_START), "settings": live.settings}]
    used = delays.describe()
    views_used_by = tsim.views_source(live.delays)
    for name, samples in live.delays.items():
        if name in ("launch_nodes", "work_overhead_nodes", "work_overhead_launching"):
            continue
        sp = spread(samples)
        rows.append({"row": "delay", "delay": name, "n": sp["n"], "mean": _r(statistics.fmean(samples)),
                     "median": _r(sp["median"]),
                     "p95": _r(sp["p95"]), "max": _r(sp["max"]),
                     "used": _r(used.get({"work_overhead": "exit", views_used_by: "view_notify"}.get(name, name)))})
    rows.append({"row": "delay", "delay": "launch_per_node", "n": None, "mean": None, "median": None, "p95": None,
                 "max": None,
                 "used": _r(delays.launch_per_node, 4)})
    rows += diffs + dist
    live_bytes, live_notes = sum(a["live_bytes"] for a in apps), sum(a["live_notes"] for a in apps)
    live_cpu = live.cpu_system + live.cpu_launchers
    for m in MODELS:
        sim_bytes, sim_notes = sum(a[f"{m}_bytes"] for a in apps), sum(a[f"{m}_notes"] for a in apps)
        rows.append({"row": "fig8", "what": "notification bytes", "model": m, "live": live_bytes, "sim": sim_bytes,
                     "ratio": _r(live_bytes / sim_bytes if sim_bytes else float("nan"))})
        rows.append({"row": "fig8", "what": "notifications", "model": m, "live": live_notes, "sim": sim_notes,
                     "ratio": _r(live_notes / sim_notes if sim_notes else float("nan"))})
        rows.append({"row": "fig8", "what": "CPU seconds", "model": m, "live": _r(live_cpu, 2),
                     "sim": _r(sims[m].cpu, 2), "ratio": _r(live_cpu / sims[m].cpu if sims[m].cpu else float("nan"), 1),
                     "live_system": _r(live.cpu_system, 2), "live_launchers": _r(live.cpu_launchers, 2),
                     "live_by_process": {k: _r(v, 2) for k, v in sorted(live.cpu_by_process.items())}})
    # what the live runs measured, stored with the results: every request's life as the policy engine
    # published it, and the delay samples the calibration is taken from
    for i, lr in enumerate([live, *([again] if again is not None else [])], start=1):
        rows += [{"row": "request", "run": i, **{k: _r(v) if isinstance(v, float) else v for k, v in r.items()}}
                 for r in lr.requests]
    rows += [{"row": "samples", "delay": k, "values": [_r(v, 4) for v in vs]} for k, vs in live.delays.items()]
    rows += [{"row": "held", "model": h, "step_s": 0.5, "nodes": curve} for h, curve in curves.items()]
    return rows + apps


# ======================================================================================================
# EXPERIMENTS.md
# ======================================================================================================
def _f(x, digits: int = 2) -> str:
    return "—" if x is None or x != x else f"{x:.{digits}f}"


MODEL_NAMES = {"instant": "instant (the papers')", "calibrated": "calibrated", "again": "live, run again",
               "sampled": "sampled", NO_LAG: "calibrated, start_lag 0 (as before)",
               VIEWS_IN_ORDER: "calibrated, views heard behind starts (as before)",
               NO_REPLY: "calibrated, no answer awaited (as before)"}


def markdown(rows: list[dict], prefix: str = NAME) -> dict[str, str]:
    run_ = next(r for r in rows if r["row"] == "run")
    s = run_["settings"]
    again = run_["p95_start_again"]
    judged = {d["model"]: d for d in rows if d["row"] == "diff" and d["what"] == REPRODUCED}
    fixed = {d["model"]: d for d in rows if d["row"] == "diff" and d["what"] == DETERMINED}
    def floor() -> str:
        """How both tolerances' texts end: the p95 over all applications, and the tolerance against the noise
        floor (two live runs)."""
        return (f"{_f(run_['p95_start_calibrated'])} s calibrated, {_f(run_['p95_start_instant'])} s instant, and "
                f"{_f(again)} s for the live system against itself: the noise floor no simulator can go under. "
                f"**Tolerance against that floor**, over all applications: the calibrated simulator no further "
                f"from the first live run than the second live run is, plus {NOISE_MARGIN:g} s — **"
                + ("holds" if run_["p95_start_calibrated"] <= again + NOISE_MARGIN else "does not hold")
                + f"** ({_f(run_['p95_start_calibrated'])} s against {_f(again)} + {NOISE_MARGIN:g} s).")

    head = (f"{run_['apps']} applications on {run_['clusters']} emulated nodes"
            + (f", arriving at least {MIN_GAP:g} s apart" if run_.get("spaced") else "")
            + f"; {run_['live_runs']} live run(s), the "
            f"first {run_['live_wall_s']} s (re-scheduling interval {s['reschedule_interval']:g} s, fair start "
            f"{s['fair_start']:g} s, preemption grace {s['preempt_grace']:g} s, view period {s['view_period']:g} s"
            + (f", the moldable and CEM launchers' start_lag {s['start_lag']:g} s" if "start_lag" in s else "")
            + f"); applications that did not complete live: {run_['live_failed']}.")
    if fixed:
        head += (f" **Tolerance**, over the {fixed['calibrated']['n']} applications whose start is determined -- of "
                 f"the {judged['calibrated']['n']} the live system reproduces (its two runs start each within "
                 f"{AGREE_S:g} s of the other, in the same configuration), those the model reproduces too (the "
                 f"sampled simulator's {SEEDS} seeds start each within {run_['race_s']:g} s, in one configuration; "
                 f"the other {judged['calibrated']['n'] - fixed['calibrated']['n']} are a race in the model): p95 "
                 f"|Δstart| ≤ {run_['tolerance_p95_start_s']:g} s for the calibrated simulator — "
                 f"**{'holds' if run_['holds'] else 'does not hold'}** (p95 {_f(fixed['calibrated']['p95'])} s; the "
                 f"live system's own noise on them, run again: {_f(fixed['again']['p95'])} s; the papers' instant "
                 f"simulator: {_f(fixed['instant']['p95'])} s). Over the {judged['calibrated']['n']} the live system "
                 f"reproduces: p95 {_f(judged['calibrated']['p95'])} s calibrated (run again "
                 f"{_f(judged['again']['p95'])} s, instant {_f(judged['instant']['p95'])} s)."
                 f" Over all applications the p95 is "
                 + floor())
    elif judged:
        head += (f" **Tolerance**, over the {judged['calibrated']['n']} applications the live system reproduces "
                 f"(its two runs start each within {AGREE_S:g} s of the other, in the same configuration): p95 "
                 f"|Δstart| ≤ {run_['tolerance_p95_start_s']:g} s for the calibrated simulator — "
                 f"**{'holds' if run_['holds'] else 'does not hold'}** (p95 {_f(judged['calibrated']['p95'])} s; "
                 f"the live system's own noise on them, run again: {_f(judged['again']['p95'])} s; the papers' "
                 f"instant simulator: {_f(judged['instant']['p95'])} s). Over all applications the p95 is "
                 + floor())
    else:
        head += (f" Tolerance: p95 |Δstart| ≤ {run_['tolerance_p95_start_s']:g} s for the calibrated simulator, "
                 f"over all applications (one live run) — **{'holds' if run_['holds'] else 'does not hold'}** (p95 "
                 f"{_f(run_['p95_start_calibrated'])} s; the papers' instant simulator: "
                 f"{_f(run_['p95_start_instant'])} s).")
    noise = next((d for d in rows if d["row"] == "diff" and d["what"] == SELF), None)
    live_noise = next((d for d in rows if d["row"] == "diff" and d["what"] == "start (s)" and d["model"] == "again"),
                      None)
    if noise is not None:
        head += (f" The simulator drawing each delay from the live run's samples (seeded) forks as the live system "
                 f"does: against itself with another seed, p95 |Δstart| {_f(noise['p95'])} s (median "
                 f"{_f(noise['median'])} s, {SEEDS - 1} other seeds pooled)"
                 + (f"; the live system against itself {_f(live_noise['p95'])} s (median {_f(live_noise['median'])} s)"
                    if live_noise is not None else "") + ".")
    early = {d["model"]: d for d in rows if d["row"] == "diff" and d["what"] == FORK}
    head += (" Before the schedules fork (a moldable or CEM launcher chooses another configuration, or two "
             "applications start in the other order): p95 |Δstart| "
             + ", ".join(f"{_f(early[m]['p95'])} s {MODEL_NAMES[m]} ({_before(early[m])})"
                         for m in ("calibrated", "instant", "again") if m in early) + ".")
    head += _start_lag(rows)
    head += _views_apart(rows)
    head += _replies(rows)
    delays = md_delays([r for r in rows if r["row"] == "delay"])
    diffs = common.md_table(
        ["live (first run) against", "difference (absolute)", "n", "median", "p95", "max"],
        [[MODEL_NAMES[d["model"]], d["what"], d["n"], _f(d["median"]), _f(d["p95"]), _f(d["max"])]
         if "count" not in d else [MODEL_NAMES[d["model"]], d["what"], d["n"], f"{d['count']} differ", "", ""]
         for d in sorted((d for d in rows if d["row"] == "diff"), key=lambda d: (d["what"], d["model"]))])
    diffs += "\n\n" + common.md_table(
        ["the schedule as a whole", "mean wait (s)", "median wait (s)", "p95 wait (s)", "last end (s)"],
        [[{"live": "live (first run)", **MODEL_NAMES}[d["model"]], _f(d["mean_wait"]), _f(d["median_wait"]),
          _f(d["p95_wait"]), _f(d["last_end"])] for d in rows if d["row"] == "dist"])
    fig8 = common.md_table(
        ["Fig. 8", "simulator", "live", "simulated", "live / simulated", "paper (CORBA prototype)"],
        [[r["what"], r["model"], r["live"], r["sim"], _f(r["ratio"]),
          {"notification bytes": "up to 1.5", "CPU seconds": "up to 3.3", "notifications": "—"}[r["what"]]]
         for r in rows if r["row"] == "fig8"])
    cpu = next(r for r in rows if r["row"] == "fig8" and r["what"] == "CPU seconds")
    by = ", ".join(f"{k} {v:g}" for k, v in sorted(cpu["live_by_process"].items(), key=lambda kv: -kv[1]))
    fig8 += (f"\n\nLive CPU seconds: {cpu['live_system']} in the system's processes ({by}), "
             f"{cpu['live_launchers']} in the launchers' process. (`coorm up` starts two policy engines, named "
             "policy-engine and policy-engine-standby; whichever takes the lease first leads, the other stands by.)")
    has_again = any("again_start" in a for a in rows if a["row"] == "app")
    header = ["app", "kind", "arrives", "start live", *(["again", "reproduced"] if has_again else []), "instant",
              "calibrated",
              "end live", "calibrated", "nodes chosen live", "calibrated", "node-s live", "calibrated",
              "notif. live", "calibrated", "bytes live", "CDR sim"]
    apps = common.md_table(header, [
        [a["name"], a["kind"], _f(a["arrived"]), _f(a["live_start"]),
         *([_f(a["again_start"]), "yes" if a.get("reproduced") else "no"] if has_again else []),
         _f(a["instant_start"]), _f(a["calibrated_start"]), _f(a["live_end"]), _f(a["calibrated_end"]),
         a["live_choice"], a["calibrated_choice"], _f(a["live_node_s"], 1), _f(a["calibrated_node_s"], 1),
         a["live_notes"], a["calibrated_notes"], a["live_bytes"], a["calibrated_bytes"]]
        for a in rows if a["row"] == "app"])
    return {f"{prefix}-summary": head + "\n\n" + delays, f"{prefix}-diffs": diffs, f"{prefix}-fig8": fig8,
            f"{prefix}-apps": "<details><summary>every application, side by side</summary>\n\n" + apps
            + "\n\n</details>"}


_OVERS = (("start (s)", "all applications"), (DETERMINED, "the determined ones"),
          (REPRODUCED, "those the live system reproduces"), (FORK, "before the schedules fork"))


def _against(diff: dict, other: str, overs: tuple[tuple[str, str], ...], *, counts: bool) -> list[str]:
    """|Δstart| of the calibrated simulator against ``other`` (a variant of it), over each population of
    ``overs`` both were measured on: their p95 and median, and (``counts``) over how many applications."""
    out = []
    for what, over in overs:
        if (what, other) in diff:
            a, b = diff[(what, "calibrated")], diff[(what, other)]
            out.append(f"{over}, p95 {_f(a['p95'])} s against {_f(b['p95'])} s (median {_f(a['median'])} s "
                       f"against {_f(b['median'])} s" + (f", n {a['n']} and {b['n']})" if counts else ")"))
    return out


def _start_lag(rows: list[dict]) -> str:
    """Whether the calibrated simulator's starts agree better with the live ones now that its launchers hold a
    new choice back for the live run's start_lag (against the same simulator with start_lag 0, as before)."""
    diff = {(d["what"], d["model"]): d for d in rows if d["row"] == "diff"}
    if ("start (s)", NO_LAG) not in diff:
        return ""
    lag = next(r for r in rows if r["row"] == "run")["settings"]["start_lag"]
    parts = _against(diff, NO_LAG, (("start (s)", "all applications"),
                                    (REPRODUCED, "the applications the live system reproduces"),
                                    (FORK, "before the schedules fork")), counts=True)
    choices = "moldable and CEM choices that differ"
    a, b = diff[(choices, "calibrated")], diff[(choices, NO_LAG)]
    apps = [r for r in rows if r["row"] == "app"]
    held = {h: sum(x[f"{h}_held_back"] or 0 for x in apps) for h in ("live", "calibrated", "sampled")}
    return (f" **The launchers' start_lag** ({lag:g} s live) is modelled: the calibrated and sampled simulators run "
            f"the moldable and CEM launchers with it. |Δstart| with it against with start_lag 0 (as before): "
            + "; ".join(parts) + f"; adaptive choices that differ from live: {a['count']} of {a['n']} against "
            f"{b['count']}. Views on which a new choice was held back for a start not heard yet: {held['live']} live, "
            f"{held['calibrated']} calibrated, {held['sampled']} sampled.")


def _views_apart(rows: list[dict]) -> str:
    """How often a live launcher heard its start after the views that show it, and whether modelling that
    (the views with their own latency, apart from the starts) brings the simulated starts closer."""
    diff = {(d["what"], d["model"]): d for d in rows if d["row"] == "diff"}
    sav = next((r for r in rows if r["row"] == "samples" and r["delay"] == "start_after_view"), None)
    if ("start (s)", VIEWS_IN_ORDER) not in diff or sav is None:
        return ""
    first = [v for v in sav["values"] if v > 0]
    apps = [r for r in rows if r["row"] == "app"]
    resub = {h: sum(x.get(f"{h}_resubmissions") or 0 for x in apps) for h in ("live", "calibrated", VIEWS_IN_ORDER)}
    held = {h: sum(x.get(f"{h}_held_back") or 0 for x in apps) for h in ("live", "calibrated", VIEWS_IN_ORDER)}
    parts = _against(diff, VIEWS_IN_ORDER, _OVERS, counts=False)
    choices = "moldable and CEM choices that differ"
    return (f" **A start heard after the views that show it** (the views through the view publisher, the start "
            f"through the node allocator): of {len(sav['values'])} moldable and CEM starts live, {len(first)} were "
            f"heard after the first round of views published at or after their decision"
            + (f" (by median {_f(statistics.median(first), 3)} s, max {_f(max(first), 3)} s)" if first else "")
            + ". The calibrated simulator hears the views with their own measured latency, apart from the starts "
            "(`view_notify`); |Δstart| with it against with the views behind the starts (as before): "
            + "; ".join(parts) + "; adaptive choices that differ from live: "
            f"{diff[(choices, 'calibrated')]['count']} against {diff[(choices, VIEWS_IN_ORDER)]['count']} of "
            f"{diff[(choices, 'calibrated')]['n']}. Choices "
            f"made again before a start: {resub['live']} live, {resub['calibrated']} calibrated, "
            f"{resub[VIEWS_IN_ORDER]} with the views behind the starts; views a new choice was held back on: "
            f"{held['live']}, {held['calibrated']}, {held[VIEWS_IN_ORDER]}.")


def _replies(rows: list[dict]) -> str:
    """Whether modelling the answers a live launcher awaits (each request and done, before its next command)
    brings the simulated starts closer (against the same simulator sending a launcher's commands at once)."""
    diff = {(d["what"], d["model"]): d for d in rows if d["row"] == "diff"}
    reply = next((r for r in rows if r["row"] == "delay" and r["delay"] == "reply"), None)
    if ("start (s)", NO_REPLY) not in diff or reply is None:
        return ""
    parts = _against(diff, NO_REPLY, _OVERS, counts=True)
    choices = "moldable and CEM choices that differ"
    a, b = diff[(choices, "calibrated")], diff[(choices, NO_REPLY)]
    early = diff.get((FORK, NO_REPLY))
    return (f" **The answers a launcher awaits** (the live runner sends a launcher's next command, and hears of "
            f"anything, once its request or done is answered: {reply['n']} answers, mean {_f(reply['mean'], 3)} s, "
            f"median {_f(reply['median'], 3)} s) are modelled (`reply`); |Δstart| with them against with every "
            f"command sent at once (as before): " + "; ".join(parts)
            + (f" (as before, the schedules fork at {_f(early['until'], 1)} s)" if early and early["until"] else "")
            + f"; adaptive choices that differ from live: {a['count']} against {b['count']} of {a['n']}.")


def _before(d: dict) -> str:
    if d["until"] is None:
        return f"all {d['n']} applications: no fork"
    return f"the {d['n']} applications that arrive before {_f(d['until'], 1)} s"


def md_delays(delays: list[dict]) -> str:
    what = {"notify": "a start decided → its launcher hears of it",
            "command": "a request sent → the policy core applies it",
            "reply": "a request or done sent → the launcher has the answer (its next command waits for it)",
            "launch": "a start heard → every agent answered its launches (the launcher is busy)",
            "work_overhead": "a rigid job: start heard → last exit heard, minus its work (the simulator's exit)",
            "open": "arrival → the launcher runs (session open, clusters' properties)",
            "views": "a round of views → its launcher hears of it",
            "views_unheld": "the same, of the rounds no pacing held (a view period or more after the pass before)",
            "start_after_view": "a moldable or CEM start heard, less the first view of a round at or after its "
                                "decision heard (> 0: the view first)",
            "launch_per_node": "a launch's time per node (a line fitted to the launches' times)"}
    return common.md_table(
        ["delay (live)", "what", "samples", "mean (s)", "median (s)", "p95 (s)", "max (s)", "simulator uses (s)"],
        [[d["delay"], what.get(d["delay"], ""), "—" if d["n"] is None else d["n"], _f(d.get("mean"), 3),
          _f(d["median"], 3),
          _f(d["p95"], 3), _f(d["max"], 3), _views_used(d) if d["delay"] in ("views", "views_unheld")
          else _f(d["used"], 4 if d["delay"] == "launch_per_node" else 3)] for d in delays])


def _views_used(d: dict) -> str:
    paced = "paced as live (view period)"
    return paced if d.get("used") is None else f"{_f(d['used'], 3)}, apart from the starts; {paced}"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    apps = [a for a in rows if a["row"] == "app" and a["live_start"] is not None]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    ax = axes[0]
    for m, colour in zip(MODELS, ("#d62728", "#1f77b4", "#2ca02c"), strict=True):
        d = sorted(abs(a["live_start"] - a[f"{m}_start"]) for a in apps if a[f"{m}_start"] is not None)
        ax.step(d, [(i + 1) / len(d) for i in range(len(d))], where="post", color=colour, label=f"{m} simulator")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("|start live − start simulated| (s)")
    ax.set_ylabel("fraction of applications")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[2]
    for h in rows:
        if h["row"] == "held":
            ax.step([i * h["step_s"] for i in range(len(h["nodes"]))], h["nodes"], where="post", lw=0.8,
                    label={"live": "live (first run)", **MODEL_NAMES}[h["model"]])
    ax.set_xlabel("seconds since the run's start")
    ax.set_ylabel("nodes held (both clusters)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    f8 = [r for r in rows if r["row"] == "fig8" and r["what"] != "notifications"]
    labels = [f"{r['what']}\n({r['model']})" for r in f8]
    ax.bar(range(len(f8)), [r["ratio"] for r in f8], color="#7f7f7f")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(f8)), labels, fontsize=7)
    ax.set_ylabel("live / simulated")
    ax.set_title("CooRM Fig. 8: traffic and CPU")
    fig.suptitle("The simulator against the live system (coorm experiment twin)")
    common.save(fig, path)
