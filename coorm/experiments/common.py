"""What every paper experiment shares: repeating a run over seeds, the medians and quartiles the papers
report, CSV output and plots. Each experiment is a module ``experiments/<name>.py`` with

    NAME = "coormv2-fig10"                        # what ``coorm experiment NAME`` runs
    def run(out: Path, quick: bool = False) -> list[dict]   # writes out/NAME.csv and out/NAME.png

and every row it returns is one point of the paper's figure (with its quartiles where it has seeds).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ATLAS = "LLNL-Atlas-2006-2.1-cln"  # the trace of CooRM §IV (coorm.simulator.traces finds or fetches it)


def quartiles(values: Sequence[float]) -> dict[str, float]:
    """min, q1, median, q3, max (the papers' box plots)."""
    v = sorted(values)
    if not v:
        return {"min": float("nan"), "q1": float("nan"), "median": float("nan"), "q3": float("nan"),
                "max": float("nan")}
    if len(v) == 1:
        q1 = med = q3 = v[0]
    else:
        q1, med, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return {"min": v[0], "q1": q1, "median": med, "q3": q3, "max": v[-1]}


def over_seeds(seeds: Iterable[int], one: Callable[[int], float]) -> dict[str, float]:
    return quartiles([one(s) for s in seeds])


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def figure(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list, list, list]],
           logy: bool = False) -> None:
    """Lines of medians with a band from q1 to q3: ``series[label] = (x, median, q1, q3)``."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (x, med, q1, q3) in series.items():
        ax.plot(x, med, marker="o", label=label)
        ax.fill_between(x, q1, q3, alpha=0.2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def save(fig, path: Path) -> None:
    """Write a finished figure as PNG and free it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
