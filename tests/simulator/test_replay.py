"""Replaying SWF traces: the trace's own submit times by default (or jobs spaced as asked), jobs larger than
the platform skipped, capped or refused -- and counted --, malleable and evolving fractions, seeds and
repetitions. The small trace here is checked against a schedule worked out by hand."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from coorm.launchers.amr import AMRLauncher
from coorm.launchers.next_chain import NextChainLauncher
from coorm.launchers.psa import PSALauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.simulator.metrics import Warmup
from coorm.simulator.replay import ReplayError, ReplayOptions, parse_arrivals, plan
from coorm.simulator.run import run_once, run_repeats, run_scenario
from coorm.simulator.scenario import build_launchers, load
from coorm.simulator.trace import read_swf
from coorm.simulator.traces import SAMPLE, TraceError, locate

REPO = Path(__file__).resolve().parents[2]

# 4 nodes, one core each. Job 3 (8 processors) is larger than the platform; job 4 needs its whole walltime.
SWF = """\
; Version: 2.2
; MaxNodes: 4
; MaxProcs: 4
 1 1000 -1 100 2 -1 -1 2 200 -1 1 7 1 1 1 1 -1 -1
 2 1030 -1 50 4 -1 -1 4 100 -1 1 8 1 1 1 1 -1 -1
 3 1040 -1 20 8 -1 -1 8 100 -1 1 7 1 1 1 1 -1 -1
 4 1110 -1 30 1 -1 -1 1 30 -1 1 9 1 1 1 1 -1 -1
 5 1500 -1 10 3 -1 -1 3 60 -1 1 8 1 1 1 1 -1 -1
