"""Whether a stream's leader speaks for a quorum of its replicas, from its own account of them: the rule by
which a service tells a NATS server cut from its cluster (``services.runtime.leader_unheard``). The figures
are the partition test's: a cut leader still names its followers, current, their silence growing by the
second, then answers without a leader."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from nats.js.api import ClusterInfo, PeerInfo

from coorm.services.runtime import QUORUM_SILENCE, leader_unheard

S = 1_000_000_000  # ns


def _group(*actives: float | None, current: bool = True, leader: str | None = "part-2") -> ClusterInfo:
    return ClusterInfo(leader=leader, name="part",
                       replicas=[PeerInfo(name=f"part-{i}", current=current, active=None if a is None else int(a * S))
                                 for i, a in enumerate(actives)])


def test_a_leader_heard_by_its_followers_within_a_heartbeat_speaks_for_the_stream():
    assert leader_unheard(_group(0.3, 0.97)) is None


def test_a_leader_that_has_not_heard_its_followers_for_three_seconds_is_cut_off():
    assert leader_unheard(_group(3.31, 3.31)) == "the stream's leader part-2 hears 0 of its 2 followers"


def test_one_follower_of_two_is_a_quorum_but_none_of_four_of_five_is_not():
    assert leader_unheard(_group(0.5, 9.0)) is None
    assert leader_unheard(_group(0.5, 9.0, 9.0, 9.0)) is not None
    assert leader_unheard(_group(0.5, 0.5, 9.0, 9.0)) is None


def test_an_answer_without_a_leader_is_not_the_stream_answering():
    assert leader_unheard(_group(0.2, 0.2, leader=None)) == "the stream answered without a leader"


def test_followers_never_heard_or_not_current_do_not_count():
    # (a peer never heard of reports 0 s of silence, and current false: seen after the cut leader stepped down)
    assert leader_unheard(_group(0.0, 0.0, current=False)) is not None
    assert leader_unheard(_group(None, None)) is not None


def test_no_cluster_or_one_replica_is_the_stream_itself():
    assert leader_unheard(None) is None
    assert leader_unheard(ClusterInfo(leader="NC6EOQ", replicas=None)) is None


@given(st.lists(st.floats(min_value=0, max_value=30), min_size=0, max_size=6))
def test_the_verdict_is_a_strict_majority_of_the_group_hearing_the_leader(actives):
    heard = sum(1 for a in actives if int(a * S) / S < QUORUM_SILENCE)
    assert (leader_unheard(_group(*actives)) is None) == (1 + heard > (1 + len(actives)) / 2)
