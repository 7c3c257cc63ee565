"""The node allocator core: which node ID belongs to which request.

Rules:
* a node is exactly one of: free, allocated to one started request, held (fair-start), parked (kept for
  a NEXT successor starting in the same batch), or down; a node is never given to two requests;
* a started request gets the lowest-numbered free nodes of its cluster (registration order), except that
  a NEXT successor first keeps its predecessor's nodes (minus those the application released), then grows
  from the free pool; when it is smaller, the predecessor's last nodes are released;
* nodes freed by an early ``done`` stay held until the fair-start hold the policy decided ends;
* nodes held preemptibly are never taken away here: the policy starts a request only once enough nodes
  are free, i.e. after preemptible holders released theirs or were killed;
* a node that goes down while allocated is reported with its request, so the policy ends that request.

Pre-allocations own no node IDs and are ignored. Inputs are the policy core's Start/End decisions and
node events; outputs are ``NodesAssigned`` (startNotify), ``NodesFreed`` (kill on those nodes) and
``CapacityChanged`` (for the policy).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from coorm.shared.events import (
    AllocatorEvent,
    AllocatorOutput,
    CapacityChanged,
    EndRequest,
    HoldReleased,
    NodeDown,
    NodeDrain,
    NodesAssigned,
    NodesFreed,
    RegisterNodes,
    StartRequest,
    Tick,
)
from coorm.shared.requests import RequestType

FREE, ALLOCATED, HELD, PARKED, DOWN, DRAINED = "free", "allocated", "held", "parked", "down", "drained"


class AllocationError(RuntimeError):
    """The allocator was asked for nodes it does not have: the policy and the allocator disagree."""


@dataclass(slots=True)
class Node:
    id: str
    cluster: str
    order: int
    state: str = FREE
    owner: str | None = None  # request id when allocated or parked (predecessor id)
    held_until: float = 0.0
    drain: str | None = None  # an operator's reason: what runs finishes, then the node is DRAINED, not free


class NodeAllocator:
    def __init__(self, *, validate: bool = False) -> None:
        self.validate = validate
        self.now = 0.0
        self.nodes: dict[str, Node] = {}
        # cluster -> its registered nodes (never unregistered): every submission asks, and counting 10,000
        # nodes each time was half a loaded engine's CPU (5,000 submissions at once: the lease lapsed)
        self._sizes: dict[str, int] = {}
        # cluster -> its nodes up (not down, not drained nor draining): every node event tells the policy, and
        # counting them each time cost 0.36 of a NodeDown's 0.41 ms on a 10,000-node cluster
        self._up: dict[str, int] = {}
        self._free: dict[str, list[tuple[int, str]]] = {}
        self.allocations: dict[str, list[str]] = {}
        self._owner_app: dict[str, str] = {}
        self._parked: dict[str, list[str]] = {}
        self._held: list[tuple[float, str]] = []
        self._held_for: dict[str, list[str]] = {}  # request -> the node IDs its end left held
        self._order = 0

    # -- queries ------------------------------------------------------------------------------------
    def up(self, cluster: str) -> int:
        """The nodes the policy may plan with: not down, not drained nor draining (a draining node's running
        work is already counted; it will not be given again)."""
        return self._up.get(cluster, 0)

    def sizes(self) -> dict[str, int]:
        """Every cluster's registered nodes, whatever their state: what the largest request could have."""
        return dict(self._sizes)

    def free_count(self, cluster: str) -> int:
        return len(self._free.get(cluster, ()))

    def nodes_of(self, request: str) -> tuple[str, ...]:
        return tuple(self.allocations.get(request, ()))

    def check_release(self, request: str, released: tuple[str, ...]) -> str | None:
        """Why ``released`` cannot be released by ``request`` (None if it can)."""
        mine = set(self.allocations.get(request, ()))
        foreign = [n for n in released if n not in mine]
        if foreign:
            return f"request {request} does not hold node(s) {', '.join(foreign)}"
        return None

    # -- events -------------------------------------------------------------------------------------
    def handle(self, event: AllocatorEvent) -> list[AllocatorOutput]:
        self.now = max(self.now, getattr(event, "at", self.now))
        out = self._release_holds()
        if isinstance(event, StartRequest):
            out.extend(self._start(event))
        elif isinstance(event, EndRequest):
            out.extend(self._end(event))
        elif isinstance(event, HoldReleased):
            self._release_hold(event.request)
        elif isinstance(event, RegisterNodes):
            out.extend(self._register(event))
        elif isinstance(event, NodeDown):
            out.extend(self._down(event))
        elif isinstance(event, NodeDrain):
            out.extend(self._drain(event))
        elif not isinstance(event, Tick):
            raise TypeError(f"the allocator does not handle {type(event).__name__}")
        if self.validate:
            self.check()
        return out

    def next_wakeup(self) -> float | None:
        return min((t for t, _ in self._held), default=None)

    # -- internals ----------------------------------------------------------------------------------
    def _count_up(self, node: Node, sign: int) -> None:
        """``node`` joins (+1) or leaves (-1) its cluster's nodes up: called when it counts as up (not down, no
        drain), after it came up or before it goes."""
        if is_up(node):
            self._up[node.cluster] = self._up.get(node.cluster, 0) + sign

    def _to_free(self, node: Node) -> None:
        if node.drain is not None:
            node.state, node.owner = DRAINED, None
            return
        node.state, node.owner = FREE, None
        bisect.insort(self._free.setdefault(node.cluster, []), (node.order, node.id))

    def _take_free(self, cluster: str, count: int) -> list[str]:
        pool = self._free.get(cluster, [])
        if count > len(pool):
            raise AllocationError(f"cluster {cluster}: {count} nodes wanted, {len(pool)} free")
        taken, self._free[cluster] = pool[:count], pool[count:]
        return [nid for _, nid in taken]

    def _release_holds(self) -> list[AllocatorOutput]:
        if not self._held or self._held[0][0] > self.now:
            return []
        keep = []
        for until, nid in self._held:
            node = self.nodes[nid]
            if until > self.now:
                keep.append((until, nid))
            elif node.state == HELD:
                self._to_free(node)
        self._held = keep
        gone = {nid for _, nid in keep}
        self._held_for = {r: ns for r, ns in self._held_for.items() if any(n in gone for n in ns)}
        return []

    def _release_hold(self, request: str) -> None:
        """A hold the policy ended early: its nodes go back to the free pool now."""
        nodes = set(self._held_for.pop(request, ()))
        if not nodes:
            return
        for nid in nodes:
            if self.nodes[nid].state == HELD:
                self._to_free(self.nodes[nid])
        self._held = [(t, n) for t, n in self._held if n not in nodes]

    def _register(self, ev: RegisterNodes) -> list[AllocatorOutput]:
        for nid in ev.nodes:
            node = self.nodes.get(nid)
            if node is None:
                self._order += 1
                node = self.nodes[nid] = Node(nid, ev.cluster, self._order, DOWN)
                self._sizes[ev.cluster] = self._sizes.get(ev.cluster, 0) + 1
            if node.cluster != ev.cluster:
                raise AllocationError(f"node {nid} belongs to cluster {node.cluster}, not {ev.cluster}")
            if node.state == DOWN:
                self._to_free(node)
                self._count_up(node, +1)
        return [CapacityChanged(stimulus_id=ev.stimulus_id, cluster=ev.cluster, up=self.up(ev.cluster))]

    def _down(self, ev: NodeDown) -> list[AllocatorOutput]:
        node = self.nodes.get(ev.node)
        if node is None or node.state == DOWN:
            return []
        lost: tuple[str, ...] = ()
        lost_held = 0
        if node.state == HELD:
            lost_held = 1
        elif node.state == FREE:
            self._free[node.cluster].remove((node.order, node.id))
        elif node.state == ALLOCATED and node.owner is not None:
            lost = (node.owner,)
            self.allocations[node.owner].remove(node.id)
        elif node.state == PARKED and node.owner is not None:
            self._parked[node.owner].remove(node.id)
        self._count_up(node, -1)
        node.state, node.owner = DOWN, None
        return [CapacityChanged(stimulus_id=ev.stimulus_id, cluster=node.cluster, up=self.up(node.cluster),
                                lost_requests=lost, lost_held=lost_held)]

    def _drain(self, ev: NodeDrain) -> list[AllocatorOutput]:
        node = self.nodes.get(ev.node)
        if node is None or (node.drain is not None) == ev.drain:
            return []
        lost_held = 0
        if ev.drain:
            self._count_up(node, -1)
            node.drain = ev.reason or "drained"
            if node.state == FREE:
                self._free[node.cluster].remove((node.order, node.id))
                node.state = DRAINED
            elif node.state == HELD:  # the hold loses it, as when a held node goes down
                lost_held = 1
                node.state = DRAINED
                self._held = [(t, n) for t, n in self._held if n != node.id]
        else:
            node.drain = None
            self._count_up(node, +1)
            if node.state == DRAINED:
                self._to_free(node)
        return [CapacityChanged(stimulus_id=ev.stimulus_id, cluster=node.cluster, up=self.up(node.cluster),
                                lost_held=lost_held)]

    def _start(self, ev: StartRequest) -> list[AllocatorOutput]:
        if ev.type is RequestType.PRE_ALLOCATION:
            return []
        if ev.request in self.allocations:
            raise AllocationError(f"request {ev.request} is already started")
        kept: list[str] = []
        out: list[AllocatorOutput] = []
        if ev.carry_from is not None:
            parked = self._parked.pop(ev.carry_from, [])
            kept = parked[: ev.carried]
            surplus = parked[ev.carried :]
            for nid in surplus:
                self._to_free(self.nodes[nid])
            if surplus:
                out.append(
                    NodesFreed(stimulus_id=ev.stimulus_id, app=ev.app, request=ev.carry_from,
                               cluster=ev.cluster, nodes=tuple(surplus), reason="next")
                )
        added = self._take_free(ev.cluster, ev.nodes - len(kept))
        nodes = kept + added
        for nid in nodes:
            self.nodes[nid].state, self.nodes[nid].owner = ALLOCATED, ev.request
        self.allocations[ev.request] = nodes
        self._owner_app[ev.request] = ev.app
        out.append(
            NodesAssigned(stimulus_id=ev.stimulus_id, app=ev.app, request=ev.request, cluster=ev.cluster,
                          nodes=tuple(nodes), kept=tuple(kept))
        )
        return out

    def _end(self, ev: EndRequest) -> list[AllocatorOutput]:
        nodes = self.allocations.pop(ev.request, None)
        self._owner_app.pop(ev.request, None)
        if nodes is None:
            return []
        released = [n for n in ev.released if n in nodes]
        rest = [n for n in nodes if n not in released]
        freed = list(nodes)
        if ev.successor is not None:
            # only what the successor keeps is parked: the rest is free for the starts that follow
            kept = rest[: ev.carried]
            self._parked[ev.request] = kept
            for nid in kept:
                self.nodes[nid].state = PARKED
            freed = released + rest[ev.carried :]
        held: list[str] = []
        hold_until = ev.hold_until if ev.hold_until is not None else self.now
        if ev.hold_nodes and hold_until > self.now:
            held = (released + [n for n in freed if n not in released])[: ev.hold_nodes]
        for nid in freed:
            node = self.nodes[nid]
            if nid in held:
                node.state, node.owner = HELD, None
                bisect.insort(self._held, (hold_until, nid))
                self._held_for.setdefault(ev.request, []).append(nid)
            else:
                self._to_free(node)
        if not freed:
            return []
        return [
            NodesFreed(stimulus_id=ev.stimulus_id, app=ev.app, request=ev.request, cluster=ev.cluster,
                       nodes=tuple(freed), reason=ev.reason.value, held=tuple(held),
                       held_until=ev.hold_until if held else None)
        ]

    # -- invariants ---------------------------------------------------------------------------------
    def check(self) -> None:
        owners: dict[str, str] = {}
        for rid, nodes in self.allocations.items():
            for nid in nodes:
                if nid in owners:
                    raise AllocationError(f"node {nid} is given to {owners[nid]} and {rid}")
                owners[nid] = rid
                if self.nodes[nid].state != ALLOCATED or self.nodes[nid].owner != rid:
                    raise AllocationError(f"node {nid} of {rid} is marked {self.nodes[nid].state}")
        for pool in self._free.values():
            for _, nid in pool:
                if self.nodes[nid].state != FREE or nid in owners:
                    raise AllocationError(f"node {nid} is in the free pool but {self.nodes[nid].state}")
        counted = sum(len(p) for p in self._free.values())
        if counted != sum(1 for n in self.nodes.values() if n.state == FREE):
            raise AllocationError("free pool and node states disagree")
        if self._sizes != sizes_of(self.nodes.values()):
            raise AllocationError("the clusters' sizes and their nodes disagree")
        if {c: k for c, k in self._up.items() if k} != up_of(self.nodes.values()):
            raise AllocationError("the clusters' nodes up and their states disagree")


def is_up(node: Node) -> bool:
    """The policy may plan with ``node``: not down, not drained nor draining."""
    return node.state != DOWN and node.drain is None


def up_of(nodes: Iterable[Node]) -> dict[str, int]:
    """The number of ``nodes`` up (:func:`is_up`) in each cluster that has some."""
    return sizes_of(n for n in nodes if is_up(n))


def sizes_of(nodes: Iterable[Node]) -> dict[str, int]:
    """The number of ``nodes`` in each cluster."""
    out: dict[str, int] = {}
    for n in nodes:
        out[n.cluster] = out.get(n.cluster, 0) + 1
    return out
