"""The ``coorm`` command as a user runs it (in a subprocess, from the installed entry point)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def _coorm() -> list[str]:
    exe = shutil.which("coorm") or str(Path(sys.executable).parent / "coorm")
    return [exe]


def test_demo_runs_the_fig8_story_without_violations():
    out = subprocess.run(_coorm() + ["demo"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "startNotify n2: 16 nodes" in out  # the NEA grew inside its pre-allocation
    assert "kills 10 tasks, keeps 8" in out  # the PSA released what the NEA needed
    assert "0 protocol violations" in out


def test_protocol_schema_writes_one_file_per_message(tmp_path):
    subprocess.run(_coorm() + ["protocol", "schema", "--out", str(tmp_path)], check=True, timeout=60,
                   capture_output=True)
    files = {p.stem for p in tmp_path.glob("*.json")}
    assert {"RequestMsg", "ChangeNotify", "StartNotify", "ErrorReply"} <= files
    assert json.loads((tmp_path / "RequestMsg.json").read_text())["title"] == "RequestMsg"
