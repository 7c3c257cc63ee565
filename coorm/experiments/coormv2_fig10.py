"""CooRMv2 Fig. 10: announced updates, sweeping the announce interval, overcommit factor 1.

Scenario (§V-C): as Fig. 9 (:func:`coorm.experiments.coormv2_fig9.simulate`) with ``phi`` = 1 (1400 nodes): an
AMR that sends announced updates of ``announce_interval`` seconds (0: spontaneous) and PSA1 (600 s
tasks). Per announce interval, medians and quartiles over the AMR's profile seeds of:

* **AMR end-time increase** (%): the AMR's run time over its run time with spontaneous updates (same
  seed, same scenario, interval 0), minus one;
* **PSA waste** (node-hours): the node-seconds of the tasks the PSA killed;
* **percent of used resources**: (resources allocated to applications - PSA waste) / total resources,
  total = nodes x the AMR's end. "Allocated" is the node IDs the allocator gave each application,
  integrated over time (``used_pct``); ``used_pct_summary`` is the same from ``summarize()``'s
  node-seconds, which leave out the up to one re-scheduling interval an application keeps its nodes
  between a NEXT update's ``done`` and its successor's start (see :mod:`coorm.experiments.coormv2_fig9`).
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments.common import quartiles, save, write_csv
from coorm.experiments.coormv2_fig9 import HOUR, PSA1_TASK, over_seeds, series, stats_row

NAME = "coormv2-fig10"

FULL = dict(intervals=tuple(range(0, 1001, 50)), seeds=range(10), steps=1000)
QUICK = dict(intervals=(0, 300, 600, 900), seeds=range(3), steps=300)


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    results = {interval: over_seeds(cfg["seeds"], announce_interval=interval, steps=cfg["steps"])
               for interval in sorted(set(cfg["intervals"]) | {0})}
    base = {s: r["amr_run_time"] for s, r in results[0][0].items()}
    rows = []
    for interval in cfg["intervals"]:
        done, failed = results[interval]
        runs = list(done.values())
        row = {"announce_interval": interval, "d_task": PSA1_TASK, "overcommit": 1.0, "nodes": 1400,
               "seeds": len(runs), "failed_runs": len(failed), "steps": cfg["steps"]}
        row |= stats_row("amr_end_increase_pct", [100.0 * (r["amr_run_time"] / base[s] - 1.0)
                                                  for s, r in done.items() if s in base])
        row |= stats_row("psa_waste_nh", [r["psa_waste"] / HOUR for r in runs])
        row |= stats_row("used_pct", [r["used_pct"] for r in runs])
        row |= stats_row("used_pct_summary", [r["used_pct_summary"] for r in runs])
        row |= stats_row("psa_allocated_pct", [100.0 * r["psa1_allocated"] / r["total"] for r in runs])
        row |= stats_row("amr_allocated_pct", [100.0 * r["amr_allocated"] / r["total"] for r in runs])
        row["psa_killed_median"] = quartiles([r["psa1_killed"] for r in runs])["median"]
        row["amr_updates_median"] = quartiles([r["amr_updates"] for r in runs])["median"]
        row["failures"] = " | ".join(failed)
        rows.append(row)
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", rows)
    return rows


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    panels = (("amr_end_increase_pct", "AMR end-time increase (%)"),
              ("psa_waste_nh", "PSA waste (node-hours)"),
              ("used_pct", "used resources (%)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 9), sharex=True)
    for ax, (prefix, ylabel) in zip(axes, panels, strict=True):
        x, med, q1, q3 = series(rows, "announce_interval", prefix)
        ax.plot(x, med, marker="o")
        ax.fill_between(x, q1, q3, alpha=0.2)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].axvline(PSA1_TASK, color="grey", lw=0.8, ls=":")
    axes[0].set_title("CooRMv2 Fig. 10: announced updates, overcommit 1 (medians, q1-q3 bands)")
    axes[-1].set_xlabel("announce interval (s)")
    save(fig, path)
