"""Dividing the preemptible capacity among applications (CooRMv2 §III-B, KOALA §V-B, §V-C).

Pre-allocated but unused nodes and every node not used non-preemptibly form the preemptible capacity.
Malleable applications are CooRMv2's: a non-preemptible request is the minimum they need (it never
shrinks), preemptible requests are what they grow into; what an application asks is its maximum (the
RMS never offers past it -- an application asks only sizes it can use, e.g. powers of two, as KOALA's
FT does). Five ways to share, :data:`POLICIES`:

* ``filling`` (CooRMv2's default): max-min fair, i.e. equi-partitioning where what an application does
  not ask for is left to the others (water-filling);
* ``strict``: equi-partitioning without filling; every application sees the same share whatever the
  others ask for (the baseline of CooRMv2 Fig. 11);
* ``fpsma`` (KOALA: Favour Previously Started Malleable Applications): the nodes left over after what
  every application holds go to the earliest started first, each up to what it asks; when the capacity
  falls below what they hold, the latest started gives back first;
* ``egs`` (KOALA: Equi-Grow & Shrink): the nodes left over are spread evenly over the applications that
  ask for more (max-min: what one does not ask for goes to the others), the remainder one each to the
  earliest started (KOALA's bonus); a shortfall is taken evenly from those that hold, the remainder one
  each from the latest started (KOALA's malus);
* ``egs-offer`` (KOALA's EQUI GROW as its Fig. 5 writes it; for experiments): the nodes left over are
  offered in equal parts to every application listed, whether it can use its part or not, the remainder
  one each to the earliest started; what an application does not take is *not* handed to the others (it
  stays idle until the next pass offers it again). An application at its maximum, or one that takes only
  powers of two (KOALA's FT), lets its part go idle. Shrinks as ``egs``.

The first two split the whole capacity; KOALA's two are *incremental*: they grow or shrink from what each
application holds ("EGS distributes equally available processors ... equipartition distributes equally
the whole set of processors"), so they need the holdings, listed in start order (the callers rank the
applications by the time they first started). A cluster's ``threshold`` nodes are never handed to
preemptible work: the two whole-set policies share ``capacity - threshold``; KOALA's grow only while
``threshold`` nodes stay idle ("a threshold over which KOALA never expands"), and shrink only when the
capacity itself falls below what is held -- so work that lands on the threshold shrinks no one.

An application's preemptive view is its share *if it asked for everything*. Shares are integers: the
nodes left over by integer division go one each to the highest-ranked applications still unsatisfied,
so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from coorm.shared.stepfn import INF

FILLING = "filling"
STRICT = "strict"
FPSMA = "fpsma"
EGS = "egs"
EGS_OFFER = "egs-offer"
POLICIES = (FILLING, STRICT, FPSMA, EGS, EGS_OFFER)
INCREMENTAL = frozenset((FPSMA, EGS, EGS_OFFER))  # they grow and shrink from what each application holds


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


def in_order(capacity: int, demands: Sequence[float]) -> list[int]:
    """``capacity`` handed out in list order, each up to its demand (FPSMA's grow and shrink loops)."""
    alloc = []
    left = max(capacity, 0)
    for d in demands:
        got = int(min(d, left))
        alloc.append(got)
        left -= got
    return alloc


def equal_parts(capacity: int, k: int) -> list[int]:
    """``capacity`` in ``k`` equal parts, the remainder one each to the first (EQUI GROW's bonus)."""
    if k == 0:
        return []
    level, extra = divmod(max(capacity, 0), k)
    return [level + (1 if j < extra else 0) for j in range(k)]


def koala(capacity: int, held: Sequence[int], demands: Sequence[float], policy: str, threshold: int = 0) -> list[int]:
    """What each application (start order) holds after one run of FPSMA or EGS: ``held`` grown into the
    nodes left idle above ``threshold``, up to ``demands``, or shrunk by what ``capacity`` lacks."""
    total = sum(held)
    if capacity >= total:  # grow
        room = [max(d - h, 0) for d, h in zip(demands, held, strict=True)]
        free = max(capacity - threshold - total, 0)
        if policy == FPSMA:
            grow = in_order(free, room)
        elif policy == EGS_OFFER:
            grow = [int(min(r, part)) for r, part in zip(room, equal_parts(free, len(room)), strict=True)]
        else:
            grow = max_min(free, room)
        return [h + g for h, g in zip(held, grow, strict=True)]
    # shrink (mandatory: the capacity is no longer there), from the latest started
    lacking = total - capacity
    latest_first = list(reversed(held))
    take = in_order(lacking, latest_first) if policy == FPSMA else max_min(lacking, latest_first)
    return [h - s for h, s in zip(held, reversed(take), strict=True)]


def preemptive_share(capacity: int, demands: Sequence[float], me: int, policy: str = FILLING,
                     held: Sequence[int] | None = None, threshold: int = 0) -> int:
    """What application ``me`` (an index into ``demands``, rank order) could hold if it asked for
    everything, given the others' demands (and, for KOALA's policies, what each holds)."""
    capacity = max(capacity, 0)
    wanted = list(demands)
    wanted[me] = INF
    if policy in INCREMENTAL:
        return koala(capacity, held if held is not None else [0] * len(demands), wanted, policy, threshold)[me]
    capacity = max(capacity - threshold, 0)
    if policy == STRICT:
        active = [j for j, d in enumerate(demands) if d > 0 or j == me]
        level, extra = divmod(capacity, len(active))
        return level + (1 if active.index(me) < extra else 0)
    return max_min(capacity, wanted)[me]


def allocations(capacity: int, demands: Sequence[float], policy: str = FILLING,
                held: Sequence[int] | None = None, threshold: int = 0) -> list[int]:
    """What each application holds when all ask for their demand."""
    if policy in INCREMENTAL:
        return koala(max(capacity, 0), held if held is not None else [0] * len(demands), demands, policy, threshold)
    if policy == STRICT:
        return [min(int(d), preemptive_share(capacity, demands, j, STRICT, threshold=threshold))
                for j, d in enumerate(demands)]
    return max_min(max(capacity, 0) - threshold, demands)
