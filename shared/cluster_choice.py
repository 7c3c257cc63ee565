"""Which cluster a malleable job goes to (KOALA §IV-B's placement policies, for jobs of one component).

KOALA places a job when it is submitted; in CooRM the RMS publishes each application's views and the
application names a cluster in its requests, so the rule is applied by the application to its
non-preemptive views (what it could start on, per cluster, as things stand). Rules, :data:`RULES`:

* ``worst-fit`` (KOALA's, and its experiments'): the cluster with the largest number of idle nodes -- load
  balancing; a malleable job also gets the most room to grow there;
* ``first-fit``: the first cluster, in name order, where the job fits.

Both pick among the clusters where the job's minimum starts *earliest* (now, if it fits anywhere now;
KOALA keeps a job it cannot place in its queue and tries again, which is a later start); ``worst-fit``
measures the idle nodes at that start, less ``threshold`` (KOALA's nodes kept for local users). Ties go to
the first cluster in name order. None: it fits nowhere, ever, as things stand.

Pure: the views and the time are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

from coorm.shared.stepfn import INF, StepFunction

WORST_FIT = "worst-fit"
FIRST_FIT = "first-fit"
RULES = (WORST_FIT, FIRST_FIT)


def choose(rule: str, views: Mapping[str, StepFunction], nodes: int, duration: float, now: float,
           threshold: int = 0) -> str | None:
    """The cluster ``rule`` places a job of ``nodes`` nodes for ``duration`` seconds on, given its
    non-preemptive ``views`` per cluster."""
    if rule not in RULES:
        raise ValueError(f"placement {rule!r} is not one of {', '.join(RULES)}")
    need = nodes + threshold
    starts = {c: views[c].earliest_fit(need, duration, now) for c in sorted(views)}
    first = min(starts.values(), default=INF)
    if first == INF:
        return None
    candidates = [c for c, t in starts.items() if t == first]
    if rule == FIRST_FIT:
        return candidates[0]
    # (max keeps the first of equals: name order)
    return max(candidates, key=lambda c: views[c].value_at(first))
