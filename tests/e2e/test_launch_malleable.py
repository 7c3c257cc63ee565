"""``coorm launch malleable --sizes ...`` as a user types it: its sizes are read and checked before CooRM is
reached (the negotiating launcher itself runs live in tests/live/test_negotiation.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.e2e.test_cli import _coorm


@pytest.mark.parametrize("args, code, said", [
    (["--sizes", "pow2", "--set", "min_nodes=3"], 2, "min_nodes 3 is not one of its sizes"),
    (["--sizes", "4,x"], 2, "--sizes"),
    (["--sizes", "4,8,16", "--set", "min_nodes=4", "--set", "max_nodes=16"], 3, "cannot reach CooRM"),
    (["--sizes", "pow2", "--set", "min_nodes=2", "--set", "max_nodes=8"], 3, "cannot reach CooRM"),
])
def test_launch_malleable_reads_its_sizes(tmp_path, args, code, said):
    env = {**os.environ, "COORM_CONNECTION_FILE": str(tmp_path / "none.json"),
           "COORM_NATS_URL": "nats://127.0.0.1:9", "COORM_CONNECT_TIMEOUT": "1"}
    run = subprocess.run([*_coorm(), "launch", "malleable", *args, "--", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == code and said in run.stderr + run.stdout, run.stderr + run.stdout
