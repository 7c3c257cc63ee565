"""``coorm experiment coorm-fig6-w2``: Fig. 6's W2 re-run with what each application was told. Its quick form
replays the shipped sample; its stored full run must be Fig. 6's own lightest and heaviest W2 runs."""

from __future__ import annotations

import pytest

from coorm.experiments import coorm_fig6
from coorm.experiments import coorm_fig6_w2 as w2
from coorm.experiments.common import quartiles
from coorm.simulator.traces import SAMPLE
from tests.experiments.stored import assert_same_shape, stored_rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The quick rows, and Fig. 6's run of the same tasks (both need the sample trace)."""
    saved, coorm_fig6.TRACE = coorm_fig6.TRACE, SAMPLE
    try:
        rows = w2.run(tmp_path_factory.mktemp(w2.NAME), quick=True)
        fig6 = [coorm_fig6.run_one(coorm_fig6.Task(r["workload"], r["clusters"], r["pack"],
                                                   tuple(coorm_fig6.pack_jobs(r["pack"], w2.QUICK_W2["jobs"]))))
                for r in rows]
    finally:
        coorm_fig6.TRACE = saved
    return rows, fig6


def test_the_runs_are_fig6s_and_their_bytes_split_adds_up(runs):
    rows, fig6 = runs
    assert len(rows) == len(w2.QUICK_W2["packs"])
    for r, f in zip(rows, fig6, strict=True):
        assert (r["bytes"], r["messages"], r["makespan"]) == (f["bytes"], f["messages"], f["makespan"])
        assert 0 < r["cem_notification_bytes"] < r["notification_bytes"] < r["bytes"]
        assert r["cem_apps"] == round(coorm_fig6.W2_CEM_FRACTION * r["apps"])
        assert 0 < r["app_seconds_waited"] < r["apps"] * r["makespan"]
    assert w2.NAME in w2.markdown(rows)


def test_the_stored_runs_are_fig6s_lightest_and_heaviest_where_w2_peaks(runs):
    rows, _ = runs
    stored = stored_rows(w2.NAME)
    assert_same_shape(rows, stored)
    w2_bytes = {r["clusters"]: r for r in stored_rows(coorm_fig6.NAME)
                if (r["system"], r["workload"], r["metric"]) == ("CooRM", "W2", "bytes")}
    nc = stored[0]["clusters"]
    assert sorted(r["bytes"] for r in stored) == [w2_bytes[nc]["min"], w2_bytes[nc]["max"]]
    assert w2_bytes[nc]["max"] == max(r["max"] for r in w2_bytes.values())


@pytest.mark.parametrize("values", [[7.0], [3.0, 1.0], [5.0, 2.0, 9.0], [4.0, 4.0, 1.0]])
def test_up_to_three_packs_their_quartiles_are_the_runs(values):
    assert coorm_fig6.pack_values({**quartiles(values), "packs": len(values)}) == sorted(values)


def test_four_packs_quartiles_do_not_give_the_runs():
    assert coorm_fig6.pack_values({**quartiles([1.0, 2.0, 3.0, 4.0]), "packs": 4}) is None
