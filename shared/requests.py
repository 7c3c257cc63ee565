"""The request: the one thing every application sends (CooRM §III-A, CooRMv2 §III-A1/2).

A request asks for ``nodes`` nodes of one ``cluster`` for ``duration`` seconds. Its ``type`` says how the
RMS may treat it (pre-allocation: nodes only marked for the application; non-preemptible: run to
completion; preemptible: may be taken back), and ``related_to`` / ``related_how`` constrain its start
relative to another request of the same application: FREE (no constraint), COALLOC (same start),
NEXT (start at the other's end, keeping its nodes).

An application that does not want to pick the cluster may leave the choice to the RMS (an opt-in
delegation: CooRM's RMS shows views and the application chooses; this one asks the RMS to apply a rule
for it): no ``cluster``, a ``placement`` rule (KOALA's ``worst-fit``, or ``first-fit``:
:mod:`coorm.shared.cluster_choice`) and optionally the ``clusters`` it may go to (none: any). The policy
core picks the cluster the first time it places the request, and keeps it there; the start notification
names it, so that the application's later requests (its growth) go to the same cluster. Only a FREE
non-preemptible request or pre-allocation may be placed so: a relation ties a request to a cluster the
application names, and a preemptible request starts within its preemptive view of one cluster.

Validation here is what can be checked on the message alone; what needs the RMS's state (does the
cluster exist, does ``related_to`` name a request of this application) is checked by the policy core.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")]

MAX_BATCH = 1000
MAX_CLUSTERS = 1000  # clusters a request may name as allowed

# the rules of coorm.shared.cluster_choice (RULES there; a test checks they agree: this module stays light)
Placement = Literal["worst-fit", "first-fit"]


class RequestType(StrEnum):
    PRE_ALLOCATION = "pre-allocation"
    NON_PREEMPTIBLE = "non-preemptible"
    PREEMPTIBLE = "preemptible"


class Relation(StrEnum):
    FREE = "FREE"
    COALLOC = "COALLOC"
    NEXT = "NEXT"


class RequestSpec(BaseModel):
    """One request as an application sends it. ``duration`` ``None`` means unbounded (preemptible only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Identifier
    type: RequestType = RequestType.NON_PREEMPTIBLE
    cluster: Identifier | None = None  # None: the RMS picks it, by ``placement``
    nodes: int = Field(ge=1, le=1_000_000)
    duration: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    related_to: Identifier | None = None
    related_how: Relation = Relation.FREE
    # the RMS chooses the cluster, by this rule, among ``clusters`` (None: any cluster)
    placement: Placement | None = None
    clusters: list[Identifier] | None = Field(default=None, min_length=1, max_length=MAX_CLUSTERS)

    @model_validator(mode="after")
    def _coherent(self) -> RequestSpec:
        self._placement_coherent()
        if self.duration is None and self.type is not RequestType.PREEMPTIBLE:
            raise ValueError(f"request {self.id}: only preemptible requests may have an unbounded duration")
        if self.related_how is not Relation.FREE and self.related_to is None:
            raise ValueError(f"request {self.id}: {self.related_how.value} needs related_to")
        if self.related_to == self.id:
            raise ValueError(f"request {self.id}: a request cannot be related to itself")
        return self

    def _placement_coherent(self) -> None:
        if self.placement is None:
            if self.cluster is None:
                raise ValueError(f"request {self.id}: name a cluster, or a placement rule for the RMS to choose one")
            if self.clusters is not None:
                raise ValueError(f"request {self.id}: clusters (the allowed ones) go with a placement rule")
            return
        if self.cluster is not None:
            raise ValueError(f"request {self.id}: a cluster or a placement rule, not both")
        if self.type is RequestType.PREEMPTIBLE:
            raise ValueError(f"request {self.id}: a preemptible request names its cluster (it starts within "
                             "its preemptive view of one)")
        if self.related_to is not None or self.related_how is not Relation.FREE:
            raise ValueError(f"request {self.id}: a request placed by the RMS cannot be related to another")
        if self.clusters is not None and len(set(self.clusters)) != len(self.clusters):
            raise ValueError(f"request {self.id}: a cluster is named twice in clusters")


def _relation_cycle(requests: list[RequestSpec]) -> list[str] | None:
    """The first cycle of ``related_to`` links inside one batch, as a list of ids, or None."""
    links = {r.id: r.related_to for r in requests if r.related_how is not Relation.FREE}
    for origin in links:
        path = [origin]
        node = links.get(origin)
        while node is not None and node in links:
            if node in path:
                return path[path.index(node) :] + [node]
            path.append(node)
            node = links[node]
    return None


class RequestBatch(BaseModel):
    """Requests sent together (a COALLOC group, an update's two requests...), accepted or refused as one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: list[RequestSpec] = Field(min_length=1, max_length=MAX_BATCH)

    @model_validator(mode="after")
    def _relations(self) -> RequestBatch:
        seen: set[str] = set()
        for r in self.requests:
            if r.id in seen:
                raise ValueError(f"request id {r.id} appears twice in the batch")
            seen.add(r.id)
        cycle = _relation_cycle(self.requests)
        if cycle:
            raise ValueError("relation cycle: " + " -> ".join(cycle))
        position = {r.id: i for i, r in enumerate(self.requests)}
        for i, r in enumerate(self.requests):
            if r.related_to is not None and r.related_how is not Relation.FREE and position.get(r.related_to, -1) > i:
                raise ValueError(
                    f"request {r.id} is related to {r.related_to}, which comes later in the batch: "
                    "send the request it depends on first"
                )
        return self
