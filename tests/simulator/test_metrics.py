"""The simulator's metrics on job sets small enough to check by hand: every expected number below is
derived in the comments, not read off the code."""

from __future__ import annotations

import math

import pytest

from coorm.simulator.metrics import (
    JobRecord,
    Warmup,
    aggregate,
    bounded_slowdown,
    compute,
    confidence,
    extremes,
    job_usage,
    node_seconds,
    quantile,
    steps,
    t975,
)


def job(app: str, seq: int, submit: float, start: float | None, end: float | None, nodes: int, user: str = "",
        **kw) -> JobRecord:
    segments = ((start, end, nodes),) if start is not None and end is not None else ()
    return JobRecord(app=app, seq=seq, submit=submit, start=start, end=end, segments=segments, user=user,
                     nodes_requested=nodes, **kw)


# A 4-node platform:
#   A: submitted 0, runs 0-100 on 2 nodes (u1)     wait 0,  run 100, bsld max(100/100, 1) = 1,    turnaround 100
#   B: submitted 0, runs 0-50 on 2 nodes (u2)      wait 0,  run 50,  bsld 50/50 = 1,              turnaround 50
#   C: submitted 10, runs 50-55 on 2 nodes (u1)    wait 40, run 5,   bsld (40+5)/max(5,10) = 4.5, turnaround 45
#   D: submitted 20, runs 100-200 on 4 nodes (u2)  wait 80, run 100, bsld 180/100 = 1.8,          turnaround 180
JOBS = [
    job("A", 0, 0, 0, 100, 2, "u1"),
    job("B", 1, 0, 0, 50, 2, "u2"),
    job("C", 2, 10, 50, 55, 2, "u1"),
    job("D", 3, 20, 100, 200, 4, "u2"),
]


def test_bounded_slowdown_uses_a_10_s_threshold_and_never_goes_below_1():
    assert bounded_slowdown(20, 5) == 2.5  # (20 + 5) / max(5, 10)
    assert bounded_slowdown(30, 60) == 1.5  # 90 / 60
    assert bounded_slowdown(0, 5) == 1.0  # 5 / 10 = 0.5, bounded by 1
    assert bounded_slowdown(0, 0) == 1.0
    assert bounded_slowdown(5, 0) == 1.0  # 5 / 10
    assert bounded_slowdown(15, 0) == 1.5


def test_percentiles_interpolate_between_closest_ranks():
    assert quantile([3, 1, 2], 0.5) == 2
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    # 1..20: rank (20 - 1) * 0.95 = 18.05 -> x18 + 0.05 (x19 - x18) = 19 + 0.05
    assert quantile(range(1, 21), 0.95) == pytest.approx(19.05, abs=1e-12)
    assert quantile([0, 0, 40, 80], 0.95) == pytest.approx(74.0)  # rank 2.85: 40 + 0.85 * 40
    assert quantile([7.0], 0.95) == 7.0
    assert quantile([], 0.5) is None
    assert quantile([1, 2], 0) == 1 and quantile([1, 2], 1) == 2
    with pytest.raises(ValueError):
        quantile([1], 1.5)


def test_the_summary_of_four_jobs():
    m = compute(JOBS, capacity=4)
    assert (m["jobs"], m["measured"], m["warmup_excluded"], m["unfinished"], m["oversize"]) == (4, 4, 0, 0, 0)
    assert m["wait_mean"] == 30.0  # (0 + 0 + 40 + 80) / 4
    assert m["wait_median"] == 20.0  # (0 + 40) / 2
    assert m["wait_p95"] == pytest.approx(74.0)
    assert m["bsld_mean"] == pytest.approx(2.075)  # (1 + 1 + 4.5 + 1.8) / 4
    assert m["bsld_median"] == pytest.approx(1.4)  # (1 + 1.8) / 2
    assert m["turnaround_mean"] == 93.75  # (100 + 50 + 45 + 180) / 4
    assert m["window"] == [0, 200] and m["makespan"] == 200
    # node-seconds 200 + 100 + 10 + 400 = 710 over 4 nodes x 200 s
    assert m["utilisation"] == pytest.approx(710 / 800)
    u1, u2 = m["per_user"]["u1"], m["per_user"]["u2"]
    assert (u1["jobs"], u1["wait_mean"], u1["bsld_mean"], u1["turnaround_mean"], u1["node_seconds"]) == \
        (2, 20.0, 2.75, 72.5, 210.0)
    assert (u2["jobs"], u2["wait_mean"], u2["bsld_mean"], u2["turnaround_mean"], u2["node_seconds"]) == \
        (2, 40.0, pytest.approx(1.4), 115.0, 500.0)


def test_a_warm_up_of_jobs_leaves_out_the_first_ones_by_submit_time_and_starts_the_window_at_the_next():
    m = compute(JOBS, capacity=4, warmup=Warmup(jobs=2))
    assert (m["measured"], m["warmup_excluded"]) == (2, 2)  # A and B (submitted at 0) out; C and D in
    assert m["wait_mean"] == 60.0 and m["wait_median"] == 60.0  # (40 + 80) / 2
    assert m["window"] == [10, 200] and m["makespan"] == 190
    # the machine's work from 10 on, warm-up jobs included: A 2 x 90, B 2 x 40, C 2 x 5, D 4 x 100 = 670
    assert m["utilisation"] == pytest.approx(670 / (4 * 190))


