"""``coorm experiment koala-pwa-load`` at its quick size: KOALA's PWA runs with and without other users' rigid
jobs -- the rows have the stored full run's shape, every job ends, and the load does what a load does (the
platform busier, malleable jobs smaller); the background's generator offers the load it is asked for, and
draws apart from KOALA's jobs."""

from __future__ import annotations

from coorm.experiments import koala
from coorm.experiments import koala_pwa_load as load
from tests.experiments.stored import assert_same_shape, stored_rows


def test_the_quick_run(tmp_path):
    rows = load.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(load.NAME))
    assert all(r["unfinished"] == 0 for r in rows)
    by = {(r["background"], r["workload"], r["policy"]): r for r in rows}
    loads = sorted({r["background"] for r in rows})
    assert loads[0] == 0.0 and len(loads) == 2
    for w in koala.WORKLOADS:
        for p in koala.POLICIES:
            idle, busy = by[loads[0], w, p], by[loads[1], w, p]
            assert idle["background_offered_pct"] == 0 < busy["background_offered_pct"]
            assert busy["utilisation_pct"] > idle["utilisation_pct"]
            assert busy["avg_size"] < idle["avg_size"]
    text = load.markdown(rows)[load.NAME]
    assert all(f"{100 * x:.0f} % load:" in text for x in loads)
    assert (tmp_path / f"{load.NAME}.csv").exists()


def test_the_background_offers_the_load_asked_for():
    span = 200_000.0
    for share in (0.3, 0.9):
        jobs = koala.background_jobs(koala.DAS3, share, span, seed=7)
        assert all(0 <= at < span for at, _ in jobs)
        for cluster, nodes in koala.DAS3.items():
            offered = sum(j.nodes * j.runtime for _, j in jobs if j.cluster == cluster) / (nodes * span)
            # the run times are clipped to 30 s..1 h around their 10 min mean: a few percent below nominal
            assert 0.8 * share < offered < 1.1 * share, (cluster, offered)
    def times(seed: int) -> list[float]:
        return [at for at, _ in koala.background_jobs(koala.DAS3, 0.5, span, seed)]

    assert times(7) == times(7) != times(8)
