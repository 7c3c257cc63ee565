"""``coorm experiment negotiation`` at its quick size, live over ``coorm up``: the paper's cases come out as
the paper tells them, the rows have the stored full run's shape, and a round trip grows with its rounds."""

from __future__ import annotations

from coorm.experiments import negotiation
from tests.experiments.stored import assert_same_shape, stored_rows


def test_the_quick_run_reproduces_the_papers_cases(tmp_path):
    rows = negotiation.run(tmp_path, quick=True)
    assert_same_shape(rows, stored_rows(negotiation.NAME))
    cases = {r["case"]: r for r in rows if r["row"] == "case"}
    assert (cases["asks 14 more, 6 free"]["offers"], cases["asks 14 more, 6 free"]["nodes_after"]) == ("6", 8)
    assert cases["asks 2 more, 6 free"]["nodes_after"] == 4
    countered = cases["on 8, asks 24 more, 15 free: counters 8"]
    assert (countered["offers"], countered["nodes_after"]) == ("15 then 8", 16)
    assert cases["the same, telling its sizes (powers of two)"]["offers"] == "8"
    for case in ("malleable on 4 (powers of two), a rigid job of 4 ends",
                 "the same, two rigid jobs of 3 and 1 end one after the other"):
        assert (cases[case]["offers"], cases[case]["nodes_after"]) == ("4", 8)  # never offered 3
    live = {r["rounds"]: r["live_median_ms"] for r in rows if r["row"] == "rtt"}
    core = {r["rounds"]: r["core_median_ms"] for r in rows if r["row"] == "core"}
    assert sorted(live) == sorted(core) == [1, 2, 3, 4, 5]
    assert live[5] > live[1] and core[5] > core[1]
    assert (tmp_path / "negotiation.csv").exists()
