"""``coorm experiment malleable-fraction`` at its quick size: the rows have the stored full run's shape, every
job finishes, the all-rigid replay is its own reference, malleable jobs wait less than rigid ones, the
negotiating model's turnaround beats the PSA model's at half malleable, and no replay beats the bound of a
job never faster than rigid."""

from __future__ import annotations

import shutil
from pathlib import Path

from coorm.experiments import malleable_fraction as mf
from tests.experiments.stored import assert_same_shape, stored_rows

# the trace's first 1,500 jobs, shipped: the quick run reads jobs 1,001-1,100, and a clean checkout has no
# copy of the Parallel Workloads Archive's (coorm trace fetch)
EXCERPT = Path(__file__).parent / "data" / "SDSC-SP2-1998-4.2-cln.first-1500.swf.gz"


def test_the_quick_run(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(EXCERPT, traces / f"{mf.TRACE}.swf.gz")  # (looked in after the cache: the whole log, if there)
    monkeypatch.setenv("COORM_TRACES", str(traces))
    rows = mf.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(mf.NAME))
    assert all(r["unfinished"] == 0 for r in rows)
    rigid = [r for r in rows if r["policy"] == "rigid"]
    assert rigid and all(r["turnaround_mean_vs_rigid_pct"] == 0 for r in rigid)
    for r in rows:
        if r["fraction"] == 1.0:  # every job malleable: each starts on the first free node
            assert r["wait_mean_vs_rigid_pct"] < 0, r
    assert {(r["model"], r["policy"], r["fraction"]) for r in rows} == {("-", "rigid", 0.0)} | {
        (m, p, f) for m in mf.MODELS for p in ("filling", "egs") for f in (0.5, 1.0)}
    # the negotiating model loses no work when it shrinks (the PSA reruns killed tasks): a lower mean turnaround
    by = {(r["model"], r["policy"], r["fraction"]): r for r in rows}
    for p in ("filling", "egs"):
        assert by["negotiating", p, 0.5]["turnaround_mean"] < by["psa", p, 0.5]["turnaround_mean"]
    # no malleable job runs faster than the rigid one on its nodes: no replay takes more off the mean turnaround
    # than the all-rigid replay's whole wait (the bound EXPERIMENTS.md reads the study's figures against)
    base = {r["seed"]: r for r in rigid}
    for r in rows:
        b = base[r["seed"]]
        assert r["turnaround_mean"] >= b["turnaround_mean"] - b["wait_mean"] - 1e-6, r
    assert (tmp_path / "malleable-fraction.csv").exists()
