"""``summary.json``: per application and in total, from a simulation's result (format in README); and the
per-job records (:func:`job_records`) the metrics and the jobs CSV (:func:`write_jobs_csv`) are made of."""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from coorm.simulator.engine import Result
from coorm.simulator.metrics import JobRecord, extremes, job_usage

if TYPE_CHECKING:
    from coorm.simulator.replay import Planned

TYPES = ("pre-allocation", "non-preemptible", "preemptible")
KEYS = {"pre-allocation": "pre_allocation", "non-preemptible": "non_preemptible", "preemptible": "preemptible"}


def _t(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def summarize(result: Result) -> dict:
    end_of_run = result.now
    per_app: dict[str, dict[str, float]] = {a: {KEYS[t]: 0.0 for t in TYPES} for a in result.apps}
    for r in result.requests:
        end = r.end if r.end is not None else end_of_run
        per_app.setdefault(r.app, {KEYS[t]: 0.0 for t in TYPES})[KEYS[r.type]] += r.nodes * max(end - r.start, 0.0)
    apps = []
    for app_id, rec in result.apps.items():
        launcher = result.launchers.get(app_id)
        stats = launcher.stats() if launcher is not None and hasattr(launcher, "stats") else {}
        if dataclasses.is_dataclass(stats):
            stats = dataclasses.asdict(stats)
        apps.append({
            "id": app_id,
            "name": rec.name,
            "kind": rec.kind,
            "submitted": _t(rec.submitted),
            "started": _t(rec.started),
            "ended": _t(rec.ended),
            "end_reason": rec.end_reason,
            "node_seconds": {k: round(v, 3) for k, v in per_app[app_id].items()},
            "waste": round(float(stats.get("waste", 0.0)), 3),
            "computed_configurations": launcher.computed_configurations if launcher else 0,
            "stats": stats,
        })
    finished = [a["ended"] for a in apps if a["ended"] is not None and not result.launchers[a["id"]].background]
    makespan = max(finished) if finished else end_of_run
    capacity = sum(result.clusters.values()) * makespan
    used = 0.0
    for r in result.requests:
        if r.type != "pre-allocation":
            end = min(r.end if r.end is not None else end_of_run, makespan)
            used += r.nodes * max(end - r.start, 0.0)
    return {
        "apps": apps,
        "totals": {
            "makespan": round(makespan, 6),
            "utilisation": round(used / capacity, 6) if capacity else 0.0,
            "messages": result.messages,
            "bytes": result.bytes,
            "computed_configurations": result.computed_configurations,
            "scheduling_cpu_s": round(result.scheduling_cpu, 6),
            "passes": result.passes,
            "rejected_commands": len(result.rejections),
            "waste": round(sum(a["waste"] for a in apps), 3),
        },
    }


# ======================================================================================================
# per job
# ======================================================================================================
_REFUSED = re.compile(r"^request (\S+)\.\d+:")


def refused_apps(result: Result) -> set[str]:
    """The applications whose request the policy core refused as larger than its cluster (too_large)."""
    out = set()
    for _, code, reason in result.rejections:
        m = _REFUSED.match(reason)
        if code == "too_large" and m:
            out.add(m.group(1))
    return out


def _state(result: Result, p: Planned, refused: set[str]) -> str:
    rec = result.apps.get(p.app)
    if p.launcher is None:
        return "skipped"
    if p.app in refused:
        return "refused"
    if rec is None or rec.started is None:
        return "waiting"  # never started (the run stopped first)
    if rec.ended is None:
        return "unfinished"
    if rec.end_reason != "finished":
        return str(rec.end_reason)  # its session was ended by the RMS: violation, session_closed...
    launcher = result.launchers.get(p.app)
    if launcher is not None and launcher.kind == "rigid" and getattr(launcher, "runtime", 0) >= getattr(
            launcher, "duration", float("inf")):
        return "timeout"  # it needed its whole walltime: the RMS ended it there
    return "completed"


def job_records(result: Result, planned: Sequence[Planned]) -> list[JobRecord]:
    """One record per planned job (skipped ones included), from a run's result."""
    segments: dict[str, list[tuple[float, float, int]]] = {}
    for r in result.requests:
        if r.type != "pre-allocation":
            end = r.end if r.end is not None else result.now
            segments.setdefault(r.app, []).append((r.start, end, r.nodes))
    refused = refused_apps(result)
    out = []
    for p in planned:
        rec = result.apps.get(p.app)
        launcher = p.launcher
        out.append(JobRecord(
            app=p.app, seq=p.seq, submit=p.at,
            start=None if rec is None else rec.started,
            end=None if rec is None or rec.started is None else rec.ended,
            segments=tuple(sorted(segments.get(p.app, ()))),
            state=_state(result, p, refused),
            job=p.job, user=p.user,
            kind="-" if launcher is None else launcher.kind,
            nodes_requested=p.nodes, oversize=p.oversize,
            background=launcher is not None and launcher.background and p.oversize != "refused",
        ))
    return out


CSV_COLUMNS = ("seed", "app", "job", "user", "kind", "submit", "start", "end", "wait", "run_time", "turnaround",
               "nodes_requested", "nodes_min", "nodes_max", "node_seconds", "nodes_over_time", "bounded_slowdown",
               "state", "oversize", "measured")


def _num(x: float | int | None) -> str:
    if x is None:
        return ""
    if isinstance(x, int) or float(x).is_integer():
        return str(int(x))
    return repr(round(float(x), 6))


def job_rows(records: Sequence[JobRecord], seed: int, measured: set[str]) -> list[dict[str, str]]:
    """The jobs CSV's rows (:data:`CSV_COLUMNS`): times in seconds of virtual time, an empty cell for
    what does not apply (a job that never started has no wait)."""
    rows = []
    for j in records:
        held, ns = job_usage(j)
        lo, hi = extremes(held)
        started = j.start is not None
        rows.append({
            "seed": str(seed), "app": j.app, "job": j.job, "user": j.user, "kind": j.kind,
            "submit": _num(j.submit), "start": _num(j.start), "end": _num(j.end), "wait": _num(j.wait),
            "run_time": _num(j.run_time), "turnaround": _num(j.turnaround),
            "nodes_requested": _num(j.nodes_requested),
            "nodes_min": _num(lo) if started else "", "nodes_max": _num(hi) if started else "",
            "node_seconds": _num(ns) if started else "",
            "nodes_over_time": " ".join(f"{_num(t)}:{n}" for t, n in held),
            "bounded_slowdown": _num(j.bounded_slowdown),
            "state": j.state, "oversize": j.oversize, "measured": "1" if j.app in measured else "0",
        })
    return rows


def write_jobs_csv(path: Path, rows: Sequence[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
