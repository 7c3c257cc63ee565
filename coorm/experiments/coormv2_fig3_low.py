"""CooRMv2 Fig. 3 at low target efficiencies: why our end-time increase exceeds the paper's 2.5 %.

The paper: the equivalent static allocation ends "at most 2.5 %" later. Ours (``coormv2-fig3-4``): a median
of 4.0 % and a maximum of 12 % at a target of 0.1, within 2.5 % only from 0.7 (worst profile) or 0.3
(median). The experiment: at a low target, the dynamic allocation grows as ``sqrt(S_i)`` (``t(n, S) ~
A S / n + B n``, whose best ``n`` is ``sqrt(A S / B)``), the static one holds ``n_eq`` throughout; how much
longer the static run takes then depends on how uneven ``sqrt(S_i)`` is over the run. Per target, over the
100 profiles: the correlation of the increase with the coefficient of variation of ``sqrt(S_i)``, the line
fitted through them, the variation at which that line gives the paper's 2.5 %, and how many of our
profiles are more uneven than that; and, as a second test of what makes them uneven, the increase once
the profile's start below 5 % of its peak (the near-zero start the noise dominates) is cut off.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from coorm.experiments.common import md_table, write_csv
from coorm.launchers import amr_model as model

NAME = "coormv2-fig3-low"
PAPER_PCT = 2.5
START_FRACTION = 0.05  # the start cut off: the steps before the profile first reaches 5 % of its peak
FULL = dict(targets=(0.1, 0.2, 0.3, 0.5, 0.7), seeds=range(100))
QUICK = dict(targets=(0.1, 0.5), seeds=range(20))


def unevenness(sizes: list[float]) -> float:
    """The coefficient of variation of ``sqrt(S_i)``: what a low target's dynamic allocation follows."""
    roots = [math.sqrt(s) for s in sizes]
    return statistics.pstdev(roots) / statistics.fmean(roots)


def without_start(sizes: list[float], fraction: float = START_FRACTION) -> list[float]:
    peak = max(sizes)
    first = next(i for i, s in enumerate(sizes) if s >= fraction * peak)
    return sizes[first:]


def _increase(sizes: list[float], target: float) -> float:
    value = model.end_time_increase(sizes, target, None)  # (n_eq's existence is Fig. 3's other question)
    assert value is not None  # without a memory bound it always exists
    return 100.0 * value


def rows_for(targets, seeds) -> list[dict]:
    profiles = [model.working_set(seed) for seed in seeds]
    cv = [unevenness(p) for p in profiles]
    rows = []
    for target in targets:
        inc = [_increase(p, target) for p in profiles]
        cut = [_increase(without_start(p), target) for p in profiles]
        fit = statistics.linear_regression(cv, inc)
        at_paper = (PAPER_PCT - fit.intercept) / fit.slope
        rows.append({"target_efficiency": target, "profiles": len(profiles),
                     "increase_median": statistics.median(inc), "increase_max": max(inc),
                     "correlation": statistics.correlation(cv, inc), "slope": fit.slope,
                     "intercept": fit.intercept, "unevenness_at_paper": at_paper,
                     "profiles_above": sum(c > at_paper for c in cv),
                     "unevenness_median": statistics.median(cv), "unevenness_min": min(cv),
                     "unevenness_max": max(cv),
                     "cut_median": statistics.median(cut), "cut_max": max(cut),
                     "cut_unevenness_median": statistics.median(unevenness(without_start(p)) for p in profiles)})
    return rows


def run(out: Path, quick: bool = False) -> list[dict]:
    rows = rows_for(**(QUICK if quick else FULL))
    write_csv(out / f"{NAME}.csv", rows)
    plot(out / f"{NAME}.png", QUICK["seeds"] if quick else FULL["seeds"])
    return rows


def plot(path: Path, seeds) -> None:
    import matplotlib.pyplot as plt

    from coorm.experiments.common import save

    profiles = [model.working_set(seed) for seed in seeds]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([unevenness(p) for p in profiles], [_increase(p, 0.1) for p in profiles], s=12)
    ax.axhline(PAPER_PCT, color="black", lw=0.8, ls="--", label="paper: at most 2.5 %")
    ax.set_xlabel("coefficient of variation of sqrt(S_i)")
    ax.set_ylabel("end-time increase at a 0.1 target (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, path)


def markdown(rows: list[dict]) -> dict[str, str]:
    table = md_table(
        ["target efficiency", "increase % median / max", "correlation with the unevenness",
         "fit: increase % = a × unevenness + b", "unevenness at 2.5 %", "profiles more uneven",
         "our unevenness min / median / max", "start < 5 % cut off: increase % median / max",
         "its unevenness (median)"],
        [[f"{r['target_efficiency']:g}", f"{r['increase_median']:.2f} / {r['increase_max']:.2f}",
          f"{r['correlation']:.3f}", f"{r['slope']:.1f} × u {r['intercept']:+.2f}",
          f"{r['unevenness_at_paper']:.3f}", f"{r['profiles_above']}/{r['profiles']}",
          f"{r['unevenness_min']:.3f} / {r['unevenness_median']:.3f} / {r['unevenness_max']:.3f}",
          f"{r['cut_median']:.2f} / {r['cut_max']:.2f}", f"{r['cut_unevenness_median']:.3f}"] for r in rows])
    return {"coormv2-fig3-low": "Unevenness: the coefficient of variation of sqrt(S_i) over a profile's steps; "
                                "100 profiles (seeds 0-99), no memory bound.\n\n" + table}
