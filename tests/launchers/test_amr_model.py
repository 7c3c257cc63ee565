"""The AMR model of CooRMv2 §II: working-set profiles, the speed-up model, n_eq, Fig. 3 and Fig. 4."""

from __future__ import annotations

import math

import pytest

from coorm.launchers import amr_model as m

SEEDS = range(10)


# -- working set (§II-A) ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_profile_is_normalised_to_1000_and_stays_positive(seed):
    s = m.normalised_profile(seed)
    assert len(s) == 1000
    assert max(s) == 1000.0
    assert min(s) >= m.S_FLOOR > 0


@pytest.mark.parametrize("seed", range(20))
def test_profile_is_mostly_increasing(seed):
    s = m.normalised_profile(seed)
    peak, worst_drop = 0.0, 0.0
    for x in s:
        worst_drop = max(worst_drop, peak - x)
        peak = max(peak, x)
    assert worst_drop < 60  # noise only: never more than 6% below what it reached already
    first, last = sum(s[:100]) / 100, sum(s[-100:]) / 100
    assert last > 800 and last > 5 * first


def test_profile_has_regions_of_sudden_increase_and_of_constancy():
    s = m.normalised_profile(0)
    smooth = [sum(s[i : i + 20]) / 20 for i in range(0, 1000, 20)]  # 50 blocks of 20 steps
    rises = [b - a for a, b in zip(smooth, smooth[1:], strict=False)]
    assert max(rises) > 2.5 * (smooth[-1] - smooth[0]) / len(rises)  # a sudden increase
    assert max(rises) > 40  # 4% of the peak in 20 steps
    assert sum(1 for r in rises if abs(r) < 5) >= 5  # and flat stretches


def test_profile_is_deterministic_per_seed():
    assert m.normalised_profile(7) == m.normalised_profile(7)
    assert m.normalised_profile(7) != m.normalised_profile(8)
    assert m.working_set(3, steps=50) == m.working_set(3, steps=50)


def test_working_set_peaks_at_smax():
    sizes = m.working_set(1)
    assert max(sizes) == pytest.approx(m.SMAX_MIB)
    assert m.SMAX_MIB == pytest.approx(3.16 * 1024 * 1024)
    assert max(m.working_set(1, smax_mib=1000.0)) == pytest.approx(1000.0)


def test_short_profiles_are_still_normalised():
    for steps in (1, 2, 100):
        s = m.normalised_profile(5, steps)
        assert len(s) == steps and max(s) == 1000.0 and min(s) >= m.S_FLOOR


# -- speed-up (§II-B) ---------------------------------------------------------------------------------
def test_step_time_values():
    assert m.step_time(1, 0.0) == pytest.approx(1.23e-4 + 1.38)
    assert m.step_time(10, 1000.0) == pytest.approx(0.726 + 1.23e-3 + 1.13e-3 + 1.38)
    assert m.step_time(1000, m.SMAX_MIB) == pytest.approx(
        7.26e-3 * m.SMAX_MIB / 1000 + 0.123 + 1.13e-6 * m.SMAX_MIB + 1.38
    )
    with pytest.raises(ValueError):
        m.step_time(0, 10.0)


@pytest.mark.parametrize("size", [0.0, 1e3, 1e5, m.SMAX_MIB])
def test_efficiency_is_one_on_one_node_and_falls_with_nodes(size):
    assert m.efficiency(1, size) == pytest.approx(1.0)
    effs = [m.efficiency(n, size) for n in range(1, 3000, 7)]
    assert all(a > b for a, b in zip(effs, effs[1:], strict=False))


@pytest.mark.parametrize("size", [0.0, 5e3, 2e5, 1e6, m.SMAX_MIB])
@pytest.mark.parametrize("target", [0.3, 0.5, 0.75, 0.9, 1.0])
def test_nodes_for_efficiency_is_the_largest_count_meeting_the_target(size, target):
    n = m.nodes_for_efficiency(size, target)
    assert n >= 1
    assert m.efficiency(n, size) >= target
    assert m.efficiency(n + 1, size) < target


def test_nodes_for_efficiency_at_the_peak():
    assert m.nodes_for_efficiency(m.SMAX_MIB, 0.75) == 1511
    assert m.nodes_for_efficiency(m.SMAX_MIB, 0.8) == 1143
    assert m.nodes_for_efficiency(0.0, 0.75) == 1  # a tiny step runs on one node
    with pytest.raises(ValueError):
        m.nodes_for_efficiency(1e5, 0.0)


def test_area_and_run_time_of_a_dynamic_allocation():
    sizes = [1e4, 1e5, 1e6]
    nodes = m.dynamic_allocation(sizes, 0.75)
    assert nodes == sorted(nodes) and nodes[0] < nodes[-1]
    pairs = list(zip(nodes, sizes, strict=True))
    assert m.area(nodes, sizes) == pytest.approx(sum(n * m.step_time(n, s) for n, s in pairs))
    assert m.run_time(nodes, sizes) == pytest.approx(sum(m.step_time(n, s) for n, s in pairs))
    assert m.dynamic_allocation(sizes, 0.75, max_nodes=50) == [min(n, 50) for n in nodes]
    assert m.static_area(7, sizes) == pytest.approx(m.area([7, 7, 7], sizes))


