"""CooRMv2 Fig. 9: an AMR (dynamic or static) and a PSA (600 s tasks), across overcommit factors.

Scenario (CooRMv2 §V-A, §V-B): one cluster of ``n = ceil(1400 * phi)`` nodes, re-scheduling interval 1 s;
at t = 0 the AMR opens (first: it has the priority), then PSA1 (``d_task`` = 600 s). The AMR targets 75%
efficiency with spontaneous updates and pre-allocates ``phi * n_eq`` nodes; ``static`` forces it to use its
whole pre-allocation throughout. PSAs are background applications: the run ends when the AMR finishes.

Plotted per overcommit factor, medians and quartiles over the AMR's profile seeds:

* **AMR used resources**: the node-seconds the AMR held (its ``stats().node_seconds``), in node-hours;
* **PSA waste**: node-seconds of tasks the PSA had to kill (its ``stats()['waste']``), in node-hours.

This module also holds :func:`simulate`, the one scenario runner that Fig. 10 and Fig. 11 reuse.

Measuring what each application was allocated. ``summarize(result)`` cannot be called on a result that
holds an AMR launcher (its ``stats()`` is a dataclass, the summary calls ``.get`` on it); we call it on a
copy of the result whose AMR launcher answers ``stats()`` with a dict. The summary's node-seconds come
from request records whose end is the time of the ``done`` -- but after a NEXT update's ``done`` the nodes
stay with the application (parked for the successor, which the RMS starts at its next pass, up to one
re-scheduling interval later) and the application keeps computing on them. So we also integrate, between
simulation events, the node IDs the allocator has given each application (``allocated``): for the AMR
it equals its own ``stats().node_seconds`` (plus the nodes it released, until the pass that frees them);
the summary's figure is reported next to it (``*_summary`` columns).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from coorm.experiments.common import fmt_q, md_table, quartiles, save, write_csv
from coorm.launchers.amr import AMRLauncher
from coorm.launchers.psa import PSALauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.engine import Simulation, SimulationError
from coorm.simulator.summary import summarize

NAME = "coormv2-fig9"

NODES_PER_PHI = 1400  # n = 1400 * phi (§V-B)
RESCHEDULE_INTERVAL = 1.0  # §V-A
PSA1_TASK = 600.0  # §V-B
TARGET = 0.75  # §V-A1
HOUR = 3600.0

FULL = dict(phis=(0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0), seeds=range(10), steps=1000)
QUICK = dict(phis=(0.6, 1.0, 2.0), seeds=range(3), steps=300)


# ======================================================================================================
# the scenario runner (Fig. 9, 10, 11)
# ======================================================================================================
class _AllocationMeter:
    """``progress`` hook of :meth:`Simulation.run`: integrates, per application, the node IDs the
    allocator has given its started requests (request ids are ``<app>.<n>``)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.count: dict[str, int] = {}
        self.node_seconds: dict[str, float] = {}
        self.changes: dict[str, int] = {}  # how many times an application's node count changed

    def __call__(self, sim: Simulation) -> None:
        dt = sim.now - self.t
        if dt > 0:
            for app, n in self.count.items():
                self.node_seconds[app] = self.node_seconds.get(app, 0.0) + n * dt
        self.t = max(self.t, sim.now)
        count: dict[str, int] = {}
        for request, nodes in sim.cores.allocator.allocations.items():
            app = request.rsplit(".", 1)[0]
            count[app] = count.get(app, 0) + len(nodes)
        for app in count.keys() | self.count.keys():
            if count.get(app, 0) != self.count.get(app, 0):
                self.changes[app] = self.changes.get(app, 0) + 1
        self.count = count


class _DictStats:
    """A launcher whose ``stats()`` is a dict, for :func:`summarize` (see the module docstring)."""

    def __init__(self, launcher) -> None:
        self._launcher = launcher

    def __getattr__(self, name):
        return getattr(self._launcher, name)

    def stats(self) -> dict:
        s = self._launcher.stats()
        return dataclasses.asdict(s) if dataclasses.is_dataclass(s) else s


class RunFailed(RuntimeError):
    """A run that could not complete: a launcher's command refused by the RMS, or the AMR not done."""


