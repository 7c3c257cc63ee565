"""The node allocator core on its own: node IDs, NEXT keep/release, fair-start holds, node loss."""

from __future__ import annotations

import pytest

from coorm.services.node_allocator.core import AllocationError, NodeAllocator
from coorm.shared.events import EndReason, EndRequest, NodeDown, NodeDrain, RegisterNodes, StartRequest, Tick
from coorm.shared.requests import RequestType

NP = RequestType.NON_PREEMPTIBLE


def start(rid, nodes, at=0.0, carry_from=None, carried=0, type=NP):
    return StartRequest(stimulus_id="t", app="a", request=rid, type=type, cluster="c0", nodes=nodes, at=at,
                        end=None, carry_from=carry_from, carried=carried)


def end(rid, nodes, at=0.0, successor=None, carried=0, released=(), hold=0, until=None, reason=EndReason.DONE):
    return EndRequest(stimulus_id="t", app="a", request=rid, type=NP, cluster="c0", nodes=nodes, started=True,
                      reason=reason, at=at, successor=successor, carried=carried, released=released, hold_nodes=hold,
                      hold_until=until)


@pytest.fixture
def alloc() -> NodeAllocator:
    a = NodeAllocator(validate=True)
    out = a.handle(RegisterNodes(at=0.0, cluster="c0", nodes=tuple(f"n{i}" for i in range(8))))
    assert out[0].up == 8
    return a


def test_lowest_free_nodes_first_and_never_twice(alloc):
    a1 = alloc.handle(start("r1", 3))[0]
    a2 = alloc.handle(start("r2", 3))[0]
    assert a1.nodes == ("n0", "n1", "n2") and a2.nodes == ("n3", "n4", "n5")
    with pytest.raises(AllocationError, match="3 nodes wanted, 2 free"):
        alloc.handle(start("r3", 3))


def test_next_successor_keeps_nodes_and_grows(alloc):
    alloc.handle(start("r1", 3))
    alloc.handle(end("r1", 3, successor="r2", carried=3))
    out = alloc.handle(start("r2", 5, carry_from="r1", carried=3))
    assert out[-1].nodes == ("n0", "n1", "n2", "n3", "n4") and out[-1].kept == ("n0", "n1", "n2")


def test_next_successor_shrinks_releasing_the_named_nodes(alloc):
    alloc.handle(start("r1", 4))
    freed = alloc.handle(end("r1", 4, successor="r2", carried=2, released=("n1", "n2")))
    assert freed[0].nodes == ("n1", "n2")
    out = alloc.handle(start("r2", 2, carry_from="r1", carried=2))
    assert out[-1].nodes == ("n0", "n3")
    assert alloc.free_count("c0") == 6


def test_fair_start_hold_keeps_freed_nodes_out_of_the_pool_until_it_ends(alloc):
    alloc.handle(start("r1", 8))
    freed = alloc.handle(end("r1", 8, at=10.0, hold=8, until=15.0))
    assert len(freed[0].held) == 8 and alloc.free_count("c0") == 0
    assert alloc.next_wakeup() == 15.0
    alloc.handle(Tick(at=14.9))
    assert alloc.free_count("c0") == 0
    alloc.handle(Tick(at=15.0))
    assert alloc.free_count("c0") == 8


def test_node_down_reports_the_request_that_held_it(alloc):
    alloc.handle(start("r1", 2))
    out = alloc.handle(NodeDown(at=1.0, node="n1"))
    assert out[0].lost_requests == ("r1",) and out[0].up == 7
    assert alloc.nodes_of("r1") == ("n0",)
    out = alloc.handle(NodeDown(at=1.0, node="n5"))
    assert out[0].lost_requests == () and out[0].up == 6 and alloc.free_count("c0") == 5
    alloc.handle(RegisterNodes(at=2.0, cluster="c0", nodes=("n5",)))
    assert alloc.free_count("c0") == 6


def test_preallocations_get_no_node_ids(alloc):
    assert alloc.handle(start("p", 8, type=RequestType.PRE_ALLOCATION)) == []
    assert alloc.free_count("c0") == 8


