"""Why Fig. 9's PSA waste is flat only from an overcommit of about 1.4 (the paper: from 1), tested per
profile (``coorm experiment coormv2-fig9-plateau``).

The paper's reason for the plateau: "once the AMR application is provided with a big enough
pre-allocation, it does not change the way it allocates resources inside it" (CooRMv2 §V-B). Our AMR asks,
at each step, for the node count of its 75 % target capped by its pre-allocation ``ceil(phi * n_eq)``
(``AMRLauncher.need``); once the pre-allocation holds its largest need, nothing caps it and its allocations
-- hence the PSA tasks it kills -- no longer depend on phi. So the plateau should begin, for each profile,
at ``phi* = max need / n_eq``: above 1 whenever the profile's peak need exceeds its equivalent static
allocation. This experiment computes ``phi*`` from each profile alone, then runs Fig. 9's scenario (AMR +
PSA1, dynamic) on a finer grid of phi and finds where each profile's waste stops changing.
"""

from __future__ import annotations

import math
from pathlib import Path

from coorm.experiments.common import md_table, save, write_csv
from coorm.experiments.coorm_fig6 import run_tasks
from coorm.experiments.coormv2_fig9 import HOUR, TARGET, RunFailed, simulate
from coorm.launchers.amr import AMRLauncher

NAME = "coormv2-fig9-plateau"
# four profiles whose largest need / n_eq spans Fig. 9's (1.24, 1.28, 1.33, 1.40 of 1.22-1.40), around
# the plateau's start, and 2 (the plateau): 16 runs of 10-20 s of CPU each on our shared machine
FULL = dict(phis=(1.2, 1.3, 1.4, 2.0), seeds=(0, 2, 5, 8), steps=1000)
QUICK = dict(phis=(1.0, 1.4, 2.0), seeds=range(2), steps=300)
SAME_NH = 0.5  # node-hours: a waste this close to the one at the largest phi is on the plateau


def peak_ratio(seed: int, steps: int) -> tuple[int, int, float]:
    """(n_eq, the largest need of the 75 % target, their ratio) of profile ``seed``."""
    amr = AMRLauncher("amr", "c0", target_efficiency=TARGET, seed=seed, steps=steps)
    assert amr.n_eq is not None
    peak = max(amr.wanted)
    return amr.n_eq, peak, peak / amr.n_eq


def _one(task: tuple[int, float, int]) -> dict:
    seed, phi, steps = task
    try:
        r = simulate(seed, overcommit=phi, steps=steps)
    except RunFailed as e:
        return {"row": "run", "seed": seed, "overcommit": phi, "failed": str(e)}
    return {"row": "run", "seed": seed, "overcommit": phi, "failed": None, "preallocation": r["preallocation"],
            "psa_waste_nh": r["psa_waste"] / HOUR, "amr_used_nh": r["amr_node_seconds"] / HOUR,
            "amr_updates": r["amr_updates"]}


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg: dict = QUICK if quick else FULL
    runs = run_tasks(_one, [(s, phi, cfg["steps"]) for s in cfg["seeds"] for phi in cfg["phis"]])
    rows: list[dict] = []
    for seed in cfg["seeds"]:
        n_eq, peak, ratio = peak_ratio(seed, cfg["steps"])
        mine = sorted((r for r in runs if r["seed"] == seed and r["failed"] is None), key=lambda r: r["overcommit"])
        # predicted: the first phi of the grid whose pre-allocation holds the peak need
        predicted = next((p for p in cfg["phis"] if math.ceil(p * n_eq - 1e-9) >= peak), None)
        last = mine[-1]["psa_waste_nh"] if mine else float("nan")
        observed = None
        for i, r in enumerate(mine):  # the first phi from which every waste is the last one's
            if all(abs(x["psa_waste_nh"] - last) <= SAME_NH for x in mine[i:]):
                observed = r["overcommit"]
                break
        rows.append({"row": "seed", "seed": seed, "n_eq": n_eq, "peak_need": peak, "peak_ratio": round(ratio, 3),
                     "predicted_from": predicted, "observed_from": observed,
                     "waste_nh": {f"{r['overcommit']:g}": round(r["psa_waste_nh"], 1) for r in mine},
                     "failed": [r["failed"] for r in runs if r["seed"] == seed and r["failed"]]})
    rows += runs
    write_csv(out / f"{NAME}.csv", [r for r in rows if r["row"] == "run"])
    _plot(out / f"{NAME}.png", rows)
    return rows


def markdown(rows: list[dict]) -> dict[str, str]:
    seeds = [r for r in rows if r["row"] == "seed"]
    phis = sorted({float(p) for r in seeds for p in r["waste_nh"]})
    table = md_table(
        ["profile (seed)", "n_eq", "largest need", "largest need / n_eq", "plateau predicted from φ",
         "observed from φ", *(f"PSA waste φ={p:g}" for p in phis)],
        [[r["seed"], r["n_eq"], r["peak_need"], f"{r['peak_ratio']:.2f}", _g(r["predicted_from"]),
          _g(r["observed_from"]), *(r["waste_nh"].get(f"{p:g}", "—") for p in phis)] for r in seeds])
    agree = sum(r["predicted_from"] == r["observed_from"] for r in seeds)
    ratios = sorted(r["peak_ratio"] for r in seeds)
    return {NAME: f"PSA waste in node-hours, the dynamic AMR with PSA1, one run per profile and φ. The plateau "
                  f"begins where predicted for {agree} of {len(seeds)} profiles; largest need / n_eq from "
                  f"{ratios[0]:.2f} to {ratios[-1]:.2f}.\n\n" + table}


def _g(x) -> str:
    return "—" if x is None else f"{x:g}"


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in (r for r in rows if r["row"] == "seed"):
        pts = sorted((float(p), w) for p, w in r["waste_nh"].items())
        line = ax.plot([p for p, _ in pts], [w for _, w in pts], marker="o", lw=0.8)[0]
        ax.axvline(r["peak_ratio"], color=line.get_color(), ls=":", lw=0.8)
    ax.set_xlabel("overcommit factor φ (dotted: the profile's largest need / n_eq)")
    ax.set_ylabel("PSA waste (node-hours)")
    ax.set_title("CooRMv2 Fig. 9: where each profile's PSA waste stops changing")
    ax.grid(alpha=0.3)
    save(fig, path)
