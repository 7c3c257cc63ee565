"""Same events, same decisions -- across processes: a standby or a restarted policy engine hashes strings
with another ``PYTHONHASHSEED`` than the leader whose snapshot and log it takes over. A long random run is
made in one process; another process, with another seed, restores its snapshot and replays the rest of the
log; a third replays the whole log from nothing. Every decision must be the same, event for event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# KOALA's policies rank applications by when they started and split from what each holds: the same
# across processes too
KOALA = '{"fair_start": 5.0, "reschedule_interval": 1.0, "preempt_grace": 10.0, "pass_burst": 2, ' \
        '"preemptible": "egs", "precedence": "running", "local_threshold": 2}'


def _run(seed: str, *args: str, settings: str = "") -> None:
    env = dict(os.environ, PYTHONHASHSEED=seed, COORM_DETERMINISM_SETTINGS=settings)
    subprocess.run([sys.executable, "-m", "tests.core.determinism_run", *args], cwd=ROOT, env=env, check=True,
                   timeout=600)


@pytest.mark.parametrize("run_seed, settings", [(1, ""), (2, ""), (1, KOALA)])
def test_a_snapshot_restored_under_another_hash_seed_decides_event_for_event_as_its_writer(tmp_path, run_seed,
                                                                                         settings):
    written, restored, replayed = tmp_path / "written.json", tmp_path / "restored.json", tmp_path / "replayed.json"
    _run("1", "write", str(run_seed), "3000", "1500", str(written), settings=settings)
    _run("2", "restore", str(written), str(restored), settings=settings)
    _run("3", "replay", str(written), str(replayed), settings=settings)
    w = json.loads(written.read_text())
    cut, outs = w["cut"], w["outs"]
    kinds = {d["kind"] for out in outs for d in out}
    assert {"start", "end", "views", "rejected"} <= kinds, kinds  # the run exercises what it should
    after = json.loads(restored.read_text())["outs"]
    assert len(after) == len(outs) - cut
    for i, (mine, theirs) in enumerate(zip(outs[cut:], after, strict=True)):
        assert mine == theirs, f"event {cut + i + 1} ({w['events'][cut + i]['kind']}): decisions differ"
    # the state they end in: what the next pass compares every view with
    assert json.loads(restored.read_text())["signatures"] == w["signatures"]
    again = json.loads(replayed.read_text())["outs"]
    for i, (mine, theirs) in enumerate(zip(outs, again, strict=True)):
        assert mine == theirs, f"event {i + 1} ({w['events'][i]['kind']}): decisions differ on a replay"
    assert json.loads(replayed.read_text())["signatures"] == w["signatures"]
