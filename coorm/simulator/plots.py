"""PNG plots of a simulation: utilisation by request type over time (the papers' pictures), and each
application's allocation over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from coorm.simulator.engine import Result  # noqa: E402


def _series(result: Result, select) -> tuple[list[float], list[int]]:
    deltas: dict[float, int] = {}
    for r in result.requests:
        if not select(r):
            continue
        end = r.end if r.end is not None else result.now
        deltas[r.start] = deltas.get(r.start, 0) + r.nodes
        deltas[end] = deltas.get(end, 0) - r.nodes
    times, values, level = [0.0], [0], 0
    for t in sorted(deltas):
        level += deltas[t]
        times.append(t)
        values.append(level)
    times.append(result.now)
    values.append(level)
    return times, values


def _at(times: list[float], values: list[int], grid: list[float]) -> list[int]:
    out, j = [], 0
    for t in grid:
        while j + 1 < len(times) and times[j + 1] <= t:
            j += 1
        out.append(values[j])
    return out


def utilisation(result: Result, path: Path, title: str = "") -> None:
    end = max(result.now, 1.0)
    grid = [end * i / 1000 for i in range(1001)]
    np_t, np_v = _series(result, lambda r: r.type == "non-preemptible")
    p_t, p_v = _series(result, lambda r: r.type == "preemptible")
    pa_t, pa_v = _series(result, lambda r: r.type == "pre-allocation")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.stackplot(grid, _at(np_t, np_v, grid), _at(p_t, p_v, grid), labels=["non-preemptible", "preemptible"],
                 colors=["#4c72b0", "#dd8452"], step="post")
    ax.step(grid, _at(pa_t, pa_v, grid), where="post", color="#55a868", linestyle="--", label="pre-allocated")
    ax.axhline(sum(result.clusters.values()), color="black", linewidth=0.8, label="nodes")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("nodes")
    ax.set_title(title or "utilisation by request type")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def allocations(result: Result, path: Path, most: int = 20) -> None:
    by_app: dict[str, float] = {}
    for r in result.requests:
        if r.type != "pre-allocation":
            by_app[r.app] = by_app.get(r.app, 0.0) + r.nodes * ((r.end or result.now) - r.start)
    shown = sorted(by_app, key=lambda a: -by_app[a])[:most]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for app in shown:
        t, v = _series(result, lambda r, app=app: r.app == app and r.type != "pre-allocation")
        ax.step(t, v, where="post", label=f"{result.apps[app].name} ({result.apps[app].kind})")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("nodes held")
    ax.set_title(f"allocation of the {len(shown)} largest applications over time")
    if shown:
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
