"""``coorm experiment twin --quick``: the quick scenario live over the embedded system (nats-server, valkey,
the services, node agents starting real processes) and simulated, compared. One live run (~45 s) feeds every
check: every application matched by id in both halves, the delays measured, and the calibrated simulator's
starts closer to the live ones than the papers' instant simulator's."""

from __future__ import annotations

import pytest

from coorm.experiments import twin
from coorm.experiments.twin_workload import workload


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("twin")
    got = twin.run(out, quick=True)
    assert (out / "twin.csv").exists() and (out / "twin.png").exists()
    return got


def _diff(rows, what, model):
    return next(r for r in rows if r["row"] == "diff" and r["what"] == what and r["model"] == model)


def test_every_application_ran_live_and_is_matched_by_id_in_both_halves(rows):
    apps = [r for r in rows if r["row"] == "app"]
    assert [a["name"] for a in apps] == [s.name for s in workload(quick=True)]
    assert all(a["live_ok"] for a in apps), [a["name"] for a in apps if not a["live_ok"]]
    for a in apps:  # each row holds the same application's figures from the three runs
        for m in ("live", *twin.MODELS):
            assert a[f"{m}_start"] is not None and a[f"{m}_start"] >= a["arrived"], (a["name"], m)
            assert a[f"{m}_notes"] >= 1
        assert a["kind"] == "psa" or a["live_end"] > a["live_start"]


def test_the_delays_are_measured_on_the_live_system(rows):
    delays = {r["delay"]: r for r in rows if r["row"] == "delay"}
    for name in ("notify", "command", "launch", "work_overhead", "open", "views"):
        assert delays[name]["n"] > 0 and delays[name]["median"] >= -0.05, name
    assert delays["notify"]["used"] == pytest.approx(max(0.0, delays["notify"]["mean"]), abs=1e-3)


def test_the_calibrated_simulator_starts_applications_closer_to_the_live_system(rows):
    """Until the schedules fork (an adaptive launcher chooses differently, two applications start in the other
    order), both halves run the same schedule, and there the calibrated delays must bring the starts closer
    than the instant RMS does."""
    instant, calibrated = _diff(rows, twin.FORK, "instant"), _diff(rows, twin.FORK, "calibrated")
    assert calibrated["n"] >= 4
    assert calibrated["median"] < instant["median"]
    assert calibrated["p95"] <= instant["p95"]
    run = next(r for r in rows if r["row"] == "run")
    assert run["holds"] == (_diff(rows, "start (s)", "calibrated")["p95"] <= twin.TOLERANCE_P95_START)


def test_fig8_compares_traffic_and_cpu(rows):
    fig8 = {(r["what"], r["model"]): r for r in rows if r["row"] == "fig8"}
    for model in twin.MODELS:
        assert fig8[("notification bytes", model)]["live"] > 0 and fig8[("notification bytes", model)]["sim"] > 0
        assert fig8[("CPU seconds", model)]["live"] > fig8[("CPU seconds", model)]["sim"] > 0
    blocks = twin.markdown(rows)
    assert set(blocks) == {"twin-summary", "twin-diffs", "twin-fig8", "twin-apps"}
