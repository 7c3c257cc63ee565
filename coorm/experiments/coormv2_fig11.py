"""CooRMv2 Fig. 11: two PSAs (600 s and 60 s tasks), strict equi-partitioning vs filling.

Scenario (§V-D): Fig. 10's (:func:`coorm.experiments.coormv2_fig9.simulate`, overcommit 1, 1400 nodes, an AMR
with announced updates of each swept interval) plus PSA2 with 60 s tasks. The policy core's preemptible
capacity is shared ``strict`` (each PSA sees the same share whatever the other asks for) or ``filling``
(CooRMv2's default: what one PSA leaves, the other may take). Per announce interval and policy: the
**percent of used resources** (as Fig. 10: allocated minus PSA waste over nodes x the AMR's end), with its
quartiles in the CSV; the plot shows medians only, as the paper does.

Both PSAs open at time 0. (Until the PSA launcher grew with an additional request instead of a NEXT
update, both asked for the whole capacity in the first pass and locked each other out; PSA2 then opened
5 s later. See EXPERIMENTS.md.)
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments.common import fmt_q, md_table, save, write_csv
from coorm.experiments.coormv2_fig9 import HOUR, PSA1_TASK, over_seeds, stats_row

NAME = "coormv2-fig11"

PSA2_TASK = 60.0
PSA2_DELAY = 0.0
POLICIES = ("strict", "filling")

# every 100 s, not every 50 s as Fig. 10's: 220 runs instead of 420 (the stored run: 228 s, one worker)
FULL = dict(intervals=tuple(range(0, 1001, 100)), seeds=range(10), steps=1000)
QUICK = dict(intervals=(0, 300, 600), seeds=range(3), steps=300)


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    rows = []
    for interval in cfg["intervals"]:
        for policy in POLICIES:
            done, failed = over_seeds(cfg["seeds"], announce_interval=interval,
                                      psa_tasks=(PSA1_TASK, PSA2_TASK), psa_arrivals=(0.0, PSA2_DELAY),
                                      preemptible=policy, steps=cfg["steps"])
            runs = list(done.values())
            row = {"announce_interval": interval, "policy": policy, "nodes": 1400, "seeds": len(runs),
                   "failed_runs": len(failed), "steps": cfg["steps"]}
            row |= stats_row("used_pct", [r["used_pct"] for r in runs])
            row |= stats_row("used_pct_summary", [r["used_pct_summary"] for r in runs])
            for app in ("psa1", "psa2"):
                row |= stats_row(f"{app}_allocated_pct",
                                 [100.0 * r[f"{app}_allocated"] / r["total"] for r in runs])
                row |= stats_row(f"{app}_waste_nh", [r[f"{app}_waste"] / HOUR for r in runs])
            row |= stats_row("amr_allocated_pct", [100.0 * r["amr_allocated"] / r["total"] for r in runs])
            # what no application held: the most filling could add to strict's used resources (with the waste)
            row |= stats_row("idle_pct", [r["idle_pct"] for r in runs])
            row["failures"] = " | ".join(failed)
            rows.append(row)
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", rows)
    return rows


def markdown(rows: list[dict]) -> dict[str, str]:
    """EXPERIMENTS.md's Fig. 11 table: medians [q1–q3] over seeds."""
    by = {(r["announce_interval"], r["policy"]): r for r in rows}
    intervals = list(dict.fromkeys(r["announce_interval"] for r in rows))

    def share(r: dict) -> str:
        return f"{r['psa1_allocated_pct_median']:.1f} / {r['psa2_allocated_pct_median']:.1f}"

    table = md_table(
        ("announce interval (s)", "strict", "filling", "filling − strict (points)",
         "unused under strict: 100 − strict (points)", "idle %, strict / filling",
         "PSA1 / PSA2 allocated %, strict", "PSA1 / PSA2 allocated %, filling",
         "PSA1 / PSA2 waste (node-h), filling"),
        [(i, fmt_q(by[(i, "strict")], "used_pct", 2), fmt_q(by[(i, "filling")], "used_pct", 2),
          f"{by[(i, 'filling')]['used_pct_median'] - by[(i, 'strict')]['used_pct_median']:+.2f}",
          f"{100.0 - by[(i, 'strict')]['used_pct_median']:.2f}",
          f"{by[(i, 'strict')]['idle_pct_median']:.2f} / {by[(i, 'filling')]['idle_pct_median']:.2f}",
          share(by[(i, "strict")]), share(by[(i, "filling")]),
          f"{by[(i, 'filling')]['psa1_waste_nh_median']:.0f} / {by[(i, 'filling')]['psa2_waste_nh_median']:.0f}")
         for i in intervals])
    n, failed = rows[0]["seeds"], sum(r["failed_runs"] for r in rows)
    return {"coormv2-fig11": "**Paper:** with filling, PSA2 (60 s tasks) fills what PSA1 (600 s tasks) cannot "
                             "use, so the percent of used resources is higher than with strict "
                             "equi-partitioning (the figure shows medians only).\n\n"
                             f"Ours: used resources %, medians [q1–q3] over {n} seeds; failed runs: {failed}.\n\n"
                             + table}


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        ax.plot([r["announce_interval"] for r in mine], [r["used_pct_median"] for r in mine], marker="o",
                label=f"{policy} equi-partitioning" if policy == "strict" else "filling (CooRMv2)")
    ax.set_title("CooRMv2 Fig. 11: two PSAs (600 s, 60 s tasks), medians")
    ax.set_xlabel("announce interval (s)")
    ax.set_ylabel("used resources (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