def simulate(
    seed: int,
    *,
    overcommit: float = 1.0,
    static: bool = False,
    announce_interval: float = 0.0,
    psa_tasks: Sequence[float] = (PSA1_TASK,),
    psa_arrivals: Sequence[float] | None = None,
    preemptible: str = "filling",
    steps: int = 1000,
    nodes: int | None = None,
    pipelined: bool = False,
) -> dict:
    """One run: the AMR of profile ``seed`` then one PSA per task duration, on ``ceil(1400 * overcommit)``
    nodes (or ``nodes``). ``pipelined``: the AMR announces an update at every step whose need changed,
    without waiting for the last one (:mod:`coorm.experiments.pipelined_amr`). Returns flat metrics
    (node-seconds, seconds)."""
    from coorm.experiments.pipelined_amr import PipelinedAMR

    n = nodes if nodes is not None else math.ceil(NODES_PER_PHI * overcommit - 1e-9)
    settings = PolicySettings(reschedule_interval=RESCHEDULE_INTERVAL, preemptible=preemptible)
    sim = Simulation({"c0": n}, settings)
    amr_class = PipelinedAMR if pipelined else AMRLauncher
    amr = amr_class("amr", "c0", overcommit=overcommit, target_efficiency=TARGET,
                    announce_interval=announce_interval, static=static, seed=seed, steps=steps)
    sim.add(0.0, amr)
    psas = [PSALauncher(f"psa{i + 1}", "c0", d) for i, d in enumerate(psa_tasks)]
    for p, at in zip(psas, psa_arrivals or [0.0] * len(psas), strict=True):
        sim.add(at, p)
    meter = _AllocationMeter()
    try:
        result = sim.run(progress=meter)
    except SimulationError as e:
        raise RunFailed(f"seed {seed}: {e}"[:300]) from e
    meter(sim)
    summary = summarize(dataclasses.replace(result, launchers={a: _DictStats(la) for a, la in
                                                               result.launchers.items()}))
    per_app = {a["id"]: a for a in summary["apps"]}
    st = amr.stats()
    if st.failed is not None or st.steps_done != steps or result.rejections:
        raise RunFailed(f"seed {seed}: the AMR did not complete: {st} {result.rejections[:3]}")
    end = result.now  # the AMR's end: the run stops there, the PSAs being background applications
    total = n * end
    out = {
        "nodes": n,
        "end_time": end,
        "amr_end_time": st.end_time,
        "amr_run_time": st.end_time - st.started_at,
        "amr_node_seconds": st.node_seconds,
        "amr_allocated": meter.node_seconds.get("amr", 0.0),
        "amr_summary": per_app["amr"]["node_seconds"]["non_preemptible"],
        "amr_updates": st.updates,
        "amr_paused": st.paused_seconds,
        "preallocation": st.preallocation,
        "n_eq": st.n_eq,
        "total": total,
    }
    waste = alloc = alloc_summary = 0.0
    for p in psas:
        ps = p.stats()
        out[f"{p.app}_waste"] = ps["waste"]
        out[f"{p.app}_allocated"] = meter.node_seconds.get(p.app, 0.0)
        out[f"{p.app}_summary"] = per_app[p.app]["node_seconds"]["preemptible"]
        out[f"{p.app}_completed"] = ps["completed_tasks"]
        out[f"{p.app}_killed"] = ps["killed_tasks"]
        waste += ps["waste"]
        alloc += out[f"{p.app}_allocated"]
        alloc_summary += out[f"{p.app}_summary"]
    out["psa_waste"] = waste
    # percent of used resources (§V-C): (allocated to applications - PSA waste) / total resources
    out["used_pct"] = 100.0 * (out["amr_allocated"] + alloc - waste) / total
    out["used_pct_summary"] = 100.0 * (out["amr_summary"] + alloc_summary - waste) / total
    # what no application holds: the resources the PSA left (CooRMv2 §V-C: "frees") to the system
    out["idle_pct"] = 100.0 * (total - out["amr_allocated"] - alloc) / total
    out["amr_changes"] = meter.changes.get("amr", 0)
    out["amr_mean_hold_s"] = end / max(1, out["amr_changes"])
    return out


def _one_seed(task: tuple[int, dict]) -> tuple[int, dict | None, str | None]:
    seed, kw = task
    try:
        return seed, simulate(seed, **kw), None
    except RunFailed as e:
        return seed, None, str(e)


def over_seeds(seeds, **kw) -> tuple[dict[int, dict], list[str]]:
    """:func:`simulate` for every seed, on a process pool (``COORM_EXPERIMENT_WORKERS``, one per core by
    default): the runs that completed, by seed, and why the others failed (reported in the CSV as
    ``failed_runs``, left out of the quartiles)."""
    from coorm.experiments.coorm_fig6 import run_tasks

    done: dict[int, dict] = {}
    failed: list[str] = []
    for seed, result, why in run_tasks(_one_seed, [(s, kw) for s in seeds]):
        if result is not None:
            done[seed] = result
        else:
            failed.append(str(why))
    return done, failed