"""


def hand_scenario(tmp_path: Path, trace_extra: str = "") -> Path:
    (tmp_path / "t.swf").write_text(SWF)
    path = tmp_path / "s.yaml"
    path.write_text("clusters: {c0: 4}\npolicy: {fair_start: 0, reschedule_interval: 0}\n"
                    f"trace: {{file: t.swf, jobs: 10{trace_extra}}}\n")
    return path


def rows(run) -> dict[str, tuple]:
    return {j.job: (j.submit, j.start, j.end, j.state, j.oversize) for j in run.records}


def test_a_trace_is_replayed_at_its_own_submit_times_by_default(tmp_path):
    scenario = load(hand_scenario(tmp_path))
    assert [p.at for p in plan(scenario)] == [0, 30, 40, 110, 500]  # the log's times, the first at 0
    run = run_once(scenario)
    # by hand (conservative backfilling, rigid jobs): 1 runs 0-100; 2 (4 nodes) waits for it, 100-150;
    # 4 (1 node) waits for 2, 150-180, its walltime; 5 arrives on an idle machine
    assert rows(run) == {
        "1": (0, 0, 100, "completed", ""),
        "2": (30, 100, 150, "completed", ""),
        "3": (40, None, None, "skipped", "skipped"),
        "4": (110, 150, 180, "timeout", ""),
        "5": (500, 500, 510, "completed", ""),
    }
    m = run.metrics
    assert (m["jobs"], m["measured"], m["oversize"], m["skipped"]) == (5, 4, 1, 1)
    assert m["wait_mean"] == 27.5  # (0 + 70 + 40 + 0) / 4
    assert m["wait_median"] == 20.0  # sorted 0 0 40 70
    assert m["wait_p95"] == pytest.approx(65.5)  # rank 2.85: 40 + 0.85 x 30
    assert m["bsld_mean"] == pytest.approx((1 + 120 / 50 + 70 / 30 + 1) / 4)
    assert m["turnaround_mean"] == 75.0  # (100 + 120 + 70 + 10) / 4
    assert m["makespan"] == 510
    assert m["utilisation"] == pytest.approx((2 * 100 + 4 * 50 + 1 * 30 + 3 * 10) / (4 * 510))
    assert set(m["per_user"]) == {"7", "8", "9"} and m["per_user"]["8"]["jobs"] == 2


def test_jobs_spaced_as_asked_or_as_the_scenario_says(tmp_path):
    scenario = load(hand_scenario(tmp_path))
    assert [p.at for p in plan(scenario, ReplayOptions(arrivals="spaced:1"))] == [0, 1, 2, 3, 4]
    assert [p.at for p in plan(scenario, ReplayOptions(arrivals="trace"))] == [0, 30, 40, 110, 500]
    spaced = load(hand_scenario(tmp_path, ", arrival_interval: 2"))  # the scenario's explicit choice is kept
    assert [p.at for p in plan(spaced)] == [0, 2, 4, 6, 8]
    assert [p.at for p in plan(spaced, ReplayOptions(arrivals="trace"))] == [0, 30, 40, 110, 500]
    assert [p.at for p in plan(load(hand_scenario(tmp_path, ", arrival_interval: null")))] == [0, 30, 40, 110, 500]
    assert parse_arrivals("spaced") == 1.0 and parse_arrivals("spaced:0.5") == 0.5
    for bad in ("spaced:-1", "spaced:x", "uniform", "spaced:inf"):
        with pytest.raises(ValueError):
            parse_arrivals(bad)


def test_oversize_jobs_capped_run_on_the_whole_platform(tmp_path):
    run = run_once(load(hand_scenario(tmp_path)), ReplayOptions(oversize="cap"))
    # 3 capped to 4 nodes runs after 2 (150-170); 4 then waits for it: 170-200
    assert rows(run) == {
        "1": (0, 0, 100, "completed", ""),
        "2": (30, 100, 150, "completed", ""),
        "3": (40, 150, 170, "completed", "capped"),
        "4": (110, 170, 200, "timeout", ""),
        "5": (500, 500, 510, "completed", ""),
    }
    job3 = next(j for j in run.records if j.job == "3")
    assert job3.nodes_requested == 8 and job3.segments == ((150, 170, 4),)
    m = run.metrics
    assert (m["measured"], m["oversize"], m["capped"], m["skipped"], m["refused"]) == (5, 1, 1, 0, 0)
    assert m["wait_mean"] == 48.0  # (0 + 70 + 110 + 60 + 0) / 5


def test_oversize_jobs_refused_by_the_policy_core(tmp_path):
    run = run_once(load(hand_scenario(tmp_path)), ReplayOptions(oversize="refuse"))
    assert rows(run)["3"] == (40, None, None, "refused", "refused")
    assert [r[1] for r in run.result.rejections] == ["too_large"]  # the core's own refusal
    assert {k: v for k, v in rows(run).items() if k != "3"} == {
        "1": (0, 0, 100, "completed", ""),
        "2": (30, 100, 150, "completed", ""),
        "4": (110, 150, 180, "timeout", ""),
        "5": (500, 500, 510, "completed", ""),
    }
    m = run.metrics
    assert (m["measured"], m["oversize"], m["refused"], m["skipped"], m["unfinished"]) == (4, 1, 1, 0, 0)
    assert m["wait_mean"] == 27.5


def test_the_jobs_csv_and_the_json_files(tmp_path):
    out = tmp_path / "out"
    summary = run_scenario(load(hand_scenario(tmp_path)), out, warmup=Warmup(jobs=1), jobs_csv=out / "jobs.csv",
                           plots=False)
    with (out / "jobs.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["job"] for r in table] == ["1", "2", "3", "4", "5"]
    two = table[1]
    assert {k: two[k] for k in ("user", "submit", "start", "end", "wait", "run_time", "turnaround", "nodes_requested",
                                "nodes_min", "nodes_max", "node_seconds", "bounded_slowdown", "state", "measured")} \
        == {"user": "8", "submit": "30", "start": "100", "end": "150", "wait": "70", "run_time": "50",
            "turnaround": "120", "nodes_requested": "4", "nodes_min": "4", "nodes_max": "4", "node_seconds": "200",
            "bounded_slowdown": "2.4", "state": "completed", "measured": "1"}
    assert two["nodes_over_time"] == "100:4 150:0"
    assert table[0]["measured"] == "0"  # the warm-up job
    assert table[2]["state"] == "skipped" and table[2]["start"] == "" and table[2]["oversize"] == "skipped"
    assert summary["metrics"]["wait_mean"] == pytest.approx(110 / 3)  # 70, 40, 0
    import json

    doc = json.loads((out / "metrics.json").read_text())
    assert doc["replay"]["arrivals"] == "trace" and doc["replay"]["oversize"] == "skip"
    assert doc["warmup"] == "1 job" and doc["runs"][0]["metrics"]["measured"] == 3
    assert json.loads((out / "summary.json").read_text())["metrics"]["oversize"] == 1


def test_the_shipped_sample_keeps_its_submit_times_and_counts_its_oversize_jobs(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"clusters: {{c0: 128}}\ntrace: {{file: {SAMPLE}, jobs: 200, skip: 200}}\n")
    scenario = load(path)
    jobs, _ = read_swf(SAMPLE, skip=200, count=200)
    big = [j for j in jobs if j.nodes > 128]
    assert len(big) == 37  # Atlas's 8-core nodes: 37 of these 200 jobs ask for more than 1024 cores
    planned = plan(scenario)
    assert [p.at for p in planned] == [j.submit - jobs[0].submit for j in jobs]
    assert max(p.at for p in planned) > 100_000  # not one a second
    run = run_once(scenario, jobs=jobs)
    assert run.metrics["oversize"] == run.metrics["skipped"] == 37
    assert {j.job for j in run.records if j.state == "skipped"} == {str(j.id) for j in big}
    assert all(j.state in ("completed", "timeout") for j in run.records if j.state != "skipped")
    capped = run_once(scenario, ReplayOptions(oversize="cap"), jobs=jobs)
    assert capped.metrics["capped"] == 37 and capped.metrics["measured"] == 200
    assert max(max(n for _, _, n in j.segments) for j in capped.records) == 128


def test_a_trace_with_real_arrivals_is_replayed_at_them(tmp_path):
    try:
        kth = locate("KTH-SP2-1996-2.1-cln")
    except TraceError:
        pytest.skip("the KTH trace is not here (coorm trace fetch KTH-SP2-1996-2.1-cln)")
    path = tmp_path / "s.yaml"
    path.write_text(f"clusters: {{c0: 100}}\ntrace: {{file: {kth}, jobs: 60, skip: 1000}}\n")
    jobs, _ = read_swf(kth, skip=1000, count=60)
    run = run_once(load(path), jobs=jobs)
    assert [j.submit for j in run.records] == [j.submit - jobs[0].submit for j in jobs]
    assert run.metrics["oversize"] == 0 and run.metrics["measured"] == 60
    assert all(j.wait is not None and j.wait >= 0 for j in run.records)


def test_with_the_old_choices_the_launchers_are_the_scenario_modules_own():
    scenario = load(REPO / "scenarios" / "sample-w0.yaml")  # arrival_interval 1, moldable_fraction 0.2
    old = build_launchers(scenario)
    new = plan(scenario, ReplayOptions(oversize="cap"))
    assert len(old) == len(new) == 200
    for (at, launcher, name), p in zip(old, new, strict=True):
        assert (at, name, type(launcher), vars(launcher)) == (p.at, p.name, type(p.launcher), vars(p.launcher))
    # skipping takes the same draws: the other jobs are the same
    skipped = plan(scenario)
    for (_, launcher, _), p in zip(old, skipped, strict=True):
        if p.launcher is not None:
            assert vars(launcher) == vars(p.launcher)


def _sample_scenario(tmp_path: Path, jobs: int = 60) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text("clusters: {c0: 128, c1: 128}\npolicy: {fair_start: 5, reschedule_interval: 1}\n"
                    f"trace: {{file: {SAMPLE}, jobs: {jobs}, skip: 0, moldable_fraction: 0.2, seed: 3}}\n")
    return path


def test_a_seeded_fraction_of_the_jobs_made_malleable_or_evolving(tmp_path):
    scenario = load(_sample_scenario(tmp_path))
    options = ReplayOptions(malleable_fraction=0.2, evolving_fraction=0.1)
    planned = plan(scenario, options)
    submitted = [p for p in planned if p.launcher is not None]
    kinds = [p.launcher.kind for p in submitted]
    assert kinds.count("psa") == round(0.2 * len(submitted)) and kinds.count("next") == round(0.1 * len(submitted))
    again = plan(scenario, options)
    assert [p.launcher.kind if p.launcher else None for p in again] == \
        [p.launcher.kind if p.launcher else None for p in planned]
    other = plan(scenario, ReplayOptions(malleable_fraction=0.2, evolving_fraction=0.1, seed=4))
    assert [p.app for p in other if p.launcher and p.launcher.kind == "psa"] != \
        [p.app for p in planned if p.launcher and p.launcher.kind == "psa"]
    rigid = {p.app: p.launcher for p in plan(scenario) if isinstance(p.launcher, RigidLauncher)}
    for p in submitted:
        if isinstance(p.launcher, PSALauncher):  # the rigid job's work as single-node tasks of its run time
            r = rigid[p.app]
            assert (p.launcher.total_tasks, p.launcher.task_duration, p.launcher.background) == \
                (r.nodes, r.runtime, False)
        elif isinstance(p.launcher, NextChainLauncher):  # phases of the run time; its peak is the job's size
            r = rigid[p.app]
            assert 2 <= len(p.launcher.phases) <= 4
            assert max(n for n, _ in p.launcher.phases) == r.nodes
            assert math.fsum(d for _, d in p.launcher.phases) == pytest.approx(max(r.runtime, len(p.launcher.phases)))
    run = run_once(scenario, options)
    by_kind: dict[str, set[str]] = {}
    for j in run.records:
        by_kind.setdefault(j.kind, set()).add(j.state)
    assert by_kind["psa"] == {"completed"} and by_kind["next"] == {"completed"}
    for j in run.records:
        p = next(q for q in planned if q.app == j.app)
        if isinstance(p.launcher, PSALauncher):  # every task ran (a killed one ran again): at least the work
            assert j.segments and sum((e - s) * n for s, e, n in j.segments) >= \
                p.launcher.total_tasks * p.launcher.task_duration - 1e-6
    with pytest.raises(ReplayError):
        plan(scenario, ReplayOptions(malleable_fraction=0.6, evolving_fraction=0.4))  # more than the rigid jobs


def test_repetitions_over_seeds_give_a_mean_and_its_confidence_interval(tmp_path):
    scenario = load(_sample_scenario(tmp_path, jobs=40))
    doc = run_repeats(scenario, 3, seed=10, options=ReplayOptions(arrivals="spaced:1", oversize="cap"),
                      out=tmp_path / "out", jobs_csv=tmp_path / "jobs.csv")
    assert doc["seeds"] == [10, 11, 12] and [r["seed"] for r in doc["runs"]] == [10, 11, 12]
    waits = [r["metrics"]["wait_mean"] for r in doc["runs"]]
    assert len(set(waits)) > 1  # the seeds change the draws (moldable jobs, clusters)
    agg = doc["aggregate"]["wait_mean"]
    mean = sum(waits) / 3
    sd = math.sqrt(sum((w - mean) ** 2 for w in waits) / 2)
    assert agg["mean"] == pytest.approx(mean, abs=1e-5) and agg["n"] == 3
    assert agg["ci95"] == pytest.approx(4.302652730 * sd / math.sqrt(3), abs=1e-5)
    assert sorted((tmp_path / "out").glob("seed-*/summary.json")) == \
        [tmp_path / "out" / f"seed-{s}" / "summary.json" for s in (10, 11, 12)]
    with (tmp_path / "jobs.csv").open() as f:
        assert sorted({r["seed"] for r in csv.DictReader(f)}) == ["10", "11", "12"]
    # the same seed, the same run
    one = run_once(scenario, ReplayOptions(arrivals="spaced:1", oversize="cap", seed=11))
    assert one.metrics["wait_mean"] == pytest.approx(waits[1], abs=1e-5)


def test_a_seed_moves_every_amr_applications_seed_too(tmp_path):
    (tmp_path / "t.swf").write_text(SWF)
    path = tmp_path / "s.yaml"
    path.write_text("clusters: {c0: 4}\napps:\n  - {kind: amr, cluster: c0, seed: 5, steps: 10}\n"
                    "trace: {file: t.swf, seed: 1}\n")
    scenario = load(path)
    assert plan(scenario)[0].launcher.seed == 5  # no seed given: the scenario as written
    amr = plan(scenario, ReplayOptions(seed=3))[0].launcher
    assert isinstance(amr, AMRLauncher) and amr.seed == 7  # the trace's seed moved from 1 to 3: so does it


def test_malleable_jobs_as_the_negotiating_launcher(tmp_path):
    """``--malleable-model negotiating``: the same jobs as the PSA model chooses, each the shipped negotiating
    launcher with the rigid job's work (nodes x run time), from a quarter of its nodes to all of them; the
    replay completes every job."""
    from coorm.launchers.malleable import MalleableLauncher

    scenario = load(_sample_scenario(tmp_path))
    psa = plan(scenario, ReplayOptions(malleable_fraction=0.3))
    neg = plan(scenario, ReplayOptions(malleable_fraction=0.3, malleable_model="negotiating"))
    rigid = {p.app: p.launcher for p in plan(scenario) if isinstance(p.launcher, RigidLauncher)}
    chosen = [p.app for p in psa if isinstance(p.launcher, PSALauncher)]
    assert chosen and [p.app for p in neg if isinstance(p.launcher, MalleableLauncher)] == chosen
    for p in neg:
        if isinstance(p.launcher, MalleableLauncher):
            r = rigid[p.app]
            assert (p.launcher.min_nodes, p.launcher.max_nodes) == (math.ceil(r.nodes / 4), r.nodes)
            assert p.launcher.work == pytest.approx(r.nodes * r.runtime)
    run = run_once(scenario, ReplayOptions(malleable_fraction=0.3, malleable_model="negotiating"))
    assert run.metrics["unfinished"] == 0
    with pytest.raises(ValueError, match="malleable model"):
        ReplayOptions(malleable_model="elastic")
