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
  between a NEXT update's ``done`` and its successor's start (see :mod:`coorm.experiments.coormv2_fig9`);
* **idle** (%): what no application holds, (total - allocated to the AMR and the PSA) / total: the
  resources the PSA "frees" (§V-C: the holes it cannot fill are "either wasted on killed tasks or
  released to the system [...] the higher the announce interval, the more resources the PSA frees");
* the AMR's and the PSA's allocated shares, and how often the AMR's node count changed.

Each interval is run with two AMRs (``amr`` on the rows): ``one in flight``, the shipped launcher, which
waits for an update's target to start before it re-evaluates (so its allocation changes about once per
interval), and ``pipelined`` (:mod:`coorm.experiments.pipelined_amr`), which announces at every step whose
need changed -- the one factor EXPERIMENTS.md's hypothesis about the PSA's share names.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments.common import fmt_q, md_table, quartiles, save, write_csv
from coorm.experiments.coormv2_fig9 import HOUR, PSA1_TASK, over_seeds, series, stats_row

NAME = "coormv2-fig10"

FULL = dict(intervals=tuple(range(0, 1001, 50)), seeds=range(10), steps=1000)
QUICK = dict(intervals=(0, 300, 600, 900), seeds=range(3), steps=300)
AMRS = {"one in flight": False, "pipelined": True}  # the AMR variant -> simulate(pipelined=)


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    rows = []
    for amr, pipelined in AMRS.items():
        rows.extend(_sweep(cfg, amr, pipelined))
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", [r for r in rows if r["amr"] == "one in flight"])
    return rows


def _sweep(cfg: dict, amr: str, pipelined: bool) -> list[dict]:
    results = {interval: over_seeds(cfg["seeds"], announce_interval=interval, steps=cfg["steps"],
                                    pipelined=pipelined)
               for interval in sorted(set(cfg["intervals"]) | {0})}
    base = {s: r["amr_run_time"] for s, r in results[0][0].items()}
    rows = []
    for interval in cfg["intervals"]:
        done, failed = results[interval]
        runs = list(done.values())
        row = {"amr": amr, "announce_interval": interval, "d_task": PSA1_TASK, "overcommit": 1.0, "nodes": 1400,
               "seeds": len(runs), "failed_runs": len(failed), "steps": cfg["steps"]}
        row |= stats_row("amr_end_increase_pct", [100.0 * (r["amr_run_time"] / base[s] - 1.0)
                                                  for s, r in done.items() if s in base])
        row |= stats_row("psa_waste_nh", [r["psa_waste"] / HOUR for r in runs])
        row |= stats_row("used_pct", [r["used_pct"] for r in runs])
        row |= stats_row("used_pct_summary", [r["used_pct_summary"] for r in runs])
        row |= stats_row("psa_allocated_pct", [100.0 * r["psa1_allocated"] / r["total"] for r in runs])
        row |= stats_row("amr_allocated_pct", [100.0 * r["amr_allocated"] / r["total"] for r in runs])
        row |= stats_row("idle_pct", [r["idle_pct"] for r in runs])
        row |= stats_row("amr_mean_hold_s", [r["amr_mean_hold_s"] for r in runs])
        row["psa_killed_median"] = quartiles([r["psa1_killed"] for r in runs])["median"]
        row["amr_updates_median"] = quartiles([r["amr_updates"] for r in runs])["median"]
        row["amr_changes_median"] = quartiles([r["amr_changes"] for r in runs])["median"]
        row["failures"] = " | ".join(failed)
        rows.append(row)
    return rows


PAPER = (
    "The AMR's end time increases with the interval.",
    "PSA waste decreases as the interval increases, and is zero once the interval ≥ d_task (600 s).",
    "Announced updates do not generally improve the percent of used resources.",
    "That percentage peaks at 300 s and 600 s (\"resonance\") and is lowest at 550 s.",
    "The higher the interval, the more resources the PSA frees (\"released to the system\").",
)


def markdown(rows: list[dict]) -> dict[str, str]:
    """EXPERIMENTS.md's Fig. 10 tables: the shipped AMR's sweep, and both AMRs side by side."""
    ours = [r for r in rows if r["amr"] == "one in flight"]
    paper = "**Paper:**\n" + "\n".join(f"{i}. {t}" for i, t in enumerate(PAPER, 1))
    n = ours[0]["seeds"]
    table = md_table(
        ("announce interval (s)", "AMR end-time increase %", "PSA waste (node-h)", "used resources %",
         "used % per summary()", "idle % (freed)", "PSA allocated %", "AMR allocated %", "AMR updates"),
        [(r["announce_interval"], fmt_q(r, "amr_end_increase_pct", 1), fmt_q(r, "psa_waste_nh"),
          fmt_q(r, "used_pct", 2), f"{r['used_pct_summary_median']:.2f}", fmt_q(r, "idle_pct", 2),
          f"{r['psa_allocated_pct_median']:.1f}", f"{r['amr_allocated_pct_median']:.1f}",
          f"{r['amr_updates_median']:g}") for r in ours])
    both = {(r["amr"], r["announce_interval"]): r for r in rows}
    mech = md_table(
        ("announce interval (s)", "AMR node-count changes: one in flight / pipelined",
         "time between changes (s)", "AMR end-time increase %", "PSA waste (node-h)", "PSA allocated %",
         "idle % (freed)", "used resources %"),
        [(i, *(" / ".join(fmt(both[(a, i)]) for a in AMRS) for fmt in (
            lambda r: f"{r['amr_changes_median']:g}", lambda r: f"{r['amr_mean_hold_s_median']:.0f}",
            lambda r: f"{r['amr_end_increase_pct_median']:.1f}", lambda r: f"{r['psa_waste_nh_median']:.0f}",
            lambda r: f"{r['psa_allocated_pct_median']:.1f}", lambda r: f"{r['idle_pct_median']:.2f}",
            lambda r: f"{r['used_pct_median']:.2f}")))
         for i in dict.fromkeys(r["announce_interval"] for r in ours)])
    return {"coormv2-fig10": f"{paper}\n\nOurs (the shipped AMR, one update in flight), medians [q1–q3] over "
                             f"{n} seeds:\n\n{table}",
            "coormv2-fig10-pipelined": "Medians over the same seeds; each cell: one in flight / pipelined.\n\n"
                                       + mech}


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
