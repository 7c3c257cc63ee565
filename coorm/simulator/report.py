"""The simulator's metrics as rich tables that fit 80 columns: one run's figures, per user, and the mean
with its 95 % confidence interval over repeated runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.table import Table

from coorm.simulator.metrics import SCALARS

LABELS = {
    "jobs": "jobs in the workload",
    "measured": "jobs measured",
    "warmup_excluded": "excluded as warm-up",
    "unfinished": "not finished",
    "oversize": "larger than any cluster",
    "wait_mean": "wait, mean (s)",
    "wait_median": "wait, median (s)",
    "wait_p95": "wait, 95th percentile (s)",
    "bsld_mean": "bounded slowdown, mean",
    "bsld_median": "bounded slowdown, median",
    "turnaround_mean": "turnaround, mean (s)",
    "utilisation": "utilisation",
    "makespan": "makespan (s)",
}
assert set(LABELS) == set(SCALARS)
_COUNTS = {"jobs", "measured", "warmup_excluded", "unfinished", "oversize"}


def fmt(key: str, value: float | None, *, spread: bool = False) -> str:
    """A metric's value as the tables show it (``spread``: a difference, e.g. a CI half-width)."""
    if value is None:
        return "-"
    if key == "utilisation":
        return f"{value * 100:.1f} pt" if spread else f"{value:.1%}"
    if key in _COUNTS and float(value).is_integer() and not spread:
        return f"{value:,.0f}"
    if key.startswith("bsld"):
        return f"{value:,.2f}"
    return f"{value:,.1f}"


def _oversize(metrics: Mapping[str, Any]) -> str:
    how = [f"{metrics[k]:,} {k}" for k in ("skipped", "capped", "refused") if metrics.get(k)]
    return ", ".join(how) or "0"


def metrics_table(metrics: Mapping[str, Any], title: str = "metrics") -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key in SCALARS:
        value = _oversize(metrics) if key == "oversize" else fmt(key, metrics.get(key))
        t.add_row(LABELS[key], value)
    return t


def users_table(metrics: Mapping[str, Any], top: int = 10) -> Table:
    """The ``top`` users by node-hours of their measured jobs."""
    users = metrics.get("per_user", {})
    ranked = sorted(users.items(), key=lambda kv: (-kv[1]["node_seconds"], kv[0]))[:top]
    t = Table(title=f"per user: the {len(ranked)} of {len(users)} with the most node-hours", box=box.SIMPLE_HEAD)
    for col in ("user", "jobs", "wait mean", "wait p50", "bsld mean", "turnaround", "node-h"):
        t.add_column(col, justify="left" if col == "user" else "right")
    for user, u in ranked:
        t.add_row(user[:12], f"{u['jobs']:,}", fmt("wait_mean", u["wait_mean"]), fmt("wait_median", u["wait_median"]),
                  fmt("bsld_mean", u["bsld_mean"]), fmt("turnaround_mean", u["turnaround_mean"]),
                  f"{u['node_seconds'] / 3600:,.1f}")
    return t


def aggregate_table(aggregate: Mapping[str, Mapping[str, Any]], runs: int) -> Table:
    t = Table(title=f"mean over {runs} seeded runs, with its 95 % confidence interval", box=box.SIMPLE_HEAD)
    t.add_column("metric")
    for col in ("mean", "± 95 % CI", "min", "max"):
        t.add_column(col, justify="right")
    for key in SCALARS:
        a = aggregate.get(key)
        if a is None:
            t.add_row(LABELS[key], "-", "-", "-", "-")
            continue
        ci = "-" if a["ci95"] is None else "± " + fmt(key, a["ci95"], spread=True)
        t.add_row(LABELS[key], fmt(key, a["mean"]), ci, fmt(key, a["min"]), fmt(key, a["max"]))
    return t
