"""Scenario files (YAML) for ``coorm simulate``: the platform, the policy settings, the applications or a
workload trace. The format is documented in README ("Simulator"); names are fixed so scenarios stay
portable:

    clusters: {c0: 128, c1: 128}            # or a list: [{name: c0, nodes: 128, speed: 1.0}, ...]
    wan: {latency_ms: 10}                   # optional: latency between clusters (or per pair: [[a, b, ms]])
    policy: {fair_start: 5, reschedule_interval: 1, preempt_grace: 5, preemptible: filling}
    apps:
      - {kind: rigid, at: 0, cluster: c0, nodes: 16, duration: 3600, runtime: 1800, name: job}
      - {kind: moldable, at: 5, cluster: c0, configs: [[8, 7200], [16, 3600]], adaptation_delay: 0}
      - {kind: cem, at: 10, work: 1.0e6, adaptation_delay: 0}
      - {kind: psa, at: 0, cluster: c0, task_duration: 600}
      - {kind: amr, at: 0, cluster: c0, overcommit: 1.0, target_efficiency: 0.75, announce_interval: 0,
         static: false, seed: 1}
      - {kind: next, at: 0, cluster: c0, phases: [[4, 600], [8, 600]]}
    trace: {file: LLNL-Atlas-2006-2.1-cln, jobs: 200, skip: 0,
            moldable_fraction: 0.2, arrival_interval: 1.0, seed: 1}
    delays: {notify: 0.02, command: 0.003, reply: 0.005, launch: 0.1, launch_per_node: 0.03, open: 0.04,
             view_period: 0.1}        # optional: the live system's delays (coorm.simulator.delays)
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coorm.launchers import amr_model
from coorm.launchers.base import ClusterProps, Launcher
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.requests import Placement
from coorm.simulator.delays import Delays
from coorm.simulator.trace import TraceJob, read_swf


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterSpec(_M):
    name: str
    nodes: int = Field(ge=1)
    speed: float = Field(default=1.0, gt=0)


class WanSpec(_M):
    latency_ms: float = Field(default=10.0, ge=0)
    bandwidth_mbps: float = Field(default=1000.0, gt=0)
    pairs: list[tuple[str, str, float]] = Field(default_factory=list)


class _App(_M):
    at: float = Field(default=0.0, ge=0)
    name: str | None = None


class RigidApp(_App):
    kind: Literal["rigid"]
    cluster: str | None = None
    nodes: int = Field(ge=1)
    duration: float = Field(gt=0)
    runtime: float | None = Field(default=None, gt=0)


class MoldableApp(_App):
    kind: Literal["moldable"]
    cluster: str | None = None
    configs: list[tuple[int, float]] = Field(min_length=1)
    adaptation_delay: float = Field(default=0.0, ge=0)
    runtime_fraction: float = Field(default=1.0, gt=0, le=1)
    # seconds a choice waits for the start its view shows (None: the shell's -- 0 simulated, 2 s live)
    start_lag: float | None = Field(default=None, ge=0)


class CemApp(_App):
    kind: Literal["cem"]
    adaptation_delay: float = Field(default=0.0, ge=0)
    params: dict = Field(default_factory=dict)


class PsaApp(_App):
    kind: Literal["psa"]
    cluster: str | None = None
    task_duration: float = Field(gt=0)
    total_tasks: int | None = Field(default=None, ge=1)
    max_nodes: int | None = Field(default=None, ge=1)  # KOALA's maximum size: it never asks past it


class AmrApp(_App):
    kind: Literal["amr"]
    cluster: str | None = None
    overcommit: float = Field(default=1.0, gt=0)
    target_efficiency: float = Field(default=0.75, gt=0, le=1)
    announce_interval: float = Field(default=0.0, ge=0)
    static: bool = False
    seed: int = 0
    steps: int = Field(default=1000, ge=1)
    # the working set and the launcher's margins (CooRMv2 §IV-B; defaults: the paper's 3.16 TiB, 4 GiB a node)
    smax_mib: float = Field(default=amr_model.SMAX_MIB, gt=0)
    mem_per_node_mib: float | None = Field(default=amr_model.MEM_PER_NODE_MIB, gt=0)
    safety_factor: float = Field(default=2.0, gt=0)
    update_allowance: float = Field(default=10.0, ge=0)
    duration_margin: float = Field(default=60.0, ge=0)


class NextApp(_App):
    kind: Literal["next"]
    cluster: str | None = None
    phases: list[tuple[int, float]] = Field(min_length=1)


class MalleableApp(_App):
    """A malleable application that negotiates its growth (launchers/malleable.py)."""

    kind: Literal["malleable"]
    cluster: str | None = None
    # or the RMS chooses its cluster by this rule (KOALA's worst-fit), among ``clusters`` (None: any)
    placement: Placement | None = None
    clusters: list[str] | None = Field(default=None, min_length=1)
    min_nodes: int = Field(default=1, ge=1)
    max_nodes: int = Field(default=64, ge=1)
    sizes: Literal["pow2", "any"] | list[int] = "pow2"  # the totals it can run on
    duration: float = Field(default=3600.0, gt=0)  # its minimum's walltime
    work: float | None = Field(default=None, gt=0)  # node-seconds (None: until the walltime)
    respond_within: float = Field(default=5.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _sizes(self) -> MalleableApp:
        from coorm.launchers.malleable import totals

        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes {self.min_nodes} > max_nodes {self.max_nodes}")
        if self.min_nodes not in totals(self.sizes, self.max_nodes):
            raise ValueError(f"min_nodes {self.min_nodes} is not one of its sizes ({self.sizes})")
        if self.placement and self.cluster:
            raise ValueError("a cluster or a placement rule (the RMS chooses the cluster), not both")
        if self.clusters and not self.placement:
            raise ValueError("clusters (those the RMS may choose from) go with a placement rule")
        return self


AppSpec = Annotated[RigidApp | MoldableApp | CemApp | PsaApp | AmrApp | NextApp | MalleableApp,
                    Field(discriminator="kind")]


class TraceSpec(_M):
    file: str
    jobs: int = Field(default=200, ge=1)
    skip: int = Field(default=0, ge=0)
    moldable_fraction: float = Field(default=0.0, ge=0, le=1)
    cem_fraction: float = Field(default=0.0, ge=0, le=1)
    arrival_interval: float | None = Field(default=1.0, ge=0)  # None: the trace's own submit times
    serial_fraction: float = Field(default=0.05, ge=0, le=1)
    seed: int = 0


class Scenario(_M):
    clusters: list[ClusterSpec]
    wan: WanSpec = Field(default_factory=WanSpec)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    apps: list[AppSpec] = Field(default_factory=list)
    trace: TraceSpec | None = None
    until: float | None = Field(default=None, gt=0)
    delays: Delays | None = None  # none: the papers' instant RMS

    @field_validator("clusters", mode="before")
    @classmethod
    def _clusters(cls, v):
        if isinstance(v, dict):
            return [{"name": k, "nodes": n} for k, n in v.items()]
        return v

    @property
    def sizes(self) -> dict[str, int]:
        return {c.name: c.nodes for c in self.clusters}

    def props(self) -> ClusterProps:
        latency: dict[tuple[str, str], float] = {}
        bandwidth: dict[tuple[str, str], float] = {}
        names = [c.name for c in self.clusters]
        for a in names:
            for b in names:
                if a < b:
                    latency[(a, b)] = self.wan.latency_ms
                    bandwidth[(a, b)] = self.wan.bandwidth_mbps
        for a, b, ms in self.wan.pairs:
            latency[(min(a, b), max(a, b))] = ms
        return ClusterProps(nodes=self.sizes, speed={c.name: c.speed for c in self.clusters},
                            latency_ms=latency, bandwidth_mbps=bandwidth)


def load(path: str | Path) -> Scenario:
    data = yaml.safe_load(Path(path).read_text())
    scenario = Scenario.model_validate(data)
    if scenario.trace is not None:
        file = scenario.trace.file
        if "/" not in file and not file.endswith((".swf", ".gz")):  # a trace's name: sample, or fetched
            from coorm.simulator.traces import locate

            scenario.trace.file = str(locate(file))
        elif not Path(file).is_absolute():
            scenario.trace.file = str((Path(path).parent / file).resolve())
    return scenario


def build_launchers(scenario: Scenario) -> list[tuple[float, Launcher, str]]:
    """(arrival time, launcher, name) for every application of the scenario, trace jobs included."""
    first = scenario.clusters[0].name
    props = scenario.props()
    out: list[tuple[float, Launcher, str]] = []
    for i, spec in enumerate(scenario.apps):
        app_id = f"a{i + 1}"
        out.append((spec.at, make_launcher(app_id, spec, first, props), spec.name or app_id))
    if scenario.trace is not None:
        out.extend(trace_launchers(scenario, start=len(out)))
    return out


def make_launcher(app_id: str, spec, default_cluster: str, props: ClusterProps) -> Launcher:
    cluster = getattr(spec, "cluster", None) or default_cluster
    if isinstance(spec, RigidApp):
        from coorm.launchers.rigid import RigidLauncher

        return RigidLauncher(app_id, cluster, spec.nodes, spec.duration, spec.runtime)
    if isinstance(spec, MoldableApp):
        from coorm.launchers.moldable import MoldableLauncher

        return MoldableLauncher(app_id, cluster, list(spec.configs), adaptation_delay=spec.adaptation_delay,
                                runtime_fraction=spec.runtime_fraction, start_lag=spec.start_lag)
    if isinstance(spec, CemApp):
        from coorm.launchers.cem import CEMLauncher

        return CEMLauncher(app_id, adaptation_delay=spec.adaptation_delay, **spec.params)
    if isinstance(spec, PsaApp):
        from coorm.launchers.psa import PSALauncher

        return PSALauncher(app_id, cluster, spec.task_duration, total_tasks=spec.total_tasks,
                           max_nodes=spec.max_nodes)
    if isinstance(spec, AmrApp):
        from coorm.launchers.amr import AMRLauncher

        return AMRLauncher(app_id, cluster, overcommit=spec.overcommit, target_efficiency=spec.target_efficiency,
                           announce_interval=spec.announce_interval, static=spec.static, seed=spec.seed,
                           steps=spec.steps, smax_mib=spec.smax_mib, mem_per_node_mib=spec.mem_per_node_mib,
                           safety_factor=spec.safety_factor, update_allowance=spec.update_allowance,
                           duration_margin=spec.duration_margin)
    if isinstance(spec, NextApp):
        from coorm.launchers.next_chain import NextChainLauncher

        return NextChainLauncher(app_id, cluster, list(spec.phases))
    if isinstance(spec, MalleableApp):
        from coorm.launchers.malleable import MalleableLauncher

        return MalleableLauncher(app_id, cluster, spec.min_nodes, spec.max_nodes, sizes=spec.sizes,
                                 duration=spec.duration, work=spec.work, respond_within=spec.respond_within,
                                 placement=spec.placement, clusters=spec.clusters)
    raise ValueError(f"unknown application kind {spec!r}")


def trace_launchers(scenario: Scenario, start: int = 0) -> list[tuple[float, Launcher, str]]:
    """A trace's jobs as rigid (and a fraction moldable, Amdahl speed-up, CooRM §IV-A) applications.
    A rigid job goes to a cluster drawn at random; its run time shrinks with the cluster's speed."""
    t = scenario.trace
    jobs, _ = read_swf(t.file, skip=t.skip, count=t.jobs)
    rng = random.Random(t.seed)
    biggest = max(c.nodes for c in scenario.clusters)
    out: list[tuple[float, Launcher, str]] = []
    first_submit = jobs[0].submit if jobs else 0.0
    for k, job in enumerate(jobs):
        app_id = f"a{start + k + 1}"
        at = k * t.arrival_interval if t.arrival_interval is not None else job.submit - first_submit
        out.append((at, trace_job_launcher(scenario, app_id, job, min(job.nodes, biggest), rng), f"job{job.id}"))
    return out


def trace_job_launcher(scenario: Scenario, app_id: str, job: TraceJob, nodes: int, rng: random.Random) -> Launcher:
    """One trace job's launcher, ``nodes`` its size on the platform: CEM, moldable or rigid as the trace's
    fractions draw it (one draw per job, then the cluster's)."""
    from coorm.launchers.rigid import RigidLauncher

    t = scenario.trace
    draw = rng.random()
    if draw < t.cem_fraction:
        from coorm.launchers.cem import CEMLauncher

        return CEMLauncher(app_id)
    if draw < t.cem_fraction + t.moldable_fraction:
        from coorm.launchers.moldable import MoldableLauncher, amdahl_configs, amdahl_seq_time

        cluster = rng.choice(scenario.clusters)
        sequential = amdahl_seq_time(nodes, job.runtime, t.serial_fraction)
        configs = amdahl_configs(cluster.nodes, sequential, t.serial_fraction, speed=cluster.speed)
        return MoldableLauncher(app_id, cluster.name, configs)
    cluster = rng.choice([c for c in scenario.clusters if c.nodes >= nodes])
    return RigidLauncher(app_id, cluster.name, nodes, max(math.ceil(job.walltime / cluster.speed), 1),
                         max(job.runtime / cluster.speed, 1.0))
