"""Run a scenario: the simulation, ``summary.json`` and the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from coorm.simulator import plots
from coorm.simulator.engine import Simulation
from coorm.simulator.scenario import Scenario, build_launchers
from coorm.simulator.summary import summarize


def run_scenario(scenario: Scenario, out: Path | None = None, *, progress=None, validate: bool = False) -> dict:
    sim = Simulation(scenario.sizes, scenario.policy, scenario.props(), validate=validate)
    for at, launcher, name in build_launchers(scenario):
        sim.add(at, launcher, name)
    result = sim.run(until=scenario.until or float("inf"), progress=progress)
    summary = summarize(result)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        plots.utilisation(result, out / "utilisation.png")
        plots.allocations(result, out / "allocations.png")
    return summary
