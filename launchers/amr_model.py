"""The AMR application model of CooRMv2 §II: how its working set evolves and how fast it runs.

Pure functions, no I/O, deterministic given a seed. Sizes are in MiB, times in seconds.

**Working set (§II-A, the acceleration-deceleration model).** 1000 steps; step ``i`` has a constant data
size. A velocity ``v`` drives the size, ``s_i = s_{i-1} + v_i``. The run is cut into phases whose lengths
are drawn uniformly from [1, 200] steps; in even phases (the first one is phase 0) ``v_i = v_{i-1} + 0.01``,
in odd phases ``v_i = v_{i-1} * 0.95``. Then Gaussian noise (mu 0, sigma 2) is added and the series is
normalised so that its maximum is 1000; ``S_i = s_i / 1000 * Smax``.

How noise and normalisation interact -- our reading, since the paper gives the order but not the units:

* ``s_0 = 0``, ``v_0 = 0``; the noise-free series is computed by the recurrence, then an independent
  noise sample is added to every ``s_i`` (it is *not* fed back into the recurrence, which would turn the
  noise into a random walk). The noise is in raw units, before normalisation, as the paper orders it:
  raw maxima are a few hundred, so sigma 2 is well under 1% of the peak -- but early on, when the raw
  size is still near zero, it can make ``s_i`` zero or negative;
* the noisy series is scaled so that its maximum is exactly 1000, *then* clamped from below at
  ``S_FLOOR`` = 1 (0.1% of the peak): a data size cannot be zero or negative, and clamping after the
  scaling leaves the maximum at exactly 1000 (so ``max S_i = Smax``);
* a profile of fewer steps (a shortened run) is the same model run for fewer steps, not a subsample of
  the 1000-step one: its raw peak is lower, so the noise weighs more and its start is noisier.

**Speed-up (§II-B).** ``t(n, S) = A*S/n + B*n + C*S + D``. The efficiency of ``n`` nodes is
``t(1, S) / (n * t(n, S))``; ``n * t(n, S)`` grows with ``n``, so efficiency falls as ``n`` grows.
``nodes_for_efficiency(S, e)`` is the **largest** ``n`` whose efficiency is still ``>= e`` (the fastest
allocation that keeps the target); it is at least 1 (one node always has efficiency 1).

**Equivalent static allocation (§II-C).** ``A(e) = sum n_i * t(n_i, S_i)`` for the dynamic allocation
``n_i = nodes_for_efficiency(S_i, e)``. The static area ``sum n * t(n, S_i)`` is a quadratic in ``n``,
strictly increasing, so some real ``n`` always gives ``A(e)`` exactly; ``n_eq`` is the integer whose
static area is the closest. Without another constraint ``n_eq`` would therefore always exist, while the
paper found it exists only for ``e < 0.8``. The constraint we read into it is memory: a static run must
hold the peak working set, ``n >= ceil(Smax / M)``. With ``M = MEM_PER_NODE_MIB`` = 4 GiB of working set
per node (a cluster node of the paper's time; the paper does not give it), ``ceil(3.16 TiB / 4 GiB)`` =
809 nodes and ``n_eq`` stops existing just above ``e = 0.8`` (over seeds 0-29: all exist at 0.75, 28 of
30 at 0.8, 2 of 30 at 0.83), which is the paper's observation. ``mem_per_node_mib=None`` drops the
constraint. The dynamic allocation itself is not memory-bound (the paper sizes it by efficiency only).

**Fig. 3** is the end-time increase ``T_static(n_eq) / T_dynamic - 1`` per target efficiency.
**Fig. 4** is, per ``Smax``, the static node counts a user may choose for a 75% target: not running out
of memory (``n >= ceil(Smax / M)``) and not using more than 10% more area than ``A(75%)``
(``static_area(n) <= 1.1 * A(75%)``). A static area grows with ``n``, so the choices are an interval;
:func:`fig4` gives it per profile and the intersection over profiles (what a user who cannot predict the
profile can safely choose), which is empty for large ``Smax``.

:func:`ideal_run` replays the AMR launcher's own update policy on a profile against an RMS that serves
every update at once (spontaneous) or exactly one announce interval later (announced): the launcher uses
it to bound the duration of its pre-allocation, tests use it to check the launcher against the model.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# -- the paper's constants ----------------------------------------------------------------------------
A = 7.26e-3  # s * node / MiB
B = 1.23e-4  # s / node
C = 1.13e-6  # s / MiB
D = 1.38  # s
MIB_PER_TIB = 1024.0 * 1024.0
SMAX_MIB = 3.16 * MIB_PER_TIB  # 3.16 TiB

STEPS = 1000
MAX_PHASE = 200
ACCELERATION = 0.01
DECELERATION = 0.95
NOISE_SIGMA = 2.0
S_SCALE = 1000.0  # the normalised maximum
S_FLOOR = 1.0  # the normalised minimum (see the module docstring)

MEM_PER_NODE_MIB = 4096.0  # our assumption: 4 GiB of working set per node (see the module docstring)


# ======================================================================================================
# working set
# ======================================================================================================
def normalised_profile(seed: int, steps: int = STEPS) -> list[float]:
    """``s_i`` for ``i`` in ``range(steps)``: ``S_FLOOR <= s_i <= 1000`` and ``max(s) == 1000``."""
    if steps < 1:
        raise ValueError("a profile needs at least one step")
    rng = random.Random(seed)
    raw: list[float] = []
    s = v = 0.0
    phase, left = 0, rng.randint(1, MAX_PHASE)
    for _ in range(steps):
        if left == 0:
            phase, left = phase + 1, rng.randint(1, MAX_PHASE)
        left -= 1
        v = v + ACCELERATION if phase % 2 == 0 else v * DECELERATION
        s += v
        raw.append(s)
    noisy = [x + rng.gauss(0.0, NOISE_SIGMA) for x in raw]
    peak = max(noisy)
    if peak <= 0:  # only for a handful of steps that noise drowned: a flat profile
        return [S_SCALE] * steps
    return [max(x / peak * S_SCALE, S_FLOOR) for x in noisy]  # x / peak first: the peak is exactly 1000


def working_set(seed: int, smax_mib: float = SMAX_MIB, steps: int = STEPS) -> list[float]:
    """``S_i`` in MiB: the normalised profile scaled to ``smax_mib``."""
    return [s / S_SCALE * smax_mib for s in normalised_profile(seed, steps)]


# ======================================================================================================
# speed-up
# ======================================================================================================
def step_time(n: int, size_mib: float) -> float:
    """``t(n, S)``: the duration of one step on ``n`` nodes with ``S`` MiB of data."""
    if n < 1:
        raise ValueError(f"a step needs at least one node, not {n}")
    return A * size_mib / n + B * n + C * size_mib + D


def efficiency(n: int, size_mib: float) -> float:
    return step_time(1, size_mib) / (n * step_time(n, size_mib))


def nodes_for_efficiency(size_mib: float, target: float) -> int:
    """The largest ``n >= 1`` whose efficiency is ``>= target`` (``0 < target <= 1``).

    ``efficiency(n) >= e`` iff ``B n^2 + (C S + D) n + A S - t(1, S)/e <= 0``: ``n`` is the floor of the
    positive root, checked against the exact inequality to absorb rounding."""
    if not 0 < target <= 1:
        raise ValueError(f"a target efficiency is in (0, 1], not {target}")
    b = C * size_mib + D
    c = A * size_mib - step_time(1, size_mib) / target  # <= 0
    root = 2 * -c / (b + math.sqrt(b * b - 4 * B * c))  # the positive root, without cancellation
    n = max(1, math.floor(root))
    while efficiency(n + 1, size_mib) >= target:
        n += 1
    while n > 1 and efficiency(n, size_mib) < target:
        n -= 1
    return n


def dynamic_allocation(sizes: Sequence[float], target: float, max_nodes: int | None = None) -> list[int]:
    """``n_i`` per step for the target efficiency, capped at ``max_nodes`` (a pre-allocation) if given."""
    out = [nodes_for_efficiency(s, target) for s in sizes]
    if max_nodes is not None:
        out = [min(n, max_nodes) for n in out]
    return out


def area(nodes: Sequence[int], sizes: Sequence[float]) -> float:
    """Node-seconds: ``sum n_i * t(n_i, S_i)``."""
    return sum(n * step_time(n, s) for n, s in zip(nodes, sizes, strict=True))


def run_time(nodes: Sequence[int], sizes: Sequence[float]) -> float:
    """End time of a run that starts at 0 and never waits: ``sum t(n_i, S_i)``."""
    return sum(step_time(n, s) for n, s in zip(nodes, sizes, strict=True))


def consumed_area(sizes: Sequence[float], target: float) -> float:
    """``A(e_t)``: the area of the dynamic allocation for the target efficiency."""
    return area(dynamic_allocation(sizes, target), sizes)


def static_area(n: float, sizes: Sequence[float]) -> float:
    """``sum n * t(n, S_i)`` = ``k B n^2 + (C sum S + k D) n + A sum S`` (``n`` may be real)."""
    total, k = math.fsum(sizes), len(sizes)
    return k * B * n * n + (C * total + k * D) * n + A * total


def static_run_time(n: int, sizes: Sequence[float]) -> float:
    return run_time([n] * len(sizes), sizes)


def memory_min_nodes(sizes: Sequence[float], mem_per_node_mib: float | None = MEM_PER_NODE_MIB) -> int:
    """The fewest nodes that hold the peak working set (1 without a memory constraint)."""
    if mem_per_node_mib is None:
        return 1
    return max(1, math.ceil(max(sizes) / mem_per_node_mib - 1e-9))


def _static_for_area(target_area: float, sizes: Sequence[float]) -> float:
    """The real ``n`` with ``static_area(n) == target_area`` (``target_area`` >= the area at n = 0)."""
    total, k = math.fsum(sizes), len(sizes)
    a, b, c = k * B, C * total + k * D, A * total - target_area
    if c >= 0:
        return 0.0
    return 2 * -c / (b + math.sqrt(b * b - 4 * a * c))


def equivalent_static_allocation(
    sizes: Sequence[float], target: float, mem_per_node_mib: float | None = MEM_PER_NODE_MIB
) -> int | None:
    """``n_eq``: the static node count whose area is closest to ``A(target)``; None when it cannot hold
    the peak working set (see the module docstring)."""
    goal = consumed_area(sizes, target)
    x = _static_for_area(goal, sizes)
    lo = max(1, math.floor(x))
    n = min((lo, lo + 1), key=lambda m: (abs(static_area(m, sizes) - goal), m))
    if n < memory_min_nodes(sizes, mem_per_node_mib):
        return None
    return n


def end_time_increase(
    sizes: Sequence[float], target: float, mem_per_node_mib: float | None = MEM_PER_NODE_MIB
) -> float | None:
    """``T_static(n_eq) / T_dynamic - 1`` (Fig. 3), None when ``n_eq`` does not exist."""
    n_eq = equivalent_static_allocation(sizes, target, mem_per_node_mib)
    if n_eq is None:
        return None
    dynamic = run_time(dynamic_allocation(sizes, target), sizes)
    return static_run_time(n_eq, sizes) / dynamic - 1.0


def static_choices(
    sizes: Sequence[float],
    target: float = 0.75,
    overuse: float = 0.10,
    mem_per_node_mib: float | None = MEM_PER_NODE_MIB,
) -> tuple[int, int] | None:
    """The static node counts ``[lo, hi]`` that hold the peak working set and use at most
    ``(1 + overuse) * A(target)``; None when there is none (Fig. 4)."""
    lo = memory_min_nodes(sizes, mem_per_node_mib)
    budget = (1.0 + overuse) * consumed_area(sizes, target)
    hi = math.floor(_static_for_area(budget, sizes))
    while hi >= 1 and static_area(hi, sizes) > budget:
        hi -= 1
    while static_area(hi + 1, sizes) <= budget:
        hi += 1
    return (lo, hi) if lo <= hi else None


# ======================================================================================================
# the figures
# ======================================================================================================
@dataclass(frozen=True, slots=True)
class Fig3Point:
    target: float
    increases: tuple[float, ...]  # one per profile whose n_eq exists
    missing: int  # profiles without an equivalent static allocation

    @property
    def worst(self) -> float | None:
        return max(self.increases) if self.increases else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.increases) if self.increases else None


def fig3(
    targets: Iterable[float],
    seeds: Iterable[int],
    smax_mib: float = SMAX_MIB,
    steps: int = STEPS,
    mem_per_node_mib: float | None = MEM_PER_NODE_MIB,
) -> list[Fig3Point]:
    """End-time increase when the equivalent static allocation replaces the dynamic one, per target."""
    profiles = [working_set(seed, smax_mib, steps) for seed in seeds]
    out = []
    for target in targets:
        values = [end_time_increase(p, target, mem_per_node_mib) for p in profiles]
        kept = tuple(v for v in values if v is not None)
        out.append(Fig3Point(target, kept, len(values) - len(kept)))
    return out


@dataclass(frozen=True, slots=True)
class Fig4Point:
    smax_mib: float
    memory_min: int  # the fewest nodes that hold Smax
    per_profile: tuple[tuple[int, int] | None, ...]
    safe: tuple[int, int] | None  # good for every profile: [memory_min, min of the upper bounds]


def fig4(
    smax_values: Iterable[float],
    seeds: Iterable[int],
    target: float = 0.75,
    overuse: float = 0.10,
    steps: int = STEPS,
    mem_per_node_mib: float | None = MEM_PER_NODE_MIB,
) -> list[Fig4Point]:
    """Static allocation choices (Fig. 4) per maximum data size."""
    seeds = list(seeds)
    normalised = [normalised_profile(seed, steps) for seed in seeds]
    out = []
    for smax in smax_values:
        per = []
        for s in normalised:
            sizes = [x / S_SCALE * smax for x in s]
            per.append(static_choices(sizes, target, overuse, mem_per_node_mib))
        lo = memory_min_nodes([smax], mem_per_node_mib)
        his = [r[1] for r in per if r is not None]
        safe = (lo, min(his)) if len(his) == len(per) and per and lo <= min(his) else None
        out.append(Fig4Point(smax, lo, tuple(per), safe))
    return out


# ======================================================================================================
# the launcher's policy against an ideal RMS
# ======================================================================================================
@dataclass(frozen=True, slots=True)
class IdealRun:
    end: float  # the run starts at 0
    area: float  # node-seconds
    updates: int


def ideal_run(sizes: Sequence[float], needs: Sequence[int], announce_interval: float = 0.0) -> IdealRun:
    """Replay the AMR launcher's update policy (see :mod:`coorm.launchers.amr`) on ``needs`` (nodes wanted per
    step, already capped by the pre-allocation) against an RMS that serves an update at once
    (``announce_interval`` 0) or exactly ``announce_interval`` later, with the node count wanted when the
    update was initiated. At most one update is in flight; while it is, the step runs on the nodes held
    (a change in the middle of a step rescales what remains of it)."""
    if len(sizes) != len(needs) or not sizes:
        raise ValueError("one need per step, at least one step")
    now = used = 0.0
    held = needs[0]
    pending: tuple[float, int] | None = None
    updates = 0
    for i, size in enumerate(sizes):
        if i and pending is None and needs[i] != held:
            updates += 1
            if announce_interval <= 0:
                held = needs[i]
            else:
                pending = (now + announce_interval, needs[i])
        remaining = 1.0
        while True:
            duration = step_time(held, size)
            finish = now + remaining * duration
            if pending is not None and pending[0] < finish:
                dt = pending[0] - now
                remaining -= dt / duration
                used += held * dt
                now, held, pending = pending[0], pending[1], None
                continue
            used += held * (finish - now)
            now = finish
            break
    return IdealRun(now, used, updates)
