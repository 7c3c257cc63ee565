"""Run a scenario: the simulation, ``summary.json``, ``metrics.json``, the PNG plots and the jobs CSV; and
repetitions of it over seeds (:func:`run_repeats`).

Files written into ``out`` (formats in README, "Simulator outputs"):

* ``summary.json``: per application and totals (:func:`coorm.simulator.summary.summarize`), plus
  ``metrics`` (:func:`coorm.simulator.metrics.compute`) and ``replay`` (the choices the run made);
* ``metrics.json``: ``replay``, ``warmup``, ``runs`` (each seed and its metrics) and ``aggregate`` (per
  scalar metric over the runs: mean, 95 % confidence half-width, min, max, n);
* ``utilisation.png``, ``allocations.png`` (a single run);
* with repetitions, ``seed-S/summary.json`` per run;
* ``jobs_csv`` (any path): one row per job and run (:data:`coorm.simulator.summary.CSV_COLUMNS`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coorm.simulator.engine import Result, Simulation, SimulationError
from coorm.simulator.metrics import JobRecord, Warmup, aggregate, compute, measured
from coorm.simulator.replay import Planned, ReplayOptions, arrival_interval, base_seed, plan, seeds
from coorm.simulator.scenario import Scenario
from coorm.simulator.summary import job_records, job_rows, refused_apps, summarize, write_jobs_csv
from coorm.simulator.trace import TraceJob, read_swf


@dataclass
class Run:
    seed: int
    result: Result
    planned: list[Planned]
    records: list[JobRecord]
    metrics: dict[str, Any]
    summary: dict[str, Any]


def replay_settings(scenario: Scenario, options: ReplayOptions, seed: int) -> dict[str, Any]:
    """What a run chose, as it goes into the JSON files."""
    interval = arrival_interval(scenario, options)
    arrivals = "trace" if interval is None else f"spaced:{interval:g}"
    return {
        "arrivals": arrivals if scenario.trace is not None else None,  # None: no trace
        "oversize": options.oversize,
        "malleable_fraction": options.malleable_fraction,
        **({"malleable_model": options.malleable_model} if options.malleable_fraction else {}),
        "evolving_fraction": options.evolving_fraction,
        "seed": seed,
    }


def read_trace(scenario: Scenario) -> list[TraceJob] | None:
    if scenario.trace is None:
        return None
    jobs, _ = read_swf(scenario.trace.file, skip=scenario.trace.skip, count=scenario.trace.jobs)
    return jobs


def simulate(scenario: Scenario, options: ReplayOptions | None = None, *,
             progress: Callable[[Simulation], None] | None = None, validate: bool = False,
             jobs: list[TraceJob] | None = None) -> tuple[Result, list[Planned]]:
    """One simulation of the scenario's workload as ``options`` replay it."""
    options = options or ReplayOptions()
    planned = plan(scenario, options, jobs)
    settings = scenario.policy
    refuse = options.oversize == "refuse"
    if refuse:
        settings = settings.model_copy(update={"oversize_waits": False})
    # refusing: the core's too_large refusals are expected (and checked below), so they must not stop the run
    sim = Simulation(scenario.sizes, settings, scenario.props(), validate=validate, strict=not refuse,
                     delays=scenario.delays)
    for p in planned:
        if p.launcher is not None:
            sim.add(p.at, p.launcher, p.name)
    result = sim.run(until=scenario.until or float("inf"), progress=progress)
    if refuse:
        expected = {p.app for p in planned if p.oversize == "refused"}
        got = refused_apps(result)
        other = [r for r in result.rejections if r[1] != "too_large"]
        if other or got != expected:
            t, code, reason = other[0] if other else (result.now, "too_large", f"refused {sorted(got ^ expected)}")
            raise SimulationError(f"t={t}: a command was refused ({code}): {reason}")
    return result, planned


