"""The policy core and the allocator core wired together the way the live services wire them.

The policy engine's start/end decisions go to the node allocator, whose capacity changes come back to
the policy as :class:`~coorm.shared.events.NodesChanged`. The simulator and the tests drive this object; the
live system does the same through NATS subjects. Still pure: time is passed in with every event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coorm.services.node_allocator.core import NodeAllocator
from coorm.services.policy_engine.core import PolicyCore, PolicySettings
from coorm.shared.events import (
    CapacityChanged,
    Decision,
    Done,
    EndRequest,
    ErrorCode,
    HoldReleased,
    NodeDown,
    NodeDrain,
    PolicyDecision,
    PolicyEvent,
    RegisterNodes,
    Rejected,
    StartRequest,
    Submit,
    Tick,
)

if TYPE_CHECKING:
    from coorm.shared.protocol import StatusReply


class CoupledCores:
    def __init__(self, settings: PolicySettings | None = None, *, validate: bool = False) -> None:
        self.policy = PolicyCore(settings, validate=validate)
        self.allocator = NodeAllocator(validate=validate)

    @property
    def now(self) -> float:
        return self.policy.now

    def handle(self, event: PolicyEvent | RegisterNodes | NodeDown | NodeDrain, *, pass_now: bool = True
               ) -> list[Decision]:
        """Feed a policy event (open, submit, done, close, tick) and return every decision it caused,
        the allocator's included. ``pass_now=False``: see :meth:`PolicyCore.handle`."""
        if isinstance(event, Done) and event.released:
            why = self.allocator.check_release(event.request, event.released)
            if why is not None and event.request in self.policy.requests:
                return [Rejected(stimulus_id=event.stimulus_id, code=ErrorCode.BAD_RELEASE, reason=why)]
        if isinstance(event, Submit) and not self.policy.settings.oversize_waits:
            too_large = self._too_large(event)
            if too_large is not None:
                return [too_large]
        if isinstance(event, (RegisterNodes, NodeDown, NodeDrain)):
            return self._node_event(event, pass_now)
        return self._feed(self.policy.handle(event, pass_now=pass_now), event.at)

    def _too_large(self, event: Submit) -> Rejected | None:
        """A request for more nodes than its cluster has, up or down, could never start: refused."""
        sizes = self.allocator.sizes()
        for spec in event.requests:
            if spec.cluster in sizes and spec.nodes > sizes[spec.cluster]:
                return Rejected(stimulus_id=event.stimulus_id, code=ErrorCode.TOO_LARGE,
                                reason=f"request {spec.id}: {spec.nodes} nodes, cluster {spec.cluster} has "
                                       f"{sizes[spec.cluster]}; it could never start")
            # left to the RMS: too large for every cluster it may go to
            allowed = [sizes[c] for c in (spec.clusters or sizes) if c in sizes]
            if spec.cluster is None and allowed and spec.nodes > max(allowed):
                return Rejected(stimulus_id=event.stimulus_id, code=ErrorCode.TOO_LARGE,
                                reason=f"request {spec.id}: {spec.nodes} nodes, the largest cluster it may go to "
                                       f"has {max(allowed)}; it could never start")
        return None

    def register(self, at: float, cluster: str, nodes: list[str]) -> list[Decision]:
        return self.handle(RegisterNodes(at=at, cluster=cluster, nodes=tuple(nodes)))

    def node_down(self, at: float, node: str) -> list[Decision]:
        return self.handle(NodeDown(at=at, node=node))

    def tick(self, at: float) -> list[Decision]:
        return self.handle(Tick(at=at))

    def status(self, sessions: dict[str, dict[str, object]], leader: str, offset: int = 0, limit: int | None = None,
               only: set[str] | None = None) -> StatusReply:
        """What ``coorm status``, ``apps`` and ``requests`` show (:mod:`.policy_engine.status`)."""
        from coorm.services.policy_engine.status import status_of

        return status_of(self, sessions, leader, offset, limit, only)

    def next_wakeup(self) -> float | None:
        times = [t for t in (self.policy.next_wakeup(), self.allocator.next_wakeup()) if t is not None]
        return min(times) if times else None

    def _node_event(self, event: RegisterNodes | NodeDown | NodeDrain, pass_now: bool = True) -> list[Decision]:
        out: list[Decision] = []
        for d in self.allocator.handle(event):
            out.append(d)
            if isinstance(d, CapacityChanged):
                out.extend(self._feed(self.policy.handle(d.as_event(event.at), pass_now=pass_now), event.at))
        return out

    def _feed(self, decisions: list[PolicyDecision], at: float) -> list[Decision]:
        out: list[Decision] = []
        self.allocator.handle(Tick(at=at))
        for d in decisions:
            out.append(d)
            if isinstance(d, (StartRequest, EndRequest, HoldReleased)):
                out.extend(self.allocator.handle(d))
        return out
