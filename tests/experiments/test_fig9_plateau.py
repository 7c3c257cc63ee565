"""``coorm experiment coormv2-fig9-plateau --quick``: Fig. 9's PSA waste stops changing where each profile's
pre-allocation first holds its largest need (two profiles, three overcommit factors, short profiles)."""

from __future__ import annotations

import pytest

from coorm.experiments import coormv2_fig9_plateau as plateau


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return plateau.run(tmp_path_factory.mktemp("plateau"), quick=True)


def test_the_waste_is_flat_from_where_the_pre_allocation_holds_the_largest_need(rows):
    seeds = [r for r in rows if r["row"] == "seed"]
    assert len(seeds) == len(plateau.QUICK["seeds"]) and not any(r["failed"] for r in seeds)
    for r in seeds:
        assert r["peak_ratio"] > 1  # the peak need is above the equivalent static allocation
        assert r["predicted_from"] is not None and r["observed_from"] is not None
        assert r["observed_from"] <= r["predicted_from"]
    assert plateau.NAME in plateau.markdown(rows)
