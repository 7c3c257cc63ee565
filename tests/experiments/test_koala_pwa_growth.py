"""``coorm experiment koala-pwa-growth`` at its quick size: KOALA's PWA runs (W'm) under FPSMA, EGS and EGS as
its Fig. 5 writes it (``egs-offer``), with a pass at most every second and at most every minute (KOALA's
polling), without and with other users' load -- the rows have the stored full run's shape, every job ends,
none is ended as a violator, polling does what polling does (fewer grow operations, later starts); and the
verdict names the cells where both of the paper's statements hold."""

from __future__ import annotations

from coorm.experiments import koala_pwa_growth as growth
from tests.experiments.stored import assert_same_shape, stored_rows


def test_the_quick_run(tmp_path):
    rows = growth.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(growth.NAME))
    jobs, _, polls, loads = growth.QUICK
    assert {(r["background"], r["poll_s"], r["policy"]) for r in rows} == {
        (load, poll, p) for load in loads for poll in polls for p in growth.POLICIES}
    assert all(r["unfinished"] == 0 and r["jobs"] == jobs for r in rows)
    assert all(r["violators"] == 0 for r in rows)  # no job that obeyed a mandatory shrink is ended for it
    by = {(r["background"], r["poll_s"], r["policy"]): r for r in rows}
    fast, slow = min(polls), max(polls)
    for load in loads:
        for p in growth.POLICIES:
            assert by[load, slow, p]["grows"] < by[load, fast, p]["grows"]
            assert by[load, slow, p]["wait_mean_s"] > by[load, fast, p]["wait_mean_s"]
    assert (tmp_path / f"{growth.NAME}.csv").exists()
    assert "| FPSMA |" in growth.markdown(rows)[growth.NAME]


def _row(load: float, poll: float, policy: str, stuck: float, near: float, response: float) -> dict:
    return {"background": load, "poll_s": poll, "policy": policy, "stuck_at_min_pct": stuck, "near_min_pct": near,
            "response_mean_s": response}


def test_the_verdict_names_the_cells_where_both_statements_hold():
    rows = [_row(0.0, 1.0, "fpsma", 20, 30, 200), _row(0.0, 1.0, "egs", 30, 20, 250),  # both hold
            _row(0.0, 1.0, "egs-offer", 30, 40, 190),  # more stuck, but a better response
            _row(0.9, 1.0, "fpsma", 20, 30, 200), _row(0.9, 1.0, "egs", 10, 20, 250)]
    assert growth.turned(rows) == ["0 % load, poll 1 s, EGS"]
    verdicts = dict(growth.trends(rows))
    assert verdicts["0 % load, poll 1 s, EGS-OFFER: a worse response time than FPSMA"] == "opposite"
    assert verdicts["90 % load, poll 1 s, EGS: more jobs stuck at their minimum than FPSMA"] == "opposite"