def run_once(scenario: Scenario, options: ReplayOptions | None = None, warmup: Warmup | None = None, *,
             progress: Callable[[Simulation], None] | None = None, validate: bool = False,
             jobs: list[TraceJob] | None = None) -> Run:
    options, warmup = options or ReplayOptions(), warmup or Warmup()
    result, planned = simulate(scenario, options, progress=progress, validate=validate, jobs=jobs)
    records = job_records(result, planned)
    metrics = compute(records, sum(scenario.sizes.values()), warmup)
    seed = base_seed(scenario) if options.seed is None else options.seed
    summary = summarize(result)
    summary["replay"] = replay_settings(scenario, options, seed)
    summary["warmup"] = warmup.describe()
    summary["metrics"] = metrics
    return Run(seed, result, planned, records, metrics, summary)


def _json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _round(data: Any) -> Any:
    if isinstance(data, float):
        return round(data, 6)
    if isinstance(data, dict):
        return {k: _round(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_round(v) for v in data]
    return data


def metrics_document(runs: list[tuple[int, dict[str, Any]]], warmup: Warmup, replay: dict[str, Any]) -> dict[str, Any]:
    """``metrics.json``: each run's seed and metrics, and their aggregate."""
    return _round({
        "replay": {k: v for k, v in replay.items() if k != "seed"},
        "warmup": warmup.describe(),
        "seeds": [s for s, _ in runs],
        "runs": [{"seed": s, "metrics": m} for s, m in runs],
        "aggregate": aggregate([m for _, m in runs]),
    })


def run_scenario(scenario: Scenario, out: Path | None = None, *, progress=None, validate: bool = False,
                 options: ReplayOptions | None = None, warmup: Warmup | None = None, jobs_csv: Path | None = None,
                 plots: bool = True) -> dict:
    """One run; writes its files into ``out`` (and the jobs CSV) and returns its summary."""
    options, warmup = options or ReplayOptions(), warmup or Warmup()
    if out is not None and plots:
        from coorm.simulator import plots as plotting  # before the run: a missing matplotlib says so at once
    run = run_once(scenario, options, warmup, progress=progress, validate=validate)
    if out is not None:
        _json(out / "summary.json", _round(run.summary))
        _json(out / "metrics.json", metrics_document([(run.seed, run.metrics)], warmup, run.summary["replay"]))
        if plots:
            plotting.utilisation(run.result, out / "utilisation.png")
            plotting.allocations(run.result, out / "allocations.png")
    if jobs_csv is not None:
        write_jobs_csv(jobs_csv, _rows(run, warmup))
    return run.summary


def _rows(run: Run, warmup: Warmup) -> list[dict[str, str]]:
    return job_rows(run.records, run.seed, {j.app for j in measured(run.records, warmup)})


def run_repeats(scenario: Scenario, repeat: int, *, seed: int | None = None, out: Path | None = None,
                options: ReplayOptions | None = None, warmup: Warmup | None = None, jobs_csv: Path | None = None,
                progress: Callable[[int, int, Simulation], None] | None = None,
                validate: bool = False) -> dict[str, Any]:
    """``repeat`` runs with seeds ``seed``, ``seed + 1``... (default: the scenario's own seed first);
    returns ``metrics.json``'s document. ``progress(i, repeat, sim)`` during run ``i``."""
    if repeat < 1:
        raise ValueError("at least one run")
    options, warmup = options or ReplayOptions(), warmup or Warmup()
    jobs = read_trace(scenario)
    runs: list[tuple[int, dict[str, Any]]] = []
    rows: list[dict[str, str]] = []
    for i, s in enumerate(seeds(scenario, seed, repeat)):
        def step(sim: Simulation, i: int = i) -> None:
            if progress is not None:
                progress(i, repeat, sim)

        run = run_once(scenario, dataclasses.replace(options, seed=s), warmup, progress=step, validate=validate,
                       jobs=jobs)
        runs.append((run.seed, run.metrics))
        rows += _rows(run, warmup)
        if out is not None:
            _json(out / f"seed-{s}" / "summary.json", _round(run.summary))
    doc = metrics_document(runs, warmup, replay_settings(scenario, options, runs[0][0]))
    if out is not None:
        _json(out / "metrics.json", doc)
    if jobs_csv is not None:
        write_jobs_csv(jobs_csv, rows)
    return doc
