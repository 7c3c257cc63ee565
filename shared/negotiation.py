"""The terms of a negotiation (the adaptive-RMS paper's Negotiation Template, reduced to one resource):
what an application says it can use, and the rules for picking a size within them.

An application asks for a request whose size is negotiable: anything from ``min_nodes`` to ``max_nodes``
that ``sizes`` allows (empty: every size in the range; e.g. ``[4, 12, 28]`` for an application on 4
nodes that must stay at a power of two). The RMS offers the largest allowed size it can give; the
application accepts, counters (asks again for at most some allowed size) or rejects. Pure: no state, no
clock -- the policy core keeps the negotiations (:mod:`coorm.services.policy_engine.negotiation`).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coorm.shared.requests import Identifier, RequestType

MAX_NODES = 1_000_000  # a request's bound (RequestSpec.nodes)
MAX_SIZES = 1024  # allowed sizes one negotiation may list
MAX_RESPOND_WITHIN = 3600.0  # the longest an offer may stay open, in seconds


class Answer(StrEnum):
    ACCEPT = "accept"
    COUNTER = "counter"
    REJECT = "reject"


class NegotiationTerms(BaseModel):
    """What a negotiation asks for. ``negotiation`` names it, and is the id of the request an accepted
    offer becomes (an application's own id, as a request's). ``duration``: seconds (None: unbounded,
    preemptible only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the request ids an offer is named after (``<negotiation>.o<round>``) must stay identifiers
    negotiation: Identifier = Field(max_length=112)
    cluster: Identifier
    type: RequestType = RequestType.NON_PREEMPTIBLE
    min_nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    max_nodes: int = Field(ge=1, le=MAX_NODES)
    sizes: tuple[int, ...] = Field(default=(), max_length=MAX_SIZES)
    duration: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    respond_within: float = Field(default=5.0, gt=0, le=MAX_RESPOND_WITHIN, allow_inf_nan=False)
    # nothing to give now: wait and offer when nodes free up (a malleable application's "offer me more")
    standing: bool = False

    @model_validator(mode="after")
    def _coherent(self) -> NegotiationTerms:
        if self.type is RequestType.PRE_ALLOCATION:
            raise ValueError("a pre-allocation is not negotiated: negotiate the request that runs")
        if self.duration is None and self.type is not RequestType.PREEMPTIBLE:
            raise ValueError("only a preemptible request may have an unbounded duration")
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes {self.min_nodes} > max_nodes {self.max_nodes}")
        if self.sizes:
            if list(self.sizes) != sorted(set(self.sizes)):
                raise ValueError("sizes must be increasing, each once")
            if self.sizes[0] < self.min_nodes or self.sizes[-1] > self.max_nodes:
                raise ValueError(f"sizes must lie within [{self.min_nodes}, {self.max_nodes}]")
        return self

    def allows(self, nodes: int) -> bool:
        """Whether the application can use a request of ``nodes`` nodes."""
        if not self.min_nodes <= nodes <= self.max_nodes:
            return False
        return not self.sizes or nodes in self.sizes

    def best(self, available: int, at_most: int | None = None) -> int:
        """The largest allowed size within ``available`` (and ``at_most``); 0 if none."""
        cap = min(available, self.max_nodes if at_most is None else min(at_most, self.max_nodes))
        if cap < self.min_nodes:
            return 0
        if not self.sizes:
            return cap
        fitting = [s for s in self.sizes if s <= cap]
        return fitting[-1] if fitting else 0

    def smallest(self) -> int:
        return self.sizes[0] if self.sizes else self.min_nodes


def pow2_sizes(held: int, max_total: int) -> tuple[int, ...]:
    """The growths that keep an application holding ``held`` nodes at a power of two, up to ``max_total``
    nodes in all (the paper's power-of-two application on 4 nodes: 4, 12, 28, ...)."""
    out = []
    total = 1
    while total <= max_total:
        if total > held:
            out.append(total - held)
        total *= 2
    return tuple(out)
