"""CooRMv2 Fig. 3 and Fig. 4: the AMR model alone (§II-C), no RMS.

* **Fig. 3**: end-time increase ``T_static(n_eq) / T_dynamic - 1`` when the equivalent static allocation
  replaces the dynamic one, per target efficiency; quartiles over working-set profiles (seeds). Profiles
  without an equivalent static allocation (above ~0.8, see :mod:`coorm.launchers.amr_model`) are counted in
  ``missing``. The paper: at most 2.5%, and ``n_eq`` exists for ``e_t < 0.8``.
* **Fig. 4**: for a 75% target, the static node counts a user may choose per maximum data size ``Smax``:
  at least ``ceil(Smax / M)`` (not running out of memory) and at most the count whose area is 110% of
  ``A(75%)``; the upper bound depends on the profile (quartiles over seeds), ``safe_hi`` is the largest
  count good for every profile (none when the memory bound is above it).

One CSV and one PNG, ``figure`` = ``fig3`` or ``fig4`` on each row.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments.common import quartiles, save, write_csv
from coorm.launchers import amr_model as model

NAME = "coormv2-fig3-4"

TIB = model.MIB_PER_TIB
FULL = dict(
    targets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9),
    smax_tib=(0.125, 0.25, 0.5, 1.0, 2.0, 3.16, 4.0, 6.0, 8.0, 12.0, 16.0),
    seeds=range(100),
)
QUICK = dict(targets=(0.3, 0.5, 0.75, 0.85), smax_tib=(0.5, 3.16, 16.0), seeds=range(10))


def fig3_rows(targets, seeds) -> list[dict]:
    seeds = list(seeds)
    rows = []
    for p in model.fig3(targets, seeds):
        row = {"figure": "fig3", "target_efficiency": p.target, "profiles": len(seeds), "missing": p.missing}
        row |= {f"increase_pct_{k}": 100.0 * v for k, v in quartiles(p.increases).items()}
        rows.append(row)
    return rows


def fig4_rows(smax_tib, seeds, target: float = 0.75) -> list[dict]:
    seeds = list(seeds)
    rows = []
    for p in model.fig4([s * TIB for s in smax_tib], seeds, target=target):
        his = [r[1] for r in p.per_profile if r is not None]
        row = {"figure": "fig4", "smax_tib": p.smax_mib / TIB, "profiles": len(seeds),
               "no_choice": sum(r is None for r in p.per_profile), "memory_min_nodes": p.memory_min}
        row |= {f"max_nodes_{k}": v for k, v in quartiles(his).items()}
        row["safe_hi"] = p.safe[1] if p.safe is not None else None
        rows.append(row)
    return rows


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    rows = fig3_rows(cfg["targets"], cfg["seeds"]) + fig4_rows(cfg["smax_tib"], cfg["seeds"])
    write_csv(out / f"{NAME}.csv", rows)
    _plot(out / f"{NAME}.png", rows)
    return rows


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    f3 = [r for r in rows if r["figure"] == "fig3" and r["missing"] < r["profiles"]]
    f4 = [r for r in rows if r["figure"] == "fig4"]
    fig, (a3, a4) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = [r["target_efficiency"] for r in f3]
    a3.plot(x, [r["increase_pct_median"] for r in f3], marker="o", label="median")
    a3.fill_between(x, [r["increase_pct_q1"] for r in f3], [r["increase_pct_q3"] for r in f3], alpha=0.2,
                    label="q1-q3")
    a3.plot(x, [r["increase_pct_max"] for r in f3], ls="--", marker=".", label="max")
    a3.axhline(2.5, color="grey", lw=0.8, ls=":", label="paper: at most 2.5%")
    a3.set_xlabel("target efficiency")
    a3.set_ylabel("end-time increase (%)")
    a3.set_title("Fig. 3: static (n_eq) instead of dynamic")
    x = [r["smax_tib"] for r in f4 if r["max_nodes_median"] == r["max_nodes_median"]]
    k = [r for r in f4 if r["max_nodes_median"] == r["max_nodes_median"]]
    a4.plot([r["smax_tib"] for r in f4], [r["memory_min_nodes"] for r in f4], marker="o",
            label="min (memory)")
    a4.plot(x, [r["max_nodes_median"] for r in k], marker="o", label="max (110% of A(75%)), median")
    a4.fill_between(x, [r["max_nodes_min"] for r in k], [r["max_nodes_max"] for r in k], alpha=0.2,
                    label="max: min-max over profiles")
    a4.set_xscale("log")
    a4.set_yscale("log")
    a4.set_xlabel("Smax (TiB)")
    a4.set_ylabel("node-count")
    a4.set_title("Fig. 4: static allocation choices, 75% target")
    for ax in (a3, a4):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)
