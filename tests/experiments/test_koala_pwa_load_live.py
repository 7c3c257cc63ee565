"""``coorm experiment koala-pwa-load --live`` at its quick size, over ``coorm up`` (real nats-server, valkey,
services, node agents starting ``sleep`` on every node a job holds): KOALA's W'm jobs under EGS with precedence
to waiting applications, placed by the RMS, without and with other users' rigid jobs submitted straight to
their clusters; every job -- other users' too -- ends well."""

from __future__ import annotations

from coorm.experiments import koala_live
from coorm.experiments import koala_pwa_load as load


def test_the_quick_live_run(tmp_path):
    rows = load.run_live(tmp_path, quick=True)
    assert [(r["background"], r["policy"]) for r in rows] == [(x, "egs") for x in load.LIVE_LOADS]
    idle, busy = rows
    assert idle["background_jobs"] == 0 < busy["background_jobs"]
    for r in rows:
        assert r["jobs"] == r["malleable"] == koala_live.QUICK_JOBS  # W'm: all malleable
        assert r["finished"] == r["malleable"] and r["failed"] == 0  # (failed counts other users' jobs too)
        assert r["grows"] >= 1
    assert (tmp_path / f"{load.NAME}-live.csv").exists()
    assert "90 % (" in load.live_markdown(rows)
