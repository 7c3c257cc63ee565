"""``summary.json``: per application and in total, from a simulation's result (format in README)."""

from __future__ import annotations

import dataclasses

from coorm.simulator.engine import Result

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
