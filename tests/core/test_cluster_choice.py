"""Placing a job across clusters (KOALA's worst-fit, and first-fit; coorm/shared/cluster_choice.py): the
paper's rule on an example, and properties over any views -- no cluster would start the job earlier, worst-
fit leaves no cluster with more idle nodes at that start, first-fit takes the first in name order, the answer
does not depend on the order the views are listed in, and None means the job fits nowhere, ever."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coorm.shared.cluster_choice import FIRST_FIT, RULES, WORST_FIT, choose
from coorm.shared.stepfn import StepFunction

DAS3 = {"vu": 85, "uva": 41, "delft": 68, "multimedian": 46, "leiden": 32}


def test_worst_fit_places_a_job_on_the_cluster_with_the_most_idle_nodes():
    idle = {"vu": 10, "uva": 30, "delft": 20, "multimedian": 0, "leiden": 32}
    views = {c: StepFunction.constant(n, 0.0) for c, n in idle.items()}
    assert choose(WORST_FIT, views, 2, 600.0, 0.0) == "leiden"
    assert choose(FIRST_FIT, views, 2, 600.0, 0.0) == "delft"  # name order
    assert choose(WORST_FIT, views, 31, 600.0, 0.0) == "leiden"
    assert choose(WORST_FIT, views, 31, 600.0, 0.0, threshold=2) is None  # 33 fit nowhere, ever


def test_a_job_that_fits_nowhere_now_goes_where_it_starts_first():
    views = {"a": StepFunction.from_steps([(0, 1), (100, 50)]), "b": StepFunction.from_steps([(0, 1), (50, 8)])}
    assert choose(WORST_FIT, views, 4, 10.0, 0.0) == "b"


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError):
        choose("best-fit", {"a": StepFunction.constant(4)}, 1, 1.0, 0.0)


@st.composite
def views(draw) -> dict[str, StepFunction]:
    out = {}
    for name in draw(st.lists(st.sampled_from(sorted(DAS3)), min_size=1, max_size=5, unique=True)):
        t, steps = 0.0, []
        for _ in range(draw(st.integers(1, 5))):
            steps.append((t, draw(st.integers(0, DAS3[name]))))
            t += draw(st.integers(1, 500))
        out[name] = StepFunction.from_steps(steps)
    return out


@given(views(), st.sampled_from(RULES), st.integers(1, 90), st.integers(1, 1000), st.integers(0, 600),
       st.integers(0, 4), st.randoms(use_true_random=False))
def test_the_chosen_cluster_starts_the_job_first_and_by_its_rule(vs, rule, nodes, duration, now, threshold, rnd):
    got = choose(rule, vs, nodes, duration, now, threshold)
    starts = {c: v.earliest_fit(nodes + threshold, duration, now) for c, v in vs.items()}
    first = min(starts.values())
    if got is None:
        assert first == math.inf
        return
    assert starts[got] == first
    tied = sorted(c for c, t in starts.items() if t == first)
    if rule == FIRST_FIT:
        assert got == tied[0]
    else:
        best = max(vs[c].value_at(first) for c in tied)
        assert vs[got].value_at(first) == best
        assert got == next(c for c in tied if vs[c].value_at(first) == best)
    shuffled = list(vs.items())
    rnd.shuffle(shuffled)
    assert choose(rule, dict(shuffled), nodes, duration, now, threshold) == got
