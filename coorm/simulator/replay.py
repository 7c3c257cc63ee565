"""A scenario's workload as a run replays it: its applications and its trace's jobs as launchers, with the
choices a study makes explicit (:class:`ReplayOptions`).

* **arrivals** -- ``trace``: each job arrives at its submit time in the log, shifted so that the first
  job of the slice arrives at 0; ``spaced:X``: the k-th job of the slice arrives at ``k * X`` (CooRM
  §IV-A's one job a second is ``spaced:1``). When the option is not given, a scenario that sets
  ``trace.arrival_interval`` keeps it (``null``: the trace's times), and one that does not replays the
  trace's times;
* **oversize** -- a job larger than the platform's biggest cluster is ``skip``-ped (the default: never
  submitted, counted, a warning), ``cap``-ped to that cluster (what the papers' experiments do, counted and
  warned about too), or ``refuse``-d: submitted at its size to a policy core set to refuse what could
  never start (``oversize_waits`` false, ``too_large``), as a production cluster does. The choice is made
  on the trace's job, whatever kind it is then drawn to be. Every job takes its random draws whatever
  the choice, so that the other jobs get the same draws under each choice (paired comparisons);
* **kinds** -- as :func:`coorm.simulator.scenario.trace_launchers` draws them (a draw per job: CEM with
  ``cem_fraction``, moldable with ``moldable_fraction``, otherwise rigid on a cluster drawn among those
  that fit it), then ``round(F * n)`` of the ``n`` submitted jobs drawn among the rigid ones (a second
  random stream, seeded ``kinds-SEED``, untouched when both fractions are 0) are made **malleable**
  (``malleable_fraction``) or **evolving** (``evolving_fraction``) with the shipped launchers:

  - malleable, as ``malleable_model`` says: ``psa`` (CooRMv2's), a :class:`~coorm.launchers.psa.PSALauncher`
    of ``nodes`` single-node tasks of the job's run time on its cluster -- the job's work, run on however
    many nodes the RMS lends it (preemptible requests), a task killed by a shrink run again; unlike a
    parameter sweep it is not background work: the run waits for it. ``negotiating`` (the adaptive-RMS
    paper's), the shipped :class:`~coorm.launchers.malleable.MalleableLauncher`: the same work (``nodes``
    nodes for the run time) from a quarter of its nodes up to all of them, grown by standing negotiations,
    its work kept across resizes;
  - evolving: a :class:`~coorm.launchers.next_chain.NextChainLauncher` (fully-predictably evolving,
    CooRMv2 §IV) of ``k`` phases (``k`` drawn in 2..4, stream ``evolving-SEED``), each a ``k``-th of the
    job's run time, of a node count drawn in 1..``nodes`` but one phase (drawn) of ``nodes``, its peak;
* **seed** -- replaces the trace's ``seed`` (every draw above) and moves every AMR application's own seed
  by as much, so that repetitions with seeds S, S+1... vary everything the scenario randomises.
  Without it the scenario runs as written.

With ``arrivals`` spaced as the scenario says, ``oversize: cap`` and no malleable or evolving jobs, the
launchers are exactly those of :func:`coorm.simulator.scenario.build_launchers` (a test checks it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from coorm.launchers.base import Launcher
from coorm.simulator.scenario import (
    AmrApp,
    MoldableApp,
    NextApp,
    RigidApp,
    Scenario,
    make_launcher,
    trace_job_launcher,
)
from coorm.simulator.trace import TraceJob, read_swf

OVERSIZE = ("skip", "cap", "refuse")


class ReplayError(ValueError):
    """Options a workload cannot meet (more malleable and evolving jobs asked than it has rigid ones)."""


def parse_arrivals(text: str) -> float | None:
    """``trace`` -> None (the trace's submit times); ``spaced:X`` (``spaced``: 1 s) -> X seconds apart."""
    t = text.strip()
    if t == "trace":
        return None
    if t == "spaced":
        return 1.0
    if t.startswith("spaced:"):
        try:
            x = float(t.removeprefix("spaced:"))
        except ValueError:
            x = -1.0
        if x >= 0 and math.isfinite(x):
            return x
    raise ValueError(f"arrivals are 'trace' or 'spaced:SECONDS', not {text!r}")


MALLEABLE_MODELS = ("psa", "negotiating")


@dataclass(frozen=True)
class ReplayOptions:
    arrivals: str | None = None  # trace | spaced:X; None: what the scenario says, else the trace's times
    oversize: str = "skip"
    malleable_fraction: float = 0.0
    malleable_model: str = "psa"  # what a malleable job is: MALLEABLE_MODELS
    evolving_fraction: float = 0.0
    seed: int | None = None  # None: the scenario's own seeds

    def __post_init__(self) -> None:
        if self.arrivals is not None:
            parse_arrivals(self.arrivals)
        if self.oversize not in OVERSIZE:
            raise ValueError(f"oversize is one of {', '.join(OVERSIZE)}, not {self.oversize!r}")
        if self.malleable_model not in MALLEABLE_MODELS:
            raise ValueError(f"the malleable model is one of {', '.join(MALLEABLE_MODELS)}, "
                             f"not {self.malleable_model!r}")
        for name in ("malleable_fraction", "evolving_fraction"):
            f = getattr(self, name)
            if not 0.0 <= f <= 1.0:
                raise ValueError(f"{name} is between 0 and 1, not {f}")
        if self.malleable_fraction + self.evolving_fraction > 1.0:
            raise ValueError("the malleable and evolving fractions add up to more than 1")


@dataclass
class Planned:
    """One job of the workload: when it arrives and its launcher (None: skipped, never submitted)."""

    at: float
    launcher: Launcher | None
    app: str  # the simulator's application id
    name: str
    job: str  # the trace's job number, or the application's name
    user: str = ""
    nodes: int | None = None  # what it asked for, before any cap
    oversize: str = ""  # "", capped, skipped, refused
    seq: int = 0


def base_seed(scenario: Scenario) -> int:
    return scenario.trace.seed if scenario.trace is not None else 0


def seeds(scenario: Scenario, seed: int | None, repeat: int) -> list[int]:
    """The seeds of ``repeat`` runs: ``seed`` (default: the scenario's own), ``seed + 1``..."""
    first = base_seed(scenario) if seed is None else seed
    return [first + i for i in range(repeat)]


def arrival_interval(scenario: Scenario, options: ReplayOptions) -> float | None:
    """Seconds between arrivals, or None for the trace's own submit times."""
    if options.arrivals is not None:
        return parse_arrivals(options.arrivals)
    t = scenario.trace
    if t is not None and "arrival_interval" in t.model_fields_set:
        return t.arrival_interval
    return None


def plan(scenario: Scenario, options: ReplayOptions = ReplayOptions(),
         jobs: list[TraceJob] | None = None) -> list[Planned]:
    """The workload of one run, in the scenario's order (its applications, then the trace's jobs).
    ``jobs``: the trace's slice, if already read."""
    offset = 0 if options.seed is None else options.seed - base_seed(scenario)
    first = scenario.clusters[0].name
    props = scenario.props()
    out: list[Planned] = []
    for i, spec in enumerate(scenario.apps):
        app_id = f"a{i + 1}"
        if isinstance(spec, AmrApp) and offset:
            spec = spec.model_copy(update={"seed": spec.seed + offset})
        launcher = make_launcher(app_id, spec, first, props)
        nodes: int | None = None
        if isinstance(spec, RigidApp):
            nodes = spec.nodes
        elif isinstance(spec, NextApp):
            nodes = max(n for n, _ in spec.phases)
        elif isinstance(spec, MoldableApp):
            nodes = max(int(c[0]) for c in spec.configs)
        name = spec.name or app_id
        out.append(Planned(spec.at, launcher, app_id, name, name, nodes=nodes, seq=len(out)))
    if scenario.trace is not None:
        if jobs is None:
            jobs, _ = read_swf(scenario.trace.file, skip=scenario.trace.skip, count=scenario.trace.jobs)
        out.extend(_trace(scenario, options, jobs, start=len(out)))
    return out


def _trace(scenario: Scenario, options: ReplayOptions, jobs: list[TraceJob], start: int) -> list[Planned]:
    from coorm.launchers.next_chain import NextChainLauncher
    from coorm.launchers.psa import PSALauncher
    from coorm.launchers.rigid import RigidLauncher

    t = scenario.trace
    assert t is not None
    seed = t.seed if options.seed is None else options.seed
    interval = arrival_interval(scenario, options)
    rng = random.Random(seed)
    biggest = max(c.nodes for c in scenario.clusters)
    biggest_name = max(scenario.clusters, key=lambda c: c.nodes).name
    first_submit = jobs[0].submit if jobs else 0.0
    out: list[Planned] = []
    rigid: list[int] = []  # positions in out of rigid jobs that may become malleable or evolving
    for k, job in enumerate(jobs):
        app_id = f"a{start + k + 1}"
        at = k * interval if interval is not None else job.submit - first_submit
        nodes = min(job.nodes, biggest)
        oversize = "" if job.nodes <= biggest else {"skip": "skipped", "cap": "capped",
                                                    "refuse": "refused"}[options.oversize]
        # the draws of scenario.trace_launchers, taken for every job whatever becomes of it
        launcher = trace_job_launcher(scenario, app_id, job, nodes, rng)
        if isinstance(launcher, RigidLauncher) and not oversize:
            rigid.append(len(out))
        if oversize == "refused":  # submitted at its own size to a cluster it cannot fit: the core refuses it
            where = launcher.cluster if isinstance(launcher, RigidLauncher) else biggest_name
            launcher = RigidLauncher(app_id, where, job.nodes, max(math.ceil(job.walltime), 1), max(job.runtime, 1.0))
            launcher.background = True  # it will never finish: the run does not wait for it
        user = str(job.user) if job.user >= 0 else ""
        out.append(Planned(at, None if oversize == "skipped" else launcher, app_id, f"job{job.id}", str(job.id),
                           user=user, nodes=job.nodes, oversize=oversize, seq=start + k))
    submitted = sum(1 for p in out if p.launcher is not None)
    n_mall = round(options.malleable_fraction * submitted)
    n_evol = round(options.evolving_fraction * submitted)
    if not n_mall and not n_evol:
        return out
    if n_mall + n_evol > len(rigid):
        raise ReplayError(f"{n_mall} malleable and {n_evol} evolving jobs asked, but only {len(rigid)} of the "
                         f"{submitted} submitted jobs are rigid (the rest are moldable, CEM or refused)")
    chosen = random.Random(f"kinds-{seed}").sample(rigid, n_mall + n_evol)
    malleable = set(chosen[:n_mall])
    phases_rng = random.Random(f"evolving-{seed}")
    for pos in sorted(chosen):
        p = out[pos]
        old = p.launcher
        assert isinstance(old, RigidLauncher)
        n, run = old.nodes, float(old.runtime)
        if pos in malleable and options.malleable_model == "negotiating":
            new: Launcher = negotiating_malleable(p.app, old.cluster, n, run)
        elif pos in malleable:
            new = PSALauncher(p.app, old.cluster, run, total_tasks=n)
            new.background = False  # the job's work, not a sweep: the run waits for it
        else:
            k = phases_rng.randint(2, 4)
            peak = phases_rng.randrange(k)
            sizes = [n if i == peak else phases_rng.randint(1, n) for i in range(k)]
            new = NextChainLauncher(p.app, old.cluster, [(s, max(run / k, 1.0)) for s in sizes])
        p.launcher = new
    return out


def negotiating_malleable(app: str, cluster: str, nodes: int, run_time: float) -> Launcher:
    """A rigid job of ``nodes`` nodes for ``run_time`` seconds as a negotiating malleable job: the same work,
    from a quarter of its nodes up to all of them (its request long enough for the work at its minimum)."""
    from coorm.launchers.malleable import MalleableLauncher

    low = math.ceil(nodes / 4)
    return MalleableLauncher(app, cluster, low, nodes, sizes="any", duration=nodes * run_time / low + 60.0,
                             work=nodes * run_time)
