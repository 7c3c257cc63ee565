"""``coorm experiment koala-pra --live`` at its quick size, over ``coorm up`` (real nats-server, valkey,
services, node agents starting ``sleep`` on every node a job holds): the simulated runs' launchers, placed by
the RMS by worst-fit, grow under EGS with precedence to running applications, and every
job ends well."""

from __future__ import annotations

from coorm.experiments import koala_live, koala_pra


def test_the_quick_live_run(tmp_path):
    (row,) = koala_live.run_live(koala_pra.NAME, "running", 120.0, tmp_path, quick=True, policies=("egs",))
    assert row["jobs"] == koala_live.QUICK_JOBS and row["malleable"] >= 1
    assert row["finished"] == row["malleable"] and row["failed"] == 0
    assert row["shrinks"] == 0  # PRA: what a running application holds stays its own
    assert row["grows"] >= 1 and row["max_size_mean"] > 2  # room to grow on the cluster worst-fit chose
    assert (tmp_path / "koala-pra-live.csv").exists()
