"""The ``coorm`` command as a user runs it (in a subprocess, from the installed entry point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _coorm() -> list[str]:
    exe = shutil.which("coorm") or str(Path(sys.executable).parent / "coorm")
    return [exe]


def test_story_runs_the_fig8_story_without_violations():
    out = subprocess.run(_coorm() + ["story"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "startNotify n2: 16 nodes" in out  # the NEA grew inside its pre-allocation
    assert "kills 10 tasks, keeps 8" in out  # the PSA released what the NEA needed
    assert "0 protocol violations" in out


def test_protocol_schema_writes_one_file_per_message(tmp_path):
    subprocess.run(_coorm() + ["protocol", "schema", "--out", str(tmp_path)], check=True, timeout=60,
                   capture_output=True)
    files = {p.stem for p in tmp_path.glob("*.json")}
    assert {"RequestMsg", "ChangeNotify", "StartNotify", "ErrorReply"} <= files
    assert json.loads((tmp_path / "RequestMsg.json").read_text())["title"] == "RequestMsg"


def test_simulate_writes_the_summary_and_plots(tmp_path):
    scenario = Path(__file__).parents[2] / "scenarios" / "mixed.yaml"
    run = subprocess.run(_coorm() + ["simulate", str(scenario), "--out", str(tmp_path), "--validate"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    apps = {a["name"]: a for a in summary["apps"]}
    assert set(apps) == {"sweep", "cfd", "workflow", "big"}
    assert apps["cfd"]["node_seconds"]["non_preemptible"] == 16 * 1800  # finished early, by done
    assert apps["workflow"]["ended"] - apps["workflow"]["started"] == 1800  # three NEXT phases, no gap
    assert apps["sweep"]["node_seconds"]["preemptible"] > 0 and apps["sweep"]["waste"] > 0
    assert summary["totals"]["rejected_commands"] == 0
    for png in ("utilisation.png", "allocations.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_refuses_a_bad_scenario_readably(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: {c0: 8}\napps:\n  - {kind: rigid, at: 0, nodes: -3, duration: 10}\n")
    run = subprocess.run(_coorm() + ["simulate", str(bad), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "invalid scenario" in run.stdout and "nodes" in run.stdout


@pytest.mark.slow
def test_demo_runs_the_mixed_workload_live_and_draws_utilisation(tmp_path):
    """The README's main job, as a user runs it (about two minutes)."""
    import os

    env = dict(os.environ, COLUMNS="200")  # the table's columns in full
    r = subprocess.run(_coorm() + ["demo", "--out", str(tmp_path)], capture_output=True, text=True, timeout=400,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every application completed" in r.stdout
    for name in ("amr", "psa", "rigid-1", "rigid-6", "moldable", "cem"):
        assert f" {name} " in r.stdout
    png = tmp_path / "utilisation.png"
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_experiment_list_names_every_experiment_module():
    """The command finds the experiments by their module path in the package (a stale path made it list
    nothing but an import error)."""
    from coorm.cli.main import EXPERIMENTS

    run = subprocess.run([*_coorm(), "experiment", "list"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    names = [line.split(":")[0] for line in run.stdout.splitlines() if line.strip()]
    assert len(names) == len(EXPERIMENTS) and "coorm-fig6" in names and "coormv2-fig9" in names


def test_launch_takes_its_options_after_the_kind_and_the_command_after_the_double_dash(tmp_path):
    """``coorm launch psa --set task_duration=60 -- ./task.sh``, as the README writes it: the options are read
    (a bad one is refused before anything is reached, exit 2), the command is what follows ``--`` (its own
    options included); with no CooRM to reach, a good launch ends with 3."""
    env = {**os.environ, "COORM_CONNECTION_FILE": str(tmp_path / "none.json"),
           "COORM_NATS_URL": "nats://127.0.0.1:9", "COORM_CONNECT_TIMEOUT": "1"}
    bad = subprocess.run([*_coorm(), "launch", "psa", "--set", "no_such_parameter=1", "--", "true"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no_such_parameter" in bad.stderr, bad.stderr
    good = subprocess.run([*_coorm(), "launch", "psa", "--set", "task_duration=60", "--", "sh", "-c", "true"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert good.returncode == 3 and "cannot reach CooRM" in good.stderr, good.stderr


@pytest.mark.parametrize("argv, env, line", [
    # an engine started with a threshold it cannot keep: it says which variable, and does not start
    (["service", "policy-engine"], {"COORM_LOCAL_THRESHOLD": "-1"},
     "coorm: COORM_LOCAL_THRESHOLD='-1': Input should be greater than or equal to 0"),
    (["status"], {"COORM_SESSION_TIMEOUT": "soon"},
     "coorm: COORM_SESSION_TIMEOUT='soon': Input should be a valid number"),
])
def test_a_variable_that_cannot_be_read_is_named_in_a_line_and_nothing_starts(argv, env, line):
    run = subprocess.run(_coorm() + argv, capture_output=True, text=True, timeout=60,
                         env=os.environ | {"COORM_NATS_URL": "nats://127.0.0.1:1"} | env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(line), run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.splitlines()) == 1
