"""CooRM Fig. 8 across the share of CEM applications (``coorm experiment twin-cem-share``).

The paper validated its simulator on "an instance of W0 in which we replaced a percentage of applications
with instances of the CEM application" (§IV-D), and plotted the real traffic and CPU against the simulated
ones across that percentage. Here: the twin's small scenario (:mod:`.twin_workload`: 16 applications on two
clusters of 8 nodes, the ``--quick`` twin's; on the full one a share of CEMs made a live run thrash past its
limit, see EXPERIMENTS.md) with that share of its applications made CEMs (:func:`~.twin_workload.with_cems`,
the same times and clusters), each share run once live over ``coorm up`` and in the simulator (instant,
calibrated from that live run, sampled), as :mod:`.twin` does; per share, Fig. 8's ratios (notification
bytes, notifications, CPU seconds, live over simulated) and how far the calibrated starts are from the live
ones.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import common, twin
from coorm.experiments.twin_workload import ENV, QUICK_CLUSTERS, workload

NAME = "twin-cem-share"
SHARES = (0.0, 0.25, 0.5)
QUICK_SHARES = (0.0, 0.5)


def run(out: Path, quick: bool = False) -> list[dict]:
    from coorm.experiments import twin_live

    rows: list[dict] = []
    for share in QUICK_SHARES if quick else SHARES:
        specs = workload(True, cem_share=share)
        live = twin_live.run(specs, QUICK_CLUSTERS, ENV, limit=180.0)
        rows += per_share(share, specs, twin.compare(specs, QUICK_CLUSTERS, live))
    common.write_csv(out / f"{NAME}.csv", [r for r in rows if r["row"] == "fig8"])
    plot(rows, out / f"{NAME}.png")
    return rows


def per_share(share: float, specs, rows: list[dict]) -> list[dict]:
    """What is kept of one share's twin rows: the run, Fig. 8, the start differences."""
    cems = sum(s.kind == "cem" for s in specs)
    keep = [r for r in rows if r["row"] in ("run", "fig8") or (r["row"] == "diff" and r["what"] in
                                                                ("start (s)", twin.FORK))]
    return [{**r, "share": share, "cems": cems} for r in keep]


def markdown(rows: list[dict]) -> dict[str, str]:
    shares = sorted({r["share"] for r in rows})
    fig8 = {(r["share"], r["what"], r["model"]): r for r in rows if r["row"] == "fig8"}
    diff = {(r["share"], r["what"], r["model"]): r for r in rows if r["row"] == "diff"}
    run_ = {r["share"]: r for r in rows if r["row"] == "run"}
    f = twin._f
    table = common.md_table(
        ["CEM share", "CEMs / apps", "live run (s)", "notification bytes live / calibrated (instant)",
         "notifications live / calibrated", "CPU s live / simulated (calibrated)", "live CPU s: system + launchers",
         "p95 / median |Δstart| calibrated (s)", "instant (s)"],
        [[f"{s:.0%}", f"{run_[s]['cems']} / {run_[s]['apps']}", f(run_[s]["live_wall_s"], 1),
          f"{f(fig8[(s, 'notification bytes', 'calibrated')]['ratio'])} "
          f"({f(fig8[(s, 'notification bytes', 'instant')]['ratio'])})",
          f(fig8[(s, "notifications", "calibrated")]["ratio"]),
          f"{f(fig8[(s, 'CPU seconds', 'calibrated')]['ratio'], 1)}",
          f"{f(fig8[(s, 'CPU seconds', 'calibrated')]['live_system'])} + "
          f"{f(fig8[(s, 'CPU seconds', 'calibrated')]['live_launchers'])}",
          f"{f(diff[(s, 'start (s)', 'calibrated')]['p95'])} / {f(diff[(s, 'start (s)', 'calibrated')]['median'])}",
          f"{f(diff[(s, 'start (s)', 'instant')]['p95'])} / {f(diff[(s, 'start (s)', 'instant')]['median'])}"]
         for s in shares])
    return {NAME: "Paper (CooRM Fig. 8, a W0 instance with a share of CEMs, nC = 8, CORBA prototype): real traffic "
                  "up to 1.5 times the simulated, real CPU up to 3.3 times.\n\nOurs (one live run per share):\n\n"
                  + table}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what, paper in ((axes[0], "notification bytes", 1.5), (axes[1], "CPU seconds", 3.3)):
        for model in twin.MODELS:
            pts = sorted((r["share"] * 100, r["ratio"]) for r in rows
                         if r["row"] == "fig8" and r["what"] == what and r["model"] == model)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{model} simulator")
        ax.axhline(paper, color="black", ls="--", lw=0.8, label="the paper's maximum")
        ax.set_xlabel("CEM applications (%)")
        ax.set_ylabel(f"{what}: live / simulated")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("CooRM Fig. 8 across the share of CEM applications (coorm experiment twin-cem-share)")
    common.save(fig, path)
