"""``coorm experiment koala-pra-load`` at its quick size: KOALA's PRA runs 30 s apart with and without other
users' rigid jobs -- the rows have the stored full run's shape, every job ends, no malleable job is ever
shrunk (PRA), the load does what a load does (malleable jobs smaller and longer), and EGS grows jobs at least
as often as FPSMA under it."""

from __future__ import annotations

from coorm.experiments import koala
from coorm.experiments import koala_pra_load as pra
from tests.experiments.stored import assert_same_shape, stored_rows


def test_the_quick_run(tmp_path):
    rows = pra.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(pra.NAME))
    assert all(r["unfinished"] == 0 and r["shrinks"] == 0 and r["precedence"] == "running" for r in rows)
    by = {(r["background"], r["workload"], r["policy"]): r for r in rows}
    loads = sorted({r["background"] for r in rows})
    assert loads == [0.0, 0.9]
    for w in koala.WORKLOADS:
        for p in koala.POLICIES:
            idle, busy = by[0.0, w, p], by[0.9, w, p]
            assert idle["background_offered_pct"] == 0 < busy["background_offered_pct"]
            assert busy["avg_size"] < idle["avg_size"] and busy["exec_mean_s"] > idle["exec_mean_s"]
        # the paper's trend that the load brings out: EGS grows jobs at least as often as FPSMA
        assert by[0.9, w, "egs"]["grows"] >= by[0.9, w, "fpsma"]["grows"]
    text = pra.markdown(rows)[pra.NAME]
    assert "- 0 % load: " in text and "- 90 % load: " in text and "no job is shrunk (PRA)" in text
    assert (tmp_path / f"{pra.NAME}.csv").exists()


def test_several_inter_arrivals_get_a_column_and_their_own_checks():
    stored = stored_rows(pra.NAME)
    assert sorted({r["interarrival_s"] for r in stored}) == [30.0, 120.0]
    text = pra.markdown(stored)[pra.NAME]
    assert "| inter-arrival (s) |" in text
    assert "- 120 s apart, 0 % load: " in text and "- 30 s apart, 90 % load: " in text
