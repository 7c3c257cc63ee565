"""``coorm experiment twin-cem-share --quick``: CooRM Fig. 8 across the share of CEM applications, each share
run live over the embedded system and simulated (about a minute a share)."""

from __future__ import annotations

import pytest

from coorm.experiments import twin_cem_share


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("cem")
    got = twin_cem_share.run(out, quick=True)
    assert (out / f"{twin_cem_share.NAME}.csv").exists() and (out / f"{twin_cem_share.NAME}.png").exists()
    return got


def test_each_share_is_run_live_and_simulated_with_its_cems(rows):
    runs = {r["share"]: r for r in rows if r["row"] == "run"}
    assert set(runs) == set(twin_cem_share.QUICK_SHARES)
    assert runs[0.0]["cems"] == 0 < runs[0.5]["cems"]
    assert all(r["live_failed"] == 0 for r in runs.values())
    for share in runs:
        fig8 = {(r["what"], r["model"]): r for r in rows if r["row"] == "fig8" and r["share"] == share}
        for model in ("instant", "calibrated"):
            assert fig8[("notification bytes", model)]["live"] > 0 and fig8[("notification bytes", model)]["sim"] > 0
            assert fig8[("CPU seconds", model)]["live"] > fig8[("CPU seconds", model)]["sim"] > 0
    assert twin_cem_share.NAME in twin_cem_share.markdown(rows)
