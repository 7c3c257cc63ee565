"""``egs-offer`` (services/policy_engine/shares.py): KOALA's EQUI GROW as its Fig. 5 writes it -- the idle nodes
above the threshold offered in equal parts (the remainder one each to the earliest started), each application
taking what it can of its part, the rest left idle, not handed to the others; shrinks as EGS's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.shares import EGS, EGS_OFFER, equal_parts, koala, preemptive_share

holdings_st = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6)


@given(capacity=st.integers(0, 60), apps=holdings_st, threshold=st.integers(0, 5))
def test_each_takes_what_it_can_of_its_equal_part_and_the_rest_stays_idle(capacity, apps, threshold):
    held = [h for h, _ in apps]
    asked = [h + x for h, x in apps]
    if capacity < sum(held):
        return
    out = koala(capacity, held, asked, EGS_OFFER, threshold)
    free = max(capacity - threshold - sum(held), 0)
    parts = equal_parts(free, len(apps))
    assert sum(parts) == free and max(parts) - min(parts) <= 1 and parts == sorted(parts, reverse=True)
    assert out == [h + min(a - h, p) for h, a, p in zip(held, asked, parts, strict=True)]
    # never more than EGS (max-min) hands out: what one does not take is not handed on
    assert sum(out) <= sum(koala(capacity, held, asked, EGS, threshold))


def test_a_part_too_small_for_a_power_of_two_is_left_idle_where_egs_hands_it_on():
    # three applications hold 2 each on 12 nodes (6 idle): parts of 2; the first asks 1 more only (FT at 3
    # would not run: it asks what keeps it at a power of two -- here, none), the others 10 more each
    held, asked = [2, 2, 2], [2, 12, 12]
    assert koala(12, held, asked, EGS_OFFER) == [2, 4, 4]  # 2 idle
    assert koala(12, held, asked, EGS) == [2, 5, 5]  # (max-min: the first's part goes to the others)
    # its view -- what it could hold if it asked for everything -- is its own part either way
    assert preemptive_share(12, asked, 0, EGS_OFFER, held) == 4


@given(apps=holdings_st, lacking=st.integers(1, 40), threshold=st.integers(0, 5))
def test_it_shrinks_as_egs(apps, lacking, threshold):
    held = [h for h, _ in apps]
    capacity = max(sum(held) - lacking, 0)
    if capacity >= sum(held):
        return
    asked = [h + x for h, x in apps]
    assert koala(capacity, held, asked, EGS_OFFER, threshold) == koala(capacity, held, asked, EGS, threshold)


def test_the_settings_take_it_by_name():
    assert PolicySettings(preemptible="egs-offer").preemptible == EGS_OFFER
