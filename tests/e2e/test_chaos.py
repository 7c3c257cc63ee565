"""The chaos run (``benchmarks/chaos.py``) at a reduced size: a mixed live workload (SDK jobs, ``coorm
submit`` and ``coorm batch`` jobs, malleable applications) on a supervised ``coorm up`` while each kind of
process is SIGKILLed in turn, the batch service included; nothing accepted is lost, no application hangs
or goes untold, no node is held by two started requests, no exit code is wrong, and every killed process is
back (a job runs again) within a minute."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("chaos", Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py")
assert _spec is not None and _spec.loader is not None
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos"] = chaos  # (its dataclasses look their module up)
_spec.loader.exec_module(chaos)


@pytest.mark.slow
def test_chaos_nothing_lost_hung_double_booked_or_misreported(tmp_path):
    r = asyncio.run(chaos.chaos({"c0": 8, "c1": 8}, apps=40, cli_share=0.1, victims=chaos.VICTIMS, seed=3,
                                workdir=tmp_path / "work"))
    print("\n" + chaos.report(r))
    assert (r["apps"], r["psa"]) == (42, 2) and r["batch"] >= 4 and r["samples"] > 20
    assert (r["lost"], r["hung"], r["untold"], r["wrong"], r["double_bookings"], r["twice"]) == ([],) * 6
    assert set(r["recovery"]) == set(chaos.VICTIMS) and all(t < 60 for t in r["recovery"].values()), r["recovery"]
