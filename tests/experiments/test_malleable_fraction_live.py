"""``coorm experiment malleable-fraction --live --quick`` over ``coorm up`` (real nats-server, valkey, services,
a node agent starting ``sleep`` on every node a job holds): the simulated replay's launchers, all-rigid and
then all malleable (the PSA model), run live to the end -- every job finishes, none fails, each malleable
job's tasks are its rigid job's nodes and all of them complete, some malleable jobs change size, and the
figures come from the run's own records (they agree with the simulator's replay of the same workload where
nothing but the live system's latencies can differ)."""

from __future__ import annotations

import shutil

from coorm.experiments import malleable_fraction as mf
from coorm.experiments import malleable_fraction_live as live
from tests.experiments.test_malleable_fraction_experiment import EXCERPT


def test_the_quick_live_run(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(EXCERPT, traces / f"{mf.TRACE}.swf.gz")  # (the reduced slice is in the shipped excerpt)
    monkeypatch.setenv("COORM_TRACES", str(traces))
    rigid, malleable = live.run_live(tmp_path, quick=True)
    _, planned = live.workload("filling", 1.0, live.QUICK_JOBS)
    nodes = sum(p.launcher.total_tasks for p in planned)  # each malleable job: one task per node of its rigid job
    assert (rigid["policy"], malleable["policy"], malleable["fraction"]) == ("rigid", "filling", 1.0)
    for r in (rigid, malleable):
        assert r["jobs"] == r["finished"] == live.QUICK_JOBS, r
        assert r["failed"] == 0 and r["unfinished"] == 0, r["failures"]
        assert 0 < r["utilisation"] <= 1
    # the rigid jobs: one process on every node of each, none refused
    assert rigid["malleable"] == 0 and rigid["processes"] == nodes and rigid["overtaken"] == 0
    # the malleable jobs: every task of every job done, some jobs on more than one size over their run
    assert malleable["malleable"] == live.QUICK_JOBS
    assert malleable["tasks"] == nodes and malleable["tasks_done"] == nodes
    assert malleable["resized"] >= 1 and malleable["wider_than_1"] >= 1
    # the rigid jobs queue on this slice; a malleable job starts on the first free node
    assert rigid["wait_mean"] > 1.0 and malleable["wait_mean"] < rigid["wait_mean"]
    # the records are the run's: the all-rigid replay (no adaptation) ends when the simulator says, give or
    # take the live system's start and end latencies
    assert abs(rigid["makespan"] - rigid["sim_makespan"]) < 0.2 * rigid["sim_makespan"]
    assert (tmp_path / f"{mf.NAME}-live.csv").exists()


def test_the_quick_live_run_of_the_negotiating_model(tmp_path, monkeypatch):
    """The malleable jobs as the shipped negotiating launcher (a quarter of the rigid job's nodes, growing by
    negotiation up to all of them): every job finishes, none fails, some grow past their minimum, and the
    live run agrees with the simulator's replay of the same workload. (Run with the workload's clock, the
    runner compared offers' wall-clock starts with it and renegotiated without end.)"""
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(EXCERPT, traces / f"{mf.TRACE}.swf.gz")
    monkeypatch.setenv("COORM_TRACES", str(traces))
    rigid, malleable = live.run_live(tmp_path, quick=True, model="negotiating")
    expected = ("filling", "negotiating", live.QUICK_JOBS)
    assert (malleable["policy"], malleable["model"], malleable["malleable"]) == expected
    for r in (rigid, malleable):
        assert r["jobs"] == r["finished"] == live.QUICK_JOBS, r
        assert r["failed"] == 0 and r["unfinished"] == 0, r["failures"]
    assert malleable["wider_than_1"] >= 1 and malleable["resized"] >= 1
    assert malleable["wait_mean"] < rigid["wait_mean"]
    for k in ("turnaround_mean", "makespan"):
        assert abs(malleable[k] - malleable[f"sim_{k}"]) < 0.2 * malleable[f"sim_{k}"], (k, malleable)
    assert (tmp_path / f"{mf.NAME}-live-negotiating.csv").exists()
