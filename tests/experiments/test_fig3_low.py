"""``coorm experiment coormv2-fig3-low --quick``: CooRMv2 Fig. 3's increase at low targets against the
profiles' unevenness -- the rows have the stored run's columns, the increase follows the unevenness, and
cutting off the near-zero start lowers it (each can fail: a generator whose start were not the cause, or an
increase not driven by the unevenness, would break them)."""

from __future__ import annotations

from coorm.experiments import coormv2_fig3_low as fig3_low
from tests.experiments.stored import assert_same_shape, stored_rows


def test_quick_rows_have_the_stored_columns_and_the_increase_follows_the_unevenness(tmp_path):
    rows = fig3_low.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(fig3_low.NAME))
    for r in rows:
        assert r["correlation"] > 0.9 and r["slope"] > 0
        assert r["cut_median"] < r["increase_median"] and r["cut_unevenness_median"] < r["unevenness_median"]
    low, high = rows[0], rows[-1]
    assert low["target_efficiency"] < high["target_efficiency"] and low["increase_median"] > high["increase_median"]


def test_unevenness_is_zero_for_a_flat_profile_and_the_start_is_cut_where_it_reaches_the_fraction():
    assert fig3_low.unevenness([4.0] * 10) == 0.0
    assert fig3_low.without_start([1.0, 2.0, 60.0, 100.0, 3.0], 0.05) == [60.0, 100.0, 3.0]
