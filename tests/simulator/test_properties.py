"""Invariants of the simulator's metrics: over any job set (pure), and over random traces replayed through
the real cores (waits are never negative, no instant uses more nodes than the platform has, utilisation is
at most 1, the metrics do not depend on the order of the jobs)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.simulator.metrics import JobRecord, Warmup, compute
from coorm.simulator.replay import ReplayOptions
from coorm.simulator.run import run_once
from coorm.simulator.scenario import load

times = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def job_sets(draw) -> list[JobRecord]:
    out = []
    for i in range(draw(st.integers(0, 25))):
        submit = draw(times)
        state = draw(st.sampled_from(["completed", "completed", "timeout", "unfinished", "waiting", "skipped"]))
        start = end = None
        segments: tuple[tuple[float, float, int], ...] = ()
        if state in ("completed", "timeout", "unfinished"):
            start = submit + draw(times)
            stop = start + draw(times)
            end = stop if state != "unfinished" else None
            segments = ((start, stop, draw(st.integers(1, 8))),)
        out.append(JobRecord(app=f"a{i}", seq=i, submit=submit, start=start, end=end, segments=segments, state=state,
                             user=draw(st.sampled_from(["", "1", "2", "alice"])),
                             oversize="skipped" if state == "skipped" else ""))
    return out


warmups = st.one_of(st.just(Warmup()), st.builds(Warmup, jobs=st.integers(1, 10)),
                    st.builds(Warmup, seconds=st.floats(1, 1e5)))


@given(job_sets(), warmups, st.randoms(use_true_random=False))
def test_metrics_do_not_depend_on_the_order_of_the_jobs(jobs, warmup, rnd):
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    assert compute(shuffled, 8, warmup) == compute(jobs, 8, warmup)


@given(job_sets(), warmups)
def test_metrics_are_ordered_as_their_definitions_say(jobs, warmup):
    m = compute(jobs, 8, warmup)
    if m["measured"]:
        assert 0 <= m["wait_median"] <= m["wait_p95"]
        assert m["wait_mean"] >= 0 and m["turnaround_mean"] >= m["wait_mean"] - 1e-6
        assert m["bsld_mean"] >= 1 and m["bsld_median"] >= 1
        assert sum(u["jobs"] for u in m["per_user"].values()) == m["measured"]
    else:
        assert m["wait_mean"] is None and m["per_user"] == {}
    assert m["measured"] + m["warmup_excluded"] <= m["jobs"] - m["skipped"]


@st.composite
def traces(draw) -> tuple[list[int], list[str]]:
    clusters = draw(st.lists(st.integers(1, 8), min_size=1, max_size=2))
    lines, t = [], 1000
    for i in range(draw(st.integers(1, 12))):
        t += draw(st.integers(0, 300))
        runtime = draw(st.integers(1, 400))
        walltime = draw(st.one_of(st.just(-1), st.integers(1, 600)))
        nodes = draw(st.integers(1, max(clusters) + 2))  # some larger than the platform
        user = draw(st.integers(1, 3))
        lines.append(f"{i + 1} {t} -1 {runtime} {nodes} -1 -1 {nodes} {walltime} -1 1 {user} 1 1 1 1 -1 -1")
    return clusters, lines


@settings(max_examples=150)
@given(traces(), st.sampled_from(["skip", "cap", "refuse"]), st.sampled_from([None, "spaced:5"]),
       st.integers(0, 3))
def test_replaying_any_trace_keeps_the_invariants(trace, oversize, arrivals, warm):
    sizes, lines = trace
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "t.swf").write_text("; MaxNodes: 1\n; MaxProcs: 1\n" + "\n".join(lines) + "\n")
        clusters = ", ".join(f"c{i}: {n}" for i, n in enumerate(sizes))
        (folder / "s.yaml").write_text(f"clusters: {{{clusters}}}\npolicy: {{fair_start: 0}}\n"
                                       "trace: {file: t.swf, jobs: 100}\n")
        scenario = load(folder / "s.yaml")
        run = run_once(scenario, ReplayOptions(oversize=oversize, arrivals=arrivals), Warmup(jobs=warm))
    capacity, biggest = sum(sizes), max(sizes)
    submits = [int(line.split()[1]) for line in lines]
    asked = [int(line.split()[4]) for line in lines]
    # arrivals: the trace's own times from 0, or 5 s apart
    expected = [s - submits[0] for s in submits] if arrivals is None else [5.0 * k for k in range(len(lines))]
    assert [j.submit for j in run.records] == expected
    # jobs larger than the platform are all counted, and dealt with as asked
    big = [j for j, n in zip(run.records, asked, strict=True) if n > biggest]
    assert run.metrics["oversize"] == len(big)
    assert {j.state for j in big} <= {"skip": {"skipped"}, "refuse": {"refused"},
                                      "cap": {"completed", "timeout"}}[oversize]
    deltas: dict[float, int] = {}
    for j in run.records:
        if j.state in ("skipped", "refused"):
            assert j.start is None and not j.segments
            continue
        assert j.state in ("completed", "timeout")  # rigid jobs that fit all run to their end
        assert j.wait >= 0 and j.run_time >= 0 and j.bounded_slowdown >= 1
        assert max(n for _, _, n in j.segments) <= min(j.nodes_requested, biggest)
        for s, e, n in j.segments:
            deltas[s] = deltas.get(s, 0) + n
            deltas[e] = deltas.get(e, 0) - n
    level = 0
    for t in sorted(deltas):
        level += deltas[t]
        assert 0 <= level <= capacity
    m = run.metrics
    if m["utilisation"] is not None:
        assert 0 <= m["utilisation"] <= 1 + 1e-9
    shuffled = list(run.records)
    random.Random(len(lines)).shuffle(shuffled)
    assert compute(shuffled, capacity, Warmup(jobs=warm)) == m
