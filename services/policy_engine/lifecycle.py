"""A request's life in the policy core, as one table: its phases and every transition between them, each
with the condition under which the core takes it (CooRM §III-B, CooRMv2 §III-A). The core changes a
request's phase only through :func:`move`, which refuses a move the table does not have with
:class:`InvalidTransition` -- carrying the request's story, so that the bug report says how it got there.
``docs/architecture.md`` shows the diagram :func:`mermaid` draws from the table (a test fails on drift)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    WAITING = "waiting"  # submitted, not started: placed by conservative backfilling, in the others' views
    BLOCKED = "blocked"  # due, but its nodes are still held preemptibly: their holders must release them
    RUNNING = "running"  # started: its nodes are its own until its end
    HANDING_OVER = "handing over"  # done, or past its end, while its NEXT successor waits to take its nodes
    ENDED = "ended"


@dataclass(frozen=True)
class Transition:
    name: str
    sources: frozenset[Phase]
    target: Phase
    when: str


def _t(name: str, sources: Sequence[Phase], target: Phase, when: str) -> Transition:
    return Transition(name, frozenset(sources), target, when)


W, B, R, H, E = Phase.WAITING, Phase.BLOCKED, Phase.RUNNING, Phase.HANDING_OVER, Phase.ENDED

TRANSITIONS: tuple[Transition, ...] = (
    _t("block", [W], B, "placed at now, but nodes it needs are held preemptibly"),
    _t("start", [W, B], R, "placed at now and its nodes are free (a NEXT successor's include its predecessor's)"),
    _t("cancel", [W, B], E, "done before it started, or its session ended"),
    _t("hand over", [R], H, "done, or its end passed, while its NEXT successor waits"),
    _t("end", [R, H], E, "done, its walltime, its successor started, a node failed, its pre-allocation or "
                         "its session ended"),
)
_BY_NAME = {t.name: t for t in TRANSITIONS}


class InvalidTransition(RuntimeError):
    """The core tried a move its table does not have: a bug in the core, reported with the story."""

    def __init__(self, request: str, phase: Phase, name: str, story: Sequence[tuple[float, str, str]]) -> None:
        lines = "; ".join(f"{t:g} {what}" + (f" ({detail})" if detail else "") for t, what, detail in story)
        super().__init__(f"request {request}: cannot {name} from {phase.value} (its story: {lines or 'none'})")
        self.request, self.phase, self.name = request, phase, name


def target(phase: Phase, name: str, request: str, story: Sequence[tuple[float, str, str]] = ()) -> Phase:
    """Where transition ``name`` leads from ``phase``; :class:`InvalidTransition` if it does not start there."""
    t = _BY_NAME[name]
    if phase not in t.sources:
        raise InvalidTransition(request, phase, name, story)
    return t.target


def mermaid() -> str:
    """The table as a Mermaid state diagram (docs/architecture.md shows it)."""
    lines = ["stateDiagram-v2", f"    [*] --> {_node(W)}: submitted"]
    for t in TRANSITIONS:
        for s in _ordered(t.sources):
            lines.append(f"    {_node(s)} --> {_node(t.target)}: {t.name}")
    lines.append(f"    {_node(E)} --> [*]")
    return "\n".join(lines)


def table() -> str:
    """The table in Markdown (docs/architecture.md shows it under the diagram)."""
    rows = ["| transition | from | to | when |", "| --- | --- | --- | --- |"]
    for t in TRANSITIONS:
        sources = ", ".join(p.value for p in _ordered(t.sources))
        rows.append(f"| {t.name} | {sources} | {t.target.value} | {t.when} |")
    return "\n".join(rows)


def _ordered(phases: frozenset[Phase]) -> list[Phase]:
    return [p for p in Phase if p in phases]


def _node(p: Phase) -> str:
    return p.name.lower()
