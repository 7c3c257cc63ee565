"""``coorm experiment koala-pwa-growth --live`` at its quick size, over ``coorm up`` (real nats-server, valkey,
services, node agents starting ``sleep`` on every node a job holds): KOALA's W'm jobs under EGS with precedence
to waiting applications, placed by the RMS, with the live passes and with a pass at most every 3 s (KOALA's
polling at the live speed-up); every job ends well, and polling does live what it does simulated: jobs wait
for a pass to start."""

from __future__ import annotations

from coorm.experiments import koala_live
from coorm.experiments import koala_pwa_growth as growth


def test_the_quick_live_run(tmp_path):
    rows = growth.run_live(tmp_path, quick=True)
    fast, slow = growth.live_intervals()
    assert fast < slow
    assert [(r["background"], r["poll_s"], r["policy"]) for r in rows] == [(0.0, fast, "egs"), (0.0, slow, "egs")]
    for r in rows:
        assert r["jobs"] == r["malleable"] == koala_live.QUICK_JOBS  # W'm: all malleable
        assert r["finished"] == r["malleable"] and r["failed"] == 0
        assert r["grows"] >= 1
    by = {r["poll_s"]: r for r in rows}
    assert by[slow]["wait_mean_s"] > by[fast]["wait_mean_s"]  # a start waits for a pass
    assert (tmp_path / f"{growth.NAME}-live.csv").exists()
    assert f"| {slow:g} | EGS |" in growth.live_markdown(rows)