def test_release_check(alloc):
    alloc.handle(start("r1", 2))
    assert alloc.check_release("r1", ("n0",)) is None
    assert "does not hold node(s) n7" in alloc.check_release("r1", ("n7",))


def test_next_successor_smaller_than_what_is_left_frees_the_surplus_at_once(alloc):
    alloc.handle(start("r1", 4))
    freed = alloc.handle(end("r1", 4, successor="r2", carried=1))
    assert freed[0].nodes == ("n1", "n2", "n3")
    alloc.handle(start("other", 7))  # a start earlier in the same batch can use them
    out = alloc.handle(start("r2", 1, carry_from="r1", carried=1))
    assert out[-1].nodes == ("n0",) and out[-1].kept == ("n0",)


def test_a_drained_node_finishes_its_work_and_is_never_given_again_until_resumed(alloc):
    alloc.handle(start("r1", 2))
    busy, idle = alloc.nodes_of("r1")[0], "n7"
    (cap,) = alloc.handle(NodeDrain(at=1.0, node=busy, reason="bad DIMM"))
    assert cap.up == 7  # planned without it from now on; its running work goes on
    (cap,) = alloc.handle(NodeDrain(at=1.0, node=idle, reason="maintenance"))
    assert cap.up == 6 and alloc.free_count("c0") == 5
    assert alloc.nodes_of("r1")[0] == busy and alloc.nodes[busy].state == "allocated"
    alloc.handle(end("r1", 2, at=2.0))
    assert alloc.nodes[busy].state == "drained" and alloc.free_count("c0") == 6
    alloc.handle(start("r2", 6, at=3.0))
    assert not {busy, idle} & set(alloc.nodes_of("r2"))
    with pytest.raises(AllocationError):
        alloc.handle(start("r3", 1, at=3.0))
    # down and up again, it stays drained; resumed, it is free
    alloc.handle(NodeDown(at=4.0, node=busy))
    alloc.handle(RegisterNodes(at=5.0, cluster="c0", nodes=(busy,)))
    assert alloc.nodes[busy].state == "drained"
    (cap,) = alloc.handle(NodeDrain(at=6.0, node=busy, drain=False))
    assert cap.up == 7 and alloc.nodes_of("r2") and alloc.free_count("c0") == 1
    assert alloc.handle(NodeDrain(at=6.0, node=busy, drain=False)) == []  # twice: nothing more


def test_draining_a_held_node_takes_it_from_the_hold(alloc):
    alloc.handle(start("r1", 2))
    alloc.handle(end("r1", 2, at=1.0, hold=2, until=10.0))
    held = [n.id for n in alloc.nodes.values() if n.state == "held"]
    (cap,) = alloc.handle(NodeDrain(at=2.0, node=held[0], reason="x"))
    assert cap.lost_held == 1 and alloc.nodes[held[0]].state == "drained"
    alloc.handle(Tick(at=11.0))
    assert alloc.nodes[held[0]].state == "drained" and alloc.nodes[held[1]].state == "free"


def test_a_clusters_size_counts_every_node_it_registered_whatever_its_state(alloc):
    alloc.handle(start("r1", 2))
    alloc.handle(NodeDown(at=1.0, node="n7"))
    alloc.handle(NodeDrain(at=1.0, node="n6", reason="maintenance"))
    alloc.handle(RegisterNodes(at=2.0, cluster="c1", nodes=("m0", "m1")))
    alloc.handle(RegisterNodes(at=3.0, cluster="c0", nodes=("n7", "n8")))  # one back, one new
    assert alloc.sizes() == {"c0": 9, "c1": 2}
    alloc.sizes()["c0"] = 100  # a copy: the caller's changes are not the allocator's
    assert alloc.sizes() == {"c0": 9, "c1": 2}
    # the count is checked against the nodes (validate): one that drifts is caught
    alloc._sizes["c1"] = 3
    with pytest.raises(AllocationError, match="sizes"):
        alloc.handle(Tick(at=4.0))
