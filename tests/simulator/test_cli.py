"""``coorm simulate`` as a user runs it: the options of the research instrument, the metrics as JSON and as
tables that fit 80 columns, a readable refusal of a bad option; and a command line that does not load the
simulator until it is asked for."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from coorm.simulator.replay import ReplayOptions
from coorm.simulator.report import aggregate_table, metrics_table, users_table
from coorm.simulator.run import run_once, run_repeats
from coorm.simulator.scenario import load
from coorm.simulator.traces import SAMPLE
from tests.simulator.test_replay import hand_scenario


def _coorm() -> list[str]:
    return [shutil.which("coorm") or str(Path(sys.executable).parent / "coorm")]


def test_simulate_writes_the_jobs_csv_and_prints_the_metrics_as_json(tmp_path):
    scenario = hand_scenario(tmp_path)
    run = subprocess.run(_coorm() + ["simulate", str(scenario), "--out", str(tmp_path / "out"), "--oversize", "cap",
                                     "--warmup", "1", "--jobs-csv", str(tmp_path / "jobs.csv"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    m = doc["runs"][0]["metrics"]
    # the capped schedule (test_replay): waits 70, 110, 60, 0 once job 1 is left out as warm-up
    assert (m["measured"], m["warmup_excluded"], m["capped"], m["wait_mean"]) == (4, 1, 1, 60.0)
    assert doc["replay"] == {"arrivals": "trace", "oversize": "cap", "malleable_fraction": 0.0,
                             "evolving_fraction": 0.0}
    assert "1 of 5 jobs are larger than the biggest cluster (a job runs on one): capped" in " ".join(run.stderr.split())
    with (tmp_path / "jobs.csv").open() as f:
        assert [(r["job"], r["oversize"], r["nodes_max"]) for r in csv.DictReader(f)][2] == ("3", "capped", "4")
    assert (tmp_path / "out" / "utilisation.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_repeats_with_seeds(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(f"clusters: {{c0: 128}}\ntrace: {{file: {SAMPLE}, jobs: 20, moldable_fraction: 0.5}}\n")
    env = dict(os.environ, COLUMNS="80")
    run = subprocess.run(_coorm() + ["simulate", str(path), "--out", str(tmp_path / "out"), "--repeat", "3",
                                     "--seed", "7", "--arrivals", "spaced:1"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "mean over 3 seeded runs" in run.stdout and "seeds 7, 8, 9" in run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) <= 80
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert doc["seeds"] == [7, 8, 9] and doc["aggregate"]["wait_mean"]["n"] == 3


@pytest.mark.parametrize("args, words", [
    (["--oversize", "trim"], "oversize is one of skip, cap, refuse"),
    (["--arrivals", "poisson"], "arrivals are 'trace' or 'spaced:SECONDS'"),
    (["--warmup", "5m"], "a warm-up is N (jobs) or Ns (seconds)"),
    (["--malleable-fraction", "0.7", "--evolving-fraction", "0.7"], "add up to more than 1"),
])
def test_simulate_refuses_a_bad_option_readably(tmp_path, args, words):
    run = subprocess.run(_coorm() + ["simulate", str(hand_scenario(tmp_path)), "--out", str(tmp_path / "o"), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert words in " ".join(run.stdout.split()) and "Traceback" not in run.stderr


def _render(table, width: int) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - closed below
    console.print(table)
    console.file.close()
    return console.export_text()


def test_the_tables_fit_80_columns(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"clusters: {{c0: 128}}\ntrace: {{file: {SAMPLE}, jobs: 200, skip: 200}}\n")
    scenario = load(path)
    run = run_once(scenario, ReplayOptions(oversize="cap"))
    doc = run_repeats(scenario, 2, options=ReplayOptions(arrivals="spaced:1"))
    for table in (metrics_table(run.metrics), users_table(run.metrics),
                  aggregate_table(doc["aggregate"], len(doc["runs"]))):
        narrow, wide = _render(table, 80), _render(table, 250)
        assert narrow == wide  # nothing wrapped or cut at 80 columns
        assert max(len(line) for line in narrow.splitlines()) <= 80
    text = _render(metrics_table(run.metrics), 80)
    assert "37 capped" in text and "bounded slowdown, mean" in text


def test_the_command_line_loads_no_simulator_until_asked():
    code = ("import sys, coorm.cli.main; "
            "print(sorted(m for m in sys.modules if m.startswith(('coorm.simulator', 'matplotlib', 'yaml'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
