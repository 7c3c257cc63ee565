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


# ======================================================================================================
# confidence intervals (seeded: the same runs give the same intervals)
# ======================================================================================================
def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float] = statistics.fmean, *,
                 level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over ``values`` (instances drawn with replacement)."""
    import random

    v = list(values)
    if not v:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    stats = sorted(stat(rng.choices(v, k=len(v))) for _ in range(resamples))
    lo = stats[int((1 - level) / 2 * resamples)]
    hi = stats[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return (lo, hi)


def wilson_ci(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k / n`` (95 % by default): unlike a bootstrap it is not
    [0, 0] when no instance of ``n`` was counted -- it says how large the true fraction may still be."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


# ======================================================================================================
# results stored next to the doc, and the doc's generated blocks
# ======================================================================================================
# EXPERIMENTS.md holds, between ``<!-- BLOCK:begin -->`` and ``<!-- BLOCK:end -->``, tables that an
# experiment's ``markdown(rows) -> {BLOCK: text}`` renders from its rows; ``coorm experiment NAME
# --update-doc EXPERIMENTS.md`` runs it, stores the rows in ``experiments/NAME.json`` next to the doc and
# rewrites its blocks. The tests check that each block equals the rendering of the stored rows.
def results_path(doc: Path, name: str) -> Path:
    return Path(doc).parent / "experiments" / f"{name}.json"


def store(doc: Path, name: str, rows: list[dict], **meta: object) -> Path:
    import json

    path = results_path(doc, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, **meta, "rows": rows}, indent=1) + "\n")
    return path


def load(doc: Path, name: str) -> dict:
    import json

    path = results_path(doc, name)
    if not path.exists():
        raise NotStored(f"nothing stored in {path}: run it with --update-doc first")
    data: dict = json.loads(path.read_text())
    return data


class NotStored(LookupError):
    """``--stored`` asked for a run that was never stored next to the doc."""


# A live run's figures are the machine's as much as the code's: its stored rows carry when, on which
# revision, how long and under what load they were made, and its block says so above the table, so that
# the prose need not carry (and let go stale) those numbers.
def live_name(name: str, variant: str | None = None) -> str:
    """The stored run's and the doc block's name of an experiment's live form (a variant, such as
    malleable-fraction's negotiating model, is a run of its own)."""
    return f"{name}-live" + (f"-{variant}" if variant else "")


def store_live(doc: Path, name: str, command: str, run: Callable[[], list[dict]], **meta: object) -> dict:
    """Run ``run`` (a live form) and store its rows as ``name`` with the run's circumstances; returns what
    was stored."""
    import datetime
    import os
    import time

    load_start = os.getloadavg()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    revision = code_revision()
    t0 = time.perf_counter()
    rows = run()
    data = {"name": name, "live": True, "command": command, **meta, "wall_s": round(time.perf_counter() - t0, 1),
            "revision": revision, "date_utc": date, "load_start": [round(v, 2) for v in load_start],
            "load_end": [round(v, 2) for v in os.getloadavg()]}
    store(doc, name, rows, **{k: v for k, v in data.items() if k != "name"})
    return data | {"rows": rows}


CODE = ("coorm", "launchers", "shared", "services", "node_agent", "pyproject.toml")  # what a run executes


def code_revision() -> str | None:
    """The short git revision of the code that runs, with ``+changes`` when that code differs from it (not
    the doc, nor the stored runs, which change as the runs are stored); None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                  *CODE], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+changes" if changed else "")


def live_blocks(data: dict, render: Callable[[list[dict]], str]) -> dict[str, str]:
    """A stored live run's block: a generated line saying how it was made, then ``render``'s table."""
    rev = f"`{data['revision']}`" if data.get("revision") else "unknown"
    load = (f"load average {data['load_start'][0]:.2f} at its start and {data['load_end'][0]:.2f} at its end"
            if data.get("load_start") and data.get("load_end") else "load average not recorded")
    header = (f"*Generated from `experiments/{data['name']}.json`: `{data['command']}`, run {data['date_utc']} UTC "
              f"on revision {rev}, {data['wall_s']:.1f} s, {load}.*")
    return {data["name"]: header + "\n\n" + render(data["rows"])}


def _markers(block: str) -> tuple[str, str]:
    return f"<!-- {block}:begin -->", f"<!-- {block}:end -->"


def doc_block(text: str, block: str) -> str:
    """What the doc holds between a block's markers (without them)."""
    begin, end = _markers(block)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise KeyError(f"the doc needs exactly one {begin} and one {end}")
    return text.split(begin, 1)[1].split(end, 1)[0]


def with_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each block's content replaced (each block must be there, once)."""
    for block, content in blocks.items():
        begin, end = _markers(block)
        doc_block(text, block)  # checks the markers
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + content.strip("\n") + "\n" + end + rest.split(end, 1)[1]
    return text


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(str(c) for c in r) + " |" for r in rows)
    return "\n".join(lines)


def fmt_q(row: dict, prefix: str, digits: int = 0) -> str:
    """``median [q1–q3]`` of a row's quartile columns (``—`` when there were no runs)."""
    med = row[f"{prefix}_median"]
    if med != med:
        return "—"
    return f"{med:.{digits}f} [{row[f'{prefix}_q1']:.{digits}f}–{row[f'{prefix}_q3']:.{digits}f}]"
