"""The simulator's workload metrics: pure functions of job records -- no clock, no I/O, no randomness.

A :class:`JobRecord` is one job of a run as the simulator saw it: when it was submitted, started and
ended, and the nodes it used over time (``segments``). Everything else is computed from those, with the
usual definitions of the scheduling literature (Feitelson, "Metrics for parallel job scheduling"):

* **wait** = start - submit; **run time** = end - start; **turnaround** (response time) = end - submit;
* **bounded slowdown** = max((wait + run time) / max(run time, tau), 1), tau = :data:`TAU` = 10 s, so that
  very short jobs do not dominate the mean;
* **percentiles** interpolate linearly between the closest ranks (numpy's default, Hyndman and Fan's
  type 7): over the n sorted values x_0 <= ... <= x_{n-1}, the q-th quantile is at rank h = (n - 1) q,
  x_floor(h) + (h - floor(h)) (x_floor(h)+1 - x_floor(h)); the median is q = 0.5;
* **measured jobs**: the jobs that ended, are not background work (an endless parameter sweep), and were
  submitted from the warm-up cut on. The cut (:class:`Warmup`) is the submit time of the (N+1)-th job in
  submit order (``N`` jobs excluded), or the first submit plus ``N`` seconds; without a warm-up, the first
  submit. Skipped jobs (larger than the platform, see :mod:`coorm.simulator.replay`) never entered the
  system: they are counted, never ranked or measured;
* the **window** runs from the cut to the last end of any job (or of any node it still held when the run
  stopped); **makespan** is its length; **utilisation** is the node-seconds every job used inside the
  window (warm-up and background jobs included: the machine was busy) over (platform nodes x window);
* **per user**: the same figures over each user's measured jobs, and their node-seconds.

Sums are :func:`math.fsum` (exactly rounded), so that no figure depends on the order of the jobs.
:func:`aggregate` turns the metrics of repeated runs (different seeds) into a mean and the half-width of
its 95 % confidence interval, Student's t with n - 1 degrees of freedom.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TAU = 10.0  # seconds: bounded slowdown's threshold

# the scalar metrics, in the order they are shown and aggregated over repetitions
SCALARS = (
    "jobs", "measured", "warmup_excluded", "unfinished", "oversize",
    "wait_mean", "wait_median", "wait_p95", "bsld_mean", "bsld_median", "turnaround_mean",
    "utilisation", "makespan",
)

ENDED = ("completed", "timeout")  # states of a job that ran to its end (others: killed, unfinished...)


@dataclass(frozen=True, slots=True)
class JobRecord:
    app: str  # the simulator's application id
    seq: int  # arrival order in the workload (ties of submit time are broken by it)
    submit: float
    start: float | None = None
    end: float | None = None
    # (start, end, nodes) of every piece of allocation the job used (pre-allocations not counted: only
    # what it ran on); the pieces of a job that had not ended when the run stopped end at that time
    segments: tuple[tuple[float, float, int], ...] = ()
    state: str = "completed"  # completed, timeout, refused, skipped, unfinished, waiting, or an end reason
    job: str = ""  # the trace's job number, or the application's name
    user: str = ""  # "" unknown
    kind: str = "rigid"
    nodes_requested: int | None = None  # what the trace (or the scenario) asked for, before any cap
    oversize: str = ""  # "", or what was done with a job larger than the platform: capped, skipped, refused
    background: bool = False  # runs for as long as there is room: never measured

    @property
    def ended(self) -> bool:
        return self.start is not None and self.end is not None

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.submit

    @property
    def run_time(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    @property
    def turnaround(self) -> float | None:
        return None if self.end is None or self.start is None else self.end - self.submit

    @property
    def bounded_slowdown(self) -> float | None:
        wait, run = self.wait, self.run_time
        return None if wait is None or run is None else bounded_slowdown(wait, run)


def bounded_slowdown(wait: float, run: float, tau: float = TAU) -> float:
    """max((wait + run) / max(run, tau), 1)."""
    return max((wait + run) / max(run, tau), 1.0)


def quantile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-quantile (0 <= q <= 1) by linear interpolation between closest ranks; None when empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    xs = sorted(values)
    if not xs:
        return None
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    if lo + 1 >= len(xs):
        return xs[-1]
    return xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


def mean(values: Iterable[float]) -> float | None:
    xs = list(values)
    return math.fsum(xs) / len(xs) if xs else None


def steps(segments: Iterable[tuple[float, float, int]], start: float, end: float) -> list[tuple[float, int]]:
    """The nodes a job held between ``start`` and ``end`` as a step function: (time, nodes from then on) at
    each change, the last at ``end`` with 0. Pieces that end when another starts hand over: no step there."""
    deltas: dict[float, int] = {}
    for s, e, n in segments:
        s, e = max(s, start), min(e, end)
        if e > s:
            deltas[s] = deltas.get(s, 0) + n
            deltas[e] = deltas.get(e, 0) - n
    if end <= start:
        return []
    out: list[tuple[float, int]] = []
    level = 0
    for t in sorted({start, end, *deltas}):
        level += deltas.get(t, 0)
        if t >= end:
            break
        if not out or out[-1][1] != level:
            out.append((t, level))
    out.append((end, 0))
    return out


def node_seconds(segments: Iterable[tuple[float, float, int]], start: float, end: float) -> float:
    """The node-seconds a job held between ``start`` and ``end``."""
    return math.fsum((min(e, end) - max(s, start)) * n for s, e, n in segments if min(e, end) > max(s, start))


def extremes(held: list[tuple[float, int]]) -> tuple[int, int]:
    """The fewest and most nodes of :func:`steps`' output (its closing 0 left out); 0, 0 if it is empty."""
    levels = [n for _, n in held[:-1]]
    return (min(levels), max(levels)) if levels else (0, 0)


