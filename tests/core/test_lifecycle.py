"""A request's lifecycle table (services/policy_engine/lifecycle.py): the core moves requests only along
its transitions, a move it lacks is refused with the request's story, every row of it is used by a random
run of the cores, and the diagram in docs/architecture.md is the one the table draws."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from coorm.services.policy_engine import lifecycle
from coorm.services.policy_engine.lifecycle import InvalidTransition, Phase
from tests.core.determinism_run import Run
from tests.core.driver import Driver, rq

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_the_documented_diagram_and_table_are_the_code_s():
    text = DOC.read_text()
    found = re.search(r"<!-- lifecycle:begin[^>]*-->\n(.*?)<!-- lifecycle:end -->", text, re.S)
    assert found, "docs/architecture.md should hold the lifecycle between its markers"
    assert found.group(1) == f"```mermaid\n{lifecycle.mermaid()}\n```\n\n{lifecycle.table()}\n", (
        "the lifecycle in docs/architecture.md is not the table's: paste lifecycle.mermaid() and table()")


def test_a_move_the_table_lacks_is_refused_with_the_request_s_story():
    d = Driver({"c0": 4})
    d.open(0.0, "a")
    d.submit(0.0, "a", rq("r", "c0", 2, 10))
    d.done(1.0, "a", "r")
    story = d.policy.story("r")
    assert [what for _, what, _ in story] == ["submitted", "started", "ended"]
    with pytest.raises(InvalidTransition) as e:
        lifecycle.target(Phase.ENDED, "start", "r", story)
    assert "cannot start from ended" in str(e.value) and "0 submitted" in str(e.value) and "1 ended" in str(e.value)


def test_every_transition_of_the_table_is_taken_by_a_random_run(monkeypatch):
    taken: Counter = Counter()
    real = lifecycle.target

    def recording(phase, name, request, story=()):
        out = real(phase, name, request, story)
        taken[name] += 1
        return out

    monkeypatch.setattr(lifecycle, "target", recording)
    run = Run(3)
    while len(run.events) < 3000:
        run.step()
    assert set(taken) == {t.name for t in lifecycle.TRANSITIONS}, taken