def test_a_warm_up_in_seconds_leaves_out_the_jobs_submitted_before_it():
    m = compute(JOBS, capacity=4, warmup=Warmup(seconds=15))
    assert (m["measured"], m["warmup_excluded"]) == (1, 3)  # only D (submitted at 20)
    assert m["wait_mean"] == 80.0 and m["bsld_mean"] == pytest.approx(1.8)
    assert m["window"] == [15, 200]


def test_skipped_refused_and_unfinished_jobs_are_counted_not_measured():
    more = JOBS + [
        job("E", 4, 30, None, None, 9, oversize="skipped", state="skipped"),
        job("F", 5, 30, None, None, 9, oversize="refused", state="refused"),
        job("G", 6, 40, None, None, 1, state="waiting"),
        JobRecord(app="H", seq=7, submit=40, start=150, end=None, segments=((150, 200, 1),), state="unfinished"),
        JobRecord(app="S", seq=8, submit=0, start=0, end=None, segments=((0, 200, 0),), state="unfinished",
                  background=True),
    ]
    m = compute(more, capacity=4)
    assert (m["jobs"], m["measured"], m["unfinished"]) == (9, 4, 2)  # G and H; S is background work
    assert (m["oversize"], m["skipped"], m["refused"], m["capped"]) == (2, 1, 1, 0)
    assert m["wait_mean"] == 30.0 and m["makespan"] == 200
    assert m["utilisation"] == pytest.approx((710 + 50) / 800)  # H's 50 node-seconds count


def usage(segments: list[tuple[float, float, int]], start: float, end: float) -> tuple[int, int, float]:
    """The fewest and most nodes held at once, and the node-seconds: what the jobs CSV writes of them."""
    return (*extremes(steps(segments, start, end)), node_seconds(segments, start, end))


def test_nodes_over_time_of_an_evolving_and_a_malleable_job():
    # three NEXT phases handing over: 4, 12, then 2 nodes, 10 s each
    assert usage([(0, 10, 4), (10, 20, 12), (20, 30, 2)], 0, 30) == (2, 12, 180.0)
    # a malleable job with a gap: no node between 10 and 20
    assert usage([(0, 10, 2), (20, 30, 3)], 0, 30) == (0, 3, 50.0)
    # two overlapping pieces: 2 nodes, then 5, then 3
    assert usage([(0, 10, 2), (5, 15, 3)], 0, 15) == (2, 5, 50.0)
    assert usage([(0, 10, 2)], 5, 5) == (0, 0, 0.0)
    # the same as steps (the jobs CSV's nodes_over_time): a hand-over is no step, a gap is one to 0
    assert steps([(0, 10, 4), (10, 20, 12), (20, 30, 2)], 0, 30) == [(0, 4), (10, 12), (20, 2), (30, 0)]
    assert steps([(0, 10, 2), (20, 30, 3)], 0, 30) == [(0, 2), (10, 0), (20, 3), (30, 0)]
    assert steps([(0, 10, 2), (5, 15, 3)], 0, 15) == [(0, 2), (5, 5), (10, 3), (15, 0)]
    assert steps([(0, 10, 4), (10, 20, 4)], 0, 20) == [(0, 4), (20, 0)]
    assert steps([(0, 10, 2)], 5, 5) == []
    # a job's run: from its first start to its end; nothing if it never started
    malleable = JobRecord(app="m", seq=1, submit=0, start=5, end=30, segments=((5, 10, 2), (20, 30, 3)),
                          nodes_requested=2)
    assert job_usage(malleable) == (
        [(5, 2), (10, 0), (20, 3), (30, 0)], 40.0)
    assert job_usage(job("w", 1, 0, None, None, 2)) == ([], 0.0)


def test_the_confidence_interval_of_three_runs():
    m, ci = confidence([1.0, 2.0, 3.0])
    assert m == 2.0
    assert ci == pytest.approx(4.302652730 * 1.0 / math.sqrt(3))  # t(0.975, 2) x s / sqrt(n), s = 1
    assert confidence([5.0]) == (5.0, None)
    agg = aggregate([{"wait_mean": 10.0, "jobs": 4}, {"wait_mean": 20.0, "jobs": 4}, {"wait_mean": None, "jobs": 4}])
    # two runs: t(0.975, 1) = 12.706; s = sqrt(50); half-width 12.706 x sqrt(50) / sqrt(2) = 12.706 x 5
    assert agg["wait_mean"] == {"mean": 15.0, "ci95": pytest.approx(12.706204736 * 5), "min": 10.0, "max": 20.0,
                                "n": 2}
    assert agg["jobs"]["ci95"] == 0.0 and agg["jobs"]["n"] == 3


def test_student_t_quantiles():
    assert t975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t975(30) == pytest.approx(2.0423, abs=1e-4)
    assert t975(31) == pytest.approx(2.0395, abs=1e-4)  # past the table: the expansion
    assert t975(120) == pytest.approx(1.9799, abs=1e-4)
    assert t975(10**6) == pytest.approx(1.959964, abs=1e-5)  # the normal quantile
    values = [t975(df) for df in range(1, 200)]
    assert values == sorted(values, reverse=True)


def test_warm_up_parsing():
    assert Warmup.parse("100") == Warmup(jobs=100)
    assert Warmup.parse("3600s") == Warmup(seconds=3600.0)
    assert Warmup.parse("0") == Warmup() == Warmup.parse(None)
    for bad in ("ten", "-3", "5m"):
        with pytest.raises(ValueError):
            Warmup.parse(bad)