def job_usage(job: JobRecord) -> tuple[list[tuple[float, int]], float]:
    """The job's :func:`steps` and :func:`node_seconds` over its run (its first start to its end); empty and 0 if it
    never started. One call gives the jobs CSV both."""
    if job.start is None:
        return [], 0.0
    end = _run_end(job)
    return steps(job.segments, job.start, end), node_seconds(job.segments, job.start, end)


def job_node_seconds(job: JobRecord) -> float:
    """:func:`job_usage`'s node-seconds alone: what a sum over jobs needs, without their steps."""
    return 0.0 if job.start is None else node_seconds(job.segments, job.start, _run_end(job))


def _run_end(job: JobRecord) -> float:
    assert job.start is not None
    return job.end if job.end is not None else max((e for _, e, _ in job.segments), default=job.start)


@dataclass(frozen=True, slots=True)
class Warmup:
    """Jobs excluded from the metrics: the first ``jobs`` by submit time, or those submitted in the first
    ``seconds``."""

    jobs: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.jobs < 0 or self.seconds < 0:
            raise ValueError("a warm-up is not negative")
        if self.jobs and self.seconds:
            raise ValueError("a warm-up is a number of jobs or of seconds, not both")

    @classmethod
    def parse(cls, text: str | None) -> Warmup:
        """``N`` jobs, or ``Ns`` seconds (``0``: none)."""
        if text is None or text.strip() in ("", "0", "0s"):
            return cls()
        t = text.strip()
        try:
            if t.endswith("s"):
                return cls(seconds=float(t[:-1]))
            return cls(jobs=int(t))
        except ValueError:
            raise ValueError(f"a warm-up is N (jobs) or Ns (seconds), not {text!r}") from None

    def describe(self) -> str:
        if self.jobs:
            return f"{self.jobs} job{'' if self.jobs == 1 else 's'}"
        if self.seconds:
            return f"{self.seconds:g} s"
        return "none"


def cut(jobs: Sequence[JobRecord], warmup: Warmup = Warmup()) -> float | None:
    """The time from which jobs are measured (None: no job entered the system)."""
    ranked = sorted((j.submit, j.seq) for j in jobs if j.state != "skipped" and not j.background)
    if not ranked:
        return None
    if warmup.seconds:
        return ranked[0][0] + warmup.seconds
    if warmup.jobs >= len(ranked):
        return math.inf
    return ranked[warmup.jobs][0]


def _measured(jobs: Sequence[JobRecord], warmup: Warmup) -> tuple[list[JobRecord], int, float | None]:
    """The measured jobs, how many the warm-up excluded, and the cut."""
    t0 = cut(jobs, warmup)
    if t0 is None:
        return [], 0, None
    entered = sorted((j for j in jobs if j.state != "skipped" and not j.background), key=lambda j: (j.submit, j.seq))
    if warmup.jobs:
        kept, excluded = entered[warmup.jobs :], min(warmup.jobs, len(entered))
    else:
        kept = [j for j in entered if j.submit >= t0]
        excluded = len(entered) - len(kept)
    return [j for j in kept if j.ended and j.state in ENDED], excluded, t0


