"""The CooRM experiments (Fig. 6 and Fig. 7) in quick mode: each writes its CSV and PNG, and its quick result
shows the paper's trends. They replay the shipped sample of the LLNL Atlas trace (the 800 jobs of the packs
quick mode reads, with the same random draws as on the whole log), so that every machine runs them on the
same data, with nothing to download."""

from __future__ import annotations

import csv

import pytest

from coorm.experiments import coorm_fairstart_idle, coorm_fig6, coorm_fig7
from coorm.launchers.cem import CEMLauncher, paper_platform
from coorm.launchers.moldable import MoldableLauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.simulator.trace import TraceJob
from coorm.simulator.traces import SAMPLE
from tests.experiments.stored import assert_same_shape, stored_rows


@pytest.fixture(scope="module", autouse=True)
def sample_trace():
    """The experiments read the shipped sample (the figures of the full trace are in EXPERIMENTS.md)."""
    saved, coorm_fig6.TRACE = coorm_fig6.TRACE, SAMPLE
    yield
    coorm_fig6.TRACE = saved


def _read(path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _run(module, tmp_path_factory):
    out = tmp_path_factory.mktemp(module.NAME)
    returned = module.run(out, quick=True)
    rows = _read(out / f"{module.NAME}.csv")  # what the figure shows, as strings
    assert len(rows) == len(returned)
    assert (out / f"{module.NAME}.png").stat().st_size > 0
    runs = _read(out / f"{module.NAME}-runs.csv")
    return rows, runs


@pytest.fixture(scope="module")
def fig6(tmp_path_factory):
    return _run(coorm_fig6, tmp_path_factory)


@pytest.fixture(scope="module")
def fig7(tmp_path_factory):
    return _run(coorm_fig7, tmp_path_factory)


@pytest.fixture(scope="module")
def fairstart(tmp_path_factory):
    out = tmp_path_factory.mktemp(coorm_fairstart_idle.NAME)
    return coorm_fairstart_idle.run(out, quick=True)


def _point(rows, system, workload, clusters, metric) -> dict:
    (r,) = [r for r in rows if (r["system"], r["workload"], r["clusters"], r["metric"])
            == (system, workload, clusters, metric)]
    return r


# ======================================================================================================
# without the trace
# ======================================================================================================
def test_a_missing_trace_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(coorm_fig6, "TRACE", tmp_path / "nowhere.swf.gz")
    for module in (coorm_fig6, coorm_fig7):
        with pytest.raises(FileNotFoundError, match="Atlas trace"):
            module.run(tmp_path / "out", quick=True)
    assert not (tmp_path / "out").exists()


def test_a_trace_not_fetched_says_how_to_fetch_it(monkeypatch, tmp_path):
    monkeypatch.setattr(coorm_fig6, "TRACE", "LLNL-Atlas-2006-2.1-cln")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COORM_TRACES", str(tmp_path / "none"))
    monkeypatch.setattr("coorm.simulator.traces.search_path", lambda: [tmp_path / "cache" / "coorm" / "traces"])
    with pytest.raises(FileNotFoundError, match="coorm trace fetch LLNL-Atlas-2006-2.1-cln"):
        coorm_fig6.run(tmp_path / "out", quick=True)


def _jobs(n: int) -> list[TraceJob]:
    return [TraceJob(id=k, submit=0.0, runtime=100.0 + k, walltime=200.0 + k, nodes=1 + (k * 37) % 300)
            for k in range(n)]


def test_workloads_follow_section_iv_a():
    props = paper_platform(4)
    jobs = _jobs(200)
    w0 = coorm_fig6.build_workload(jobs, props, "W0", seed=3)
    assert len(w0) == 200
    assert sum(isinstance(x, MoldableLauncher) for x in w0) == 40  # 20% simple-moldable
    assert sum(isinstance(x, RigidLauncher) for x in w0) == 160
    for lau in w0:
        if isinstance(lau, MoldableLauncher):  # OAR's full enumeration: nC x (nH - 1)
            assert len(lau.configs) == 4 * 127
        else:
            assert lau.nodes <= 128
            speed = props.speed_of(lau.cluster)
            job = jobs[int(lau.app[1:]) - 1]
            assert lau.runtime == pytest.approx(max(job.runtime / speed, 1.0))
    w1 = coorm_fig6.build_workload(jobs, props, "W1", seed=3)
    assert len(w1) == 201 and isinstance(w1[100], CEMLauncher) and w1[100].app == "cem"
    assert [x.app for x in w1[:100] + w1[101:]] == [x.app for x in w0]
    w2 = coorm_fig6.build_workload(jobs, props, "W2", seed=3)
    assert sum(isinstance(x, CEMLauncher) for x in w2) == 100
    assert all(isinstance(x, CEMLauncher) for x in coorm_fig6.build_workload(jobs, props, "W3", seed=3))
    # deterministic: the same draws for the same pack
    again = coorm_fig6.build_workload(jobs, props, "W0", seed=3)
    assert [(type(a), getattr(a, "cluster", None)) for a in again] == [(type(a), getattr(a, "cluster", None))
                                                                        for a in w0]


# ======================================================================================================
# Fig. 6
# ======================================================================================================
def test_fig6_coorm_computes_far_fewer_configurations_than_oar(fig6):
    rows, _ = fig6
    for nc in coorm_fig6.QUICK["clusters"]:
        oar = _point(rows, "OAR-SIM", "W0", str(nc), "computed_configurations")
        coorm = _point(rows, "CooRM", "W0", str(nc), "computed_configurations")
        assert 0 < float(coorm["max"]) * 100 < float(oar["min"]), (nc, coorm, oar)


def test_fig6_oar_counts_the_whole_enumeration_at_every_pass(fig6):
    _, runs = fig6
    w0 = [r for r in runs if r["workload"] == "W0"]
    assert w0
    for r in w0:
        per_job = int(r["clusters"]) * 127
        assert int(r["oar_computed_configurations"]) % per_job == 0
        # every moldable job is evaluated at least once, in at least one pass
        assert int(r["oar_computed_configurations"]) >= per_job * int(r["moldable_apps"])
        assert int(r["enumeration_mismatches"]) == 0  # the launcher's pruned choice is OAR's exhaustive one
        assert int(r["moldable_apps"]) == round(0.2 * int(r["apps"]))


def test_fig6_message_sizes_stay_well_under_the_papers(fig6):
    rows, runs = fig6
    for nc in coorm_fig6.QUICK["clusters"]:
        assert float(_point(rows, "CooRM", "W0", str(nc), "bytes_per_app")["max"]) < 175_000
        assert float(_point(rows, "CooRM", "W2", str(nc), "bytes_per_app")["max"]) < 300_000
        # CooRM sends views, OAR-SIM does not: more data for CooRM (§IV-B)
        assert (float(_point(rows, "CooRM", "W0", str(nc), "bytes")["median"])
                > float(_point(rows, "OAR-SIM", "W0", str(nc), "bytes")["median"]))
    for r in runs:
        assert int(r["messages"]) > 0 and float(r["sim_cpu_s"]) > 0 and float(r["sched_cpu_s"]) > 0


def test_fig6_workload_trends(fig6):
    rows, _ = fig6
    for nc in map(str, coorm_fig6.QUICK["clusters"]):
        def med(w, metric, nc=nc):
            return float(_point(rows, "CooRM", w, nc, metric)["median"])

        # one CEM does not change much (W1 ~ W0); W2, half CEM, is the worst case; W3 packs well
        assert med("W1", "computed_configurations") <= 2 * med("W0", "computed_configurations") + 50
        assert med("W2", "computed_configurations") > med("W0", "computed_configurations")
        assert med("W2", "bytes") > med("W0", "bytes")
        assert med("W3", "computed_configurations") < med("W2", "computed_configurations")
        apps = int(_point(rows, "CooRM", "W3", nc, "computed_configurations")["apps"])
        assert med("W3", "computed_configurations") <= 1.25 * apps


# ======================================================================================================
# Fig. 7
# ======================================================================================================
def test_fig7_delay_below_fair_start_costs_about_nothing(fig7):
    rows, runs = fig7
    by = {float(r["delay"]): r for r in rows}
    assert set(by) == {float(d) for d in coorm_fig7.QUICK["delays"]}
    assert all(float(r["increase"]) == 0 for r in runs if float(r["delay"]) == 0)
    short = by[2.0]
    assert float(short["max"]) <= 30  # seconds, against CEM runs of 1000 s and more
    assert float(short["frac_over_10min"]) == 0


def test_fig7_delay_above_fair_start_hurts(fig7):
    rows, _ = fig7
    by = {float(r["delay"]): r for r in rows}
    long, short = by[10.0], by[2.0]
    assert float(long["mean"]) > float(short["mean"]) + 60
    assert float(long["max"]) > 600  # some instance loses more than ten minutes
    assert float(long["frac_delayed"]) > float(short["frac_delayed"])
    assert float(long["median"]) >= float(short["median"])


def test_fig7_quick_has_the_stored_shape_and_trend(fig7):
    rows, _ = fig7
    stored = stored_rows(coorm_fig7.NAME)
    assert_same_shape(rows, stored)
    for table in (rows, stored):
        by = {float(r["delay"]): r for r in table}
        assert float(by[10.0]["mean"]) > float(by[2.0]["mean"])
        assert float(by[10.0]["frac_delayed"]) > float(by[2.0]["frac_delayed"])
        for r in table:  # the interval holds its estimate
            assert float(r["mean_ci_lo"]) <= float(r["mean"]) <= float(r["mean_ci_hi"])
            assert float(r["frac_over_1h_ci_lo"]) <= float(r["frac_over_1h"]) <= float(r["frac_over_1h_ci_hi"])
    assert stored[0]["instances"] >= 60  # what resolves a 5% tail (EXPERIMENTS.md)


def test_fig7_instances_are_packs_times_three_positions():
    packs = coorm_fig7.instance_packs(coorm_fig7.FULL, 9)
    assert len(packs) == 3 and len(set(packs)) == 3
    assert coorm_fig7.instance_packs(coorm_fig7.QUICK) == [coorm_fig6.pack_numbers(4)[1]]
    with pytest.raises(ValueError):
        coorm_fig7.instance_packs(coorm_fig7.FULL, 2)


# ======================================================================================================
# §IV-C: the idle time of the fair-start
# ======================================================================================================
def test_fairstart_holds_idle_nodes_only_with_a_fair_start_and_more_for_short_jobs(fairstart):
    by = {(r["runtime_scale"], r["fair_start"]): r for r in fairstart}
    for scale in ("trace", "300 s"):
        assert by[(scale, 0.0)]["held_pct"] == 0 and by[(scale, 0.0)]["makespan_increase_pct"] == 0
        assert by[(scale, 30.0)]["held_pct"] > 0
        # never more than the paper's bound: every job's nodes held for the whole fair-start
        assert by[(scale, 30.0)]["held_per_work_pct"] <= by[(scale, 30.0)]["estimate_pct"]
    assert by[("300 s", 30.0)]["held_pct"] > 3 * by[("trace", 30.0)]["held_pct"]
    assert by[("300 s", 30.0)]["estimate_pct"] == pytest.approx(10.0)


def test_fairstart_quick_has_the_stored_shape_and_trend(fairstart):
    stored = stored_rows(coorm_fairstart_idle.NAME)
    assert_same_shape(fairstart, stored)
    for table in (fairstart, stored):
        by = {(r["runtime_scale"], r["fair_start"]): r for r in table}
        assert by[("300 s", 30.0)]["held_pct"] > by[("trace", 30.0)]["held_pct"] > 0


def test_the_held_node_meter_integrates_between_events():
    meter = coorm_fairstart_idle._NodeMeter()

    class _Sim:
        def __init__(self, now, states):
            self.now = now
            nodes = {str(i): type("N", (), {"state": st})() for i, st in enumerate(states)}
            self.cores = type("C", (), {"allocator": type("A", (), {"nodes": nodes})()})()

    meter(_Sim(0.0, ["held", "held", "allocated"]))
    meter(_Sim(10.0, ["free", "held", "allocated"]))
    meter(_Sim(15.0, ["free", "free", "free"]))
    assert meter.held_s == 2 * 10 + 1 * 5 and meter.allocated_s == 15