def stats_row(prefix: str, values: Sequence[float]) -> dict:
    """``prefix_min``, ``prefix_q1``, ``prefix_median``, ``prefix_q3``, ``prefix_max``."""
    return {f"{prefix}_{k}": v for k, v in quartiles(values).items()}


def series(rows: list[dict], x: str, prefix: str, scale: float = 1.0) -> tuple[list, list, list, list]:
    return ([r[x] for r in rows], [r[f"{prefix}_median"] * scale for r in rows],
            [r[f"{prefix}_q1"] * scale for r in rows], [r[f"{prefix}_q3"] * scale for r in rows])


# ======================================================================================================
# Fig. 9
# ======================================================================================================
def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    rows: list[dict] = []
    for phi in cfg["phis"]:
        for mode in ("dynamic", "static"):
            done, failed = over_seeds(cfg["seeds"], overcommit=phi, static=mode == "static",
                                      steps=cfg["steps"])
            runs = list(done.values())
            row = {"overcommit": phi, "mode": mode, "nodes": math.ceil(NODES_PER_PHI * phi - 1e-9),
                   "seeds": len(runs), "failed_runs": len(failed), "steps": cfg["steps"]}
            row |= stats_row("amr_used_nh", [r["amr_node_seconds"] / HOUR for r in runs])
            row |= stats_row("psa_waste_nh", [r["psa_waste"] / HOUR for r in runs])
            row |= stats_row("amr_end_time_s", [r["end_time"] for r in runs])
            row |= stats_row("amr_summary_nh", [r["amr_summary"] / HOUR for r in runs])
            row |= stats_row("used_pct", [r["used_pct"] for r in runs])
            row["amr_updates_median"] = quartiles([r["amr_updates"] for r in runs])["median"]
            row["amr_paused_max"] = max((r["amr_paused"] for r in runs), default=float("nan"))
            row["failures"] = " | ".join(failed)
            rows.append(row)
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", rows)
    return rows


PAPER = (
    "A static AMR uses more resources as φ grows.",
    "A dynamic AMR keeps an efficient execution as φ grows.",
    "The impact of preemption on the AMR is negligible.",
    "PSA waste is non-negligible, but smaller than what an inefficient static AMR uses.",
    "PSA waste first increases with φ, then stays constant once φ > 1.",
)


def markdown(rows: list[dict]) -> dict[str, str]:
    """EXPERIMENTS.md's Fig. 9 table (node-hours, medians [q1–q3] over seeds)."""
    dyn = {r["overcommit"]: r for r in rows if r["mode"] == "dynamic"}
    sta = {r["overcommit"]: r for r in rows if r["mode"] == "static"}
    table = md_table(
        ("φ", "nodes", "AMR used, dynamic", "AMR used, static", "PSA waste, dynamic", "PSA waste, static",
         "AMR updates (dyn.)", "AMR used, dynamic, per summary()", "AMR paused (s, max)"),
        [(f"{phi:g}", d["nodes"], fmt_q(d, "amr_used_nh"), fmt_q(sta[phi], "amr_used_nh"),
          fmt_q(d, "psa_waste_nh"), fmt_q(sta[phi], "psa_waste_nh"), f"{d['amr_updates_median']:g}",
          fmt_q(d, "amr_summary_nh"), f"{max(d['amr_paused_max'], sta[phi]['amr_paused_max']):g}")
         for phi, d in dyn.items()])
    paper = "**Paper:**\n" + "\n".join(f"{i}. {t}" for i, t in enumerate(PAPER, 1))
    n = next(iter(dyn.values()))["seeds"]
    return {"coormv2-fig9": f"{paper}\n\nOurs, node-hours, medians [q1–q3] over {n} seeds:\n\n{table}"}


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for ax, prefix, ylabel in ((axes[0], "amr_used_nh", "AMR used resources (node-hours)"),
                               (axes[1], "psa_waste_nh", "PSA waste (node-hours)")):
        for mode in ("dynamic", "static"):
            x, med, q1, q3 = series([r for r in rows if r["mode"] == mode], "overcommit", prefix)
            ax.plot(x, med, marker="o", label=mode)
            ax.fill_between(x, q1, q3, alpha=0.2)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("CooRMv2 Fig. 9: spontaneous updates (medians, q1-q3 bands)")
    axes[1].set_xlabel("overcommit factor")
    save(fig, path)


__all__ = ["NAME", "RunFailed", "over_seeds", "run", "simulate"]
