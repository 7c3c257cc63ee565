"""The full runs' results committed next to EXPERIMENTS.md (``experiments/NAME.json``), for the tests that
compare a quick run's shape and trend with them."""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import common

DOC = Path(__file__).resolve().parents[2] / "EXPERIMENTS.md"


def stored_rows(name: str) -> list[dict]:
    rows: list[dict] = common.load(DOC, name)["rows"]
    return rows


def assert_same_shape(quick: list[dict], stored: list[dict]) -> None:
    """The quick run's rows carry the same columns as the stored full run's (CSV rows are strings: keys
    only)."""
    assert quick and stored
    assert {frozenset(r) for r in quick} == {frozenset(r) for r in stored}