def measured(jobs: Sequence[JobRecord], warmup: Warmup = Warmup()) -> list[JobRecord]:
    """The jobs the metrics are computed over (see the module's docstring)."""
    return _measured(jobs, warmup)[0]


def _figures(jobs: Sequence[JobRecord]) -> dict[str, float | None]:
    waits = [j.start - j.submit for j in jobs if j.start is not None]
    bslds = [bounded_slowdown(j.start - j.submit, j.end - j.start) for j in jobs
             if j.start is not None and j.end is not None]
    turnarounds = [j.end - j.submit for j in jobs if j.end is not None]
    return {
        "wait_mean": mean(waits),
        "wait_median": quantile(waits, 0.5),
        "wait_p95": quantile(waits, 0.95),
        "bsld_mean": mean(bslds),
        "bsld_median": quantile(bslds, 0.5),
        "turnaround_mean": mean(turnarounds),
    }


def compute(jobs: Sequence[JobRecord], capacity: int, warmup: Warmup = Warmup()) -> dict[str, Any]:
    """The summary metrics of a run's jobs on a platform of ``capacity`` nodes (see the module's
    docstring). Figures with nothing to measure are None."""
    measured, excluded, t0 = _measured(jobs, warmup)
    out: dict[str, Any] = {
        "jobs": len(jobs),
        "measured": len(measured),
        "warmup_excluded": excluded,
        "unfinished": sum(1 for j in jobs if not j.background and j.state not in (*ENDED, "skipped", "refused")),
        "oversize": sum(1 for j in jobs if j.oversize),
        "capped": sum(1 for j in jobs if j.oversize == "capped"),
        "skipped": sum(1 for j in jobs if j.state == "skipped"),
        "refused": sum(1 for j in jobs if j.state == "refused"),
    }
    out.update(_figures(measured))
    ends = [j.end for j in jobs if j.end is not None and j.start is not None]
    ends += [e for j in jobs for _, e, _ in j.segments]
    t1 = max(ends, default=None)
    if t0 is None or t1 is None or not math.isfinite(t0) or t1 <= t0:
        out.update(window=None, makespan=None, utilisation=None)
    else:
        used = math.fsum(n * (min(e, t1) - max(s, t0)) for j in jobs for s, e, n in j.segments
                         if min(e, t1) > max(s, t0))
        out.update(window=[t0, t1], makespan=t1 - t0, utilisation=used / (capacity * (t1 - t0)) if capacity else None)
    users: dict[str, list[JobRecord]] = {}
    for j in measured:
        users.setdefault(j.user or "-", []).append(j)
    out["per_user"] = {
        user: {"jobs": len(js), **_figures(js), "node_seconds": math.fsum(job_node_seconds(j) for j in js)}
        for user, js in sorted(users.items(), key=lambda kv: _user_key(kv[0]))
    }
    return out


def _user_key(user: str) -> tuple[int, float, str]:
    try:
        return (0, float(user), user)
    except ValueError:
        return (1, 0.0, user)


# ======================================================================================================
# repetitions
# ======================================================================================================
# Student's t, 0.975 quantile, for 1..30 degrees of freedom
_T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252,
         2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688,
         2.131449546, 2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845,
         2.073873068, 2.068657610, 2.063898562, 2.059538553, 2.055529439, 2.051830516, 2.048407142,
         2.045229642, 2.042272456)
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """Student's t 0.975 quantile with ``df`` degrees of freedom (beyond 30: the Cornish-Fisher expansion,
    within 2e-6)."""
    if df < 1:
        raise ValueError("at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z, v = _Z975, float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


def confidence(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the half-width of its 95 % confidence interval (None for fewer than two values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = math.fsum(values) / n
    if n < 2:
        return m, None
    var = math.fsum((x - m) ** 2 for x in values) / (n - 1)
    return m, t975(n - 1) * math.sqrt(var / n)


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """Per scalar metric over repeated runs: mean, ci95 (half-width), min, max, and n (the runs where
    it had a value)."""
    out: dict[str, dict[str, float | int | None]] = {}
    for key in SCALARS:
        values = [float(r[key]) for r in runs if r.get(key) is not None]
        if not values:
            continue
        m, ci = confidence(values)
        out[key] = {"mean": m, "ci95": ci, "min": min(values), "max": max(values), "n": len(values)}
    return out
