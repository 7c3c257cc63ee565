"""``coorm experiment koala-pra-load --live`` at its quick size, over ``coorm up`` (real nats-server, valkey,
services, node agents starting ``sleep`` on every node a job holds): KOALA's W'm jobs under EGS with precedence
to running applications, placed by the RMS, without and with other users' rigid jobs submitted straight to
their clusters; every job -- other users' too -- ends well, and no malleable job is ever shrunk (PRA)."""

from __future__ import annotations

from coorm.experiments import koala_live
from coorm.experiments import koala_pra_load as pra


def test_the_quick_live_run(tmp_path):
    rows = pra.run_live(tmp_path, quick=True)
    assert [(r["background"], r["policy"], r["precedence"]) for r in rows] == [
        (x, "egs", "running") for x in pra.LIVE_LOADS]
    idle, busy = rows
    assert idle["background_jobs"] == 0 < busy["background_jobs"]
    for r in rows:
        assert r["jobs"] == r["malleable"] == koala_live.QUICK_JOBS  # W'm: all malleable
        assert r["finished"] == r["malleable"] and r["failed"] == 0  # (failed counts other users' jobs too)
        assert r["grows"] >= 1 and r["shrinks"] == 0
    assert (tmp_path / f"{pra.NAME}-live.csv").exists()
    assert "90 % (" in pra.live_markdown(rows)