# -- equivalent static allocation (§II-C) -------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_n_eq_gives_the_same_area_and_exists_below_0_8(seed):
    sizes = m.working_set(seed)
    for target in (0.5, 0.6, 0.7, 0.75):
        n_eq = m.equivalent_static_allocation(sizes, target)
        assert n_eq is not None
        goal = m.consumed_area(sizes, target)
        here = abs(m.static_area(n_eq, sizes) - goal)
        assert here <= abs(m.static_area(n_eq - 1, sizes) - goal)
        assert here <= abs(m.static_area(n_eq + 1, sizes) - goal)
        assert here / goal < 1e-3
    assert m.equivalent_static_allocation(sizes, 0.85) is None  # cannot hold Smax any more
    assert m.equivalent_static_allocation(sizes, 0.9) is None


def test_n_eq_grows_as_the_target_efficiency_falls():
    sizes = m.working_set(0)
    counts = [m.equivalent_static_allocation(sizes, e) for e in (0.5, 0.6, 0.7, 0.75, 0.8)]
    assert counts == sorted(counts, reverse=True)
    assert counts == [3280, 2265, 1496, 1177, 892]


def test_without_memory_constraint_n_eq_always_exists():
    sizes = m.working_set(0)
    assert m.equivalent_static_allocation(sizes, 0.9, mem_per_node_mib=None) == 404
    assert m.memory_min_nodes(sizes) == math.ceil(m.SMAX_MIB / m.MEM_PER_NODE_MIB) == 809


def test_n_eq_existence_threshold_is_about_0_8():
    seeds = range(30)
    profiles = [m.working_set(s) for s in seeds]

    def exists(target):
        return sum(m.equivalent_static_allocation(p, target) is not None for p in profiles)

    assert exists(0.75) == 30
    assert exists(0.8) >= 25
    assert exists(0.83) <= 5


# -- Fig. 3 -------------------------------------------------------------------------------------------
def test_fig3_end_time_increase_stays_small():
    points = m.fig3([0.6, 0.7, 0.75, 0.8], SEEDS)
    for p in points:
        assert p.missing == 0
        assert all(0 < x < 0.025 for x in p.increases)  # the paper: at most ~2.5%
        assert p.median < 0.015
    worst = [p.worst for p in points]
    assert worst == sorted(worst, reverse=True)  # a lower target leaves more room to a static run


def test_fig3_counts_profiles_without_n_eq():
    (p,) = m.fig3([0.9], range(3))
    assert p.missing == 3 and p.increases == () and p.worst is None and p.median is None


# -- Fig. 4 -------------------------------------------------------------------------------------------
def test_fig4_static_choices_narrow_as_smax_grows():
    tib = m.MIB_PER_TIB
    points = m.fig4([0.5 * tib, 1 * tib, 2 * tib, 3.16 * tib, 5 * tib, 8 * tib, 10 * tib], SEEDS)
    safe = [p.safe for p in points]
    assert all(s is not None for s in safe[:-1])
    lows = [lo for lo, _ in safe[:-1]]
    assert lows == [128, 256, 512, 809, 1280, 2048]  # memory: linear in Smax
    widths = [hi - lo for lo, hi in safe[:-1]]
    assert widths[3:] == sorted(widths[3:], reverse=True) and widths[-1] < 100
    assert safe[-1] is None  # 10 TiB: holding the data costs more than 10% over A(75%)
    at_paper = points[3]
    assert at_paper.memory_min == 809
    assert safe[3][0] == 809 and 1300 < safe[3][1] < 1700
    # every choice in the safe range meets both constraints for every profile
    for seed in SEEDS:
        sizes = m.working_set(seed)
        budget = 1.1 * m.consumed_area(sizes, 0.75)
        lo, hi = safe[3]
        assert m.static_area(hi, sizes) <= budget
        assert lo * m.MEM_PER_NODE_MIB >= max(sizes)


def test_static_choices_bounds_are_tight():
    sizes = m.working_set(2)
    lo, hi = m.static_choices(sizes)
    budget = 1.1 * m.consumed_area(sizes, 0.75)
    assert m.static_area(hi, sizes) <= budget < m.static_area(hi + 1, sizes)
    assert (lo - 1) * m.MEM_PER_NODE_MIB < max(sizes) <= lo * m.MEM_PER_NODE_MIB
    assert m.static_choices(sizes, mem_per_node_mib=100.0) is None  # too little memory per node


# -- the launcher's policy against an ideal RMS --------------------------------------------------------
def test_ideal_run_with_spontaneous_updates_is_the_dynamic_run():
    sizes = m.working_set(4, steps=200)
    needs = m.dynamic_allocation(sizes, 0.75, max_nodes=1000)
    run = m.ideal_run(sizes, needs)
    assert run.end == pytest.approx(m.run_time(needs, sizes))
    assert run.area == pytest.approx(m.area(needs, sizes))
    assert run.updates == sum(1 for a, b in zip(needs, needs[1:], strict=False) if a != b)


def test_ideal_run_with_announced_updates_lags_by_the_interval():
    sizes = [1e3] * 3 + [1e6] * 3
    needs = [10] * 3 + [500] * 3
    t_small, t_big_slow, t_big = m.step_time(10, 1e3), m.step_time(10, 1e6), m.step_time(500, 1e6)
    spont = m.ideal_run(sizes, needs)
    assert spont.end == pytest.approx(3 * t_small + 3 * t_big)
    # announced 100 s at the boundary of step 3: steps 3.. run on 10 nodes for 100 s, then on 500
    ann = m.ideal_run(sizes, needs, announce_interval=100.0)
    done_slow = 100.0 / t_big_slow  # fraction of step 3 done on 10 nodes
    assert done_slow < 1
    assert ann.end == pytest.approx(3 * t_small + 100.0 + (3 - done_slow) * t_big)
    assert ann.updates == spont.updates == 1
    assert ann.area == pytest.approx(30 * t_small + 10 * 100.0 + 500 * (3 - done_slow) * t_big)
