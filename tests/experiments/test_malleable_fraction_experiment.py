"""``coorm experiment malleable-fraction`` at its quick size: the rows have the stored full run's shape, every
job finishes, the all-rigid replay is its own reference, and malleable jobs wait less than rigid ones."""

from __future__ import annotations

from coorm.experiments import malleable_fraction as mf
from tests.experiments.stored import assert_same_shape, stored_rows


def test_the_quick_run(tmp_path):
    rows = mf.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(mf.NAME))
    assert all(r["unfinished"] == 0 for r in rows)
    rigid = [r for r in rows if r["policy"] == "rigid"]
    assert rigid and all(r["turnaround_mean_vs_rigid_pct"] == 0 for r in rigid)
    for r in rows:
        if r["fraction"] == 1.0:  # every job malleable: each starts on the first free node
            assert r["wait_mean_vs_rigid_pct"] < 0, r
    assert {(r["policy"], r["fraction"]) for r in rows} == {("rigid", 0.0)} | {
        (p, f) for p in ("filling", "egs") for f in (0.5, 1.0)}
    assert (tmp_path / "malleable-fraction.csv").exists()
