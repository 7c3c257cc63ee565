"""Dividing the preemptible capacity among applications (CooRMv2 §III-B, KOALA §III).

Pre-allocated but unused nodes and every node not used non-preemptibly form the preemptible capacity.

* ``filling`` (CooRMv2's default): max-min fair, i.e. equi-partitioning where what an application does
  not ask for is left to the others (water-filling);
* ``strict``: equi-partitioning without filling; every application sees the same share whatever the
  others ask for (the baseline of CooRMv2 Fig. 11).

An application's preemptive view is its share *if it asked for everything*. Shares are integers: the
nodes left over by integer division go one each to the highest-priority applications still unsatisfied,
so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from coorm.shared.stepfn import INF

FILLING = "filling"
STRICT = "strict"
POLICIES = (FILLING, STRICT)


def max_min(capacity: int, demands: Sequence[float]) -> list[int]:
    """Max-min fair integer allocation of ``capacity`` among ``demands`` (listed in priority order)."""
    k = len(demands)
    alloc = [0] * k
    capacity = max(capacity, 0)
    if k == 0:
        return alloc
    order = sorted(range(k), key=lambda j: (demands[j], j))
    remaining = capacity
    left = k
    uncapped: list[int] = []
    for pos, j in enumerate(order):
        if demands[j] <= remaining // left:
            alloc[j] = int(demands[j])
            remaining -= alloc[j]
            left -= 1
        else:
            uncapped = order[pos:]
            break
    if uncapped:
        level, extra = divmod(remaining, len(uncapped))
        for rank, j in enumerate(sorted(uncapped)):
            alloc[j] = level + (1 if rank < extra else 0)
    return alloc


def preemptive_share(capacity: int, demands: Sequence[float], me: int, policy: str = FILLING) -> int:
    """What application ``me`` (an index into ``demands``, priority order) could hold if it asked for
    everything, given the others' demands."""
    capacity = max(capacity, 0)
    if policy == STRICT:
        active = [j for j, d in enumerate(demands) if d > 0 or j == me]
        level, extra = divmod(capacity, len(active))
        return level + (1 if active.index(me) < extra else 0)
    wanted = list(demands)
    wanted[me] = INF
    return max_min(capacity, wanted)[me]


def allocations(capacity: int, demands: Sequence[float], policy: str = FILLING) -> list[int]:
    """What each application holds when all ask for their demand."""
    if policy == STRICT:
        return [min(int(d), preemptive_share(capacity, demands, j, STRICT)) for j, d in enumerate(demands)]
    return max_min(capacity, demands)
