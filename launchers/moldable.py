"""The simple-moldable launcher: OAR's moldable-job choice, made by the application from its view.

A simple-moldable application (CooRM §I, §IV-A) has one deploy-time parameter, its number of hosts, and
a list of configurations ``(nodes, duration)`` it can run in. OAR receives that whole list and greedily
keeps the configuration that minimises the job's completion time; under CooRM the launcher makes the very
same choice itself, reading start times off its non-preemptive view.

Rules:
* until it has started, on every view the launcher evaluates the configurations: a start is
  ``view.earliest_fit(nodes, duration, now)``, a completion that start plus ``duration``; it keeps the
  earliest completion (ties: fewer nodes, then the cluster's name). Configurations are visited by
  increasing duration, and the visit stops at the first one whose ``now + duration`` is already later
  than the best completion found (none of the rest could beat it);
* it re-submits only when the chosen *configuration* changes (a new expected start for the same
  configuration is no reason: the RMS already moves the request); a re-selection is CooRM Fig. 5's
  sequence -- submit the new request, cancel the old one -- sent as one atomic replace (the request's
  ``replaces``), so that no pass can start the old one in between; if it had started already, the RMS
  refuses the replace (``started``) and the launcher keeps it (:class:`~coorm.launchers.base.SelectingLauncher`);
* a selection runs once per distinct input (the non-preemptive views of the clusters its configurations
  name, seen from the time it selects): that is CooRM's *computed configurations* metric, and the result is
  memoised, so an input seen before is answered without running the selection again;
* ``adaptation_delay`` (CooRM §IV-C): every view arms a timer ``now + delay``; the selection then runs on
  the latest view received. With no delay it runs at once, inside ``on_views``;
* ``start_lag`` (:class:`~coorm.launchers.base.SelectingLauncher`): a view on which the configuration
  waited with no longer fits where it was expected may show that request running before its start is
  heard; a new choice on it waits that long for the start (live; 0 in the papers' simulator);
* once started, a timer at ``start + duration * runtime_fraction`` ends the run: ``done``, then close.

Configurations are ``(nodes, duration)`` pairs for the launcher's ``cluster``, or ``(cluster, nodes,
duration)`` triples, so that the enumeration an OAR user submits over several clusters
(:func:`oar_configs`) can be given as is and both systems choose among the same configurations.

The application model of CooRM §IV-A: 20% of the trace's jobs are simple-moldable with an Amdahl's-law
speed-up. :func:`amdahl_configs` builds such a job's configurations: on ``n`` hosts of speed ``s`` it runs
``seq_time / s * (f + (1 - f) / n)``, ``f`` the serial fraction. We take ``f = SERIAL_FRACTION = 0.05``
(speed-up bounded by 20; efficiency 0.57 on 16 hosts, 0.14 on 128), and host counts from
``MIN_NODES = 2`` to the cluster size: a moldable job is parallel, and that gives the ``nH - 1``
configurations per cluster, ``nC x (nH - 1)`` in all, that §IV-A counts for OAR. :func:`amdahl_seq_time`
turns a trace job (its host count and runtime) into the sequential time this model needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coorm.launchers.base import Command, SelectingLauncher, Timer, Views
from coorm.shared.requests import RequestSpec
from coorm.shared.stepfn import INF, StepFunction

SERIAL_FRACTION = 0.05
MIN_NODES = 2

Config = tuple[str, int, float]  # cluster, nodes, duration


# -- the application model --------------------------------------------------------------------------
def amdahl_time(nodes: int, seq_time: float, serial_fraction: float, speed: float = 1.0) -> float:
    """Amdahl's law: the runtime on ``nodes`` hosts of relative speed ``speed``."""
    return seq_time / speed * (serial_fraction + (1.0 - serial_fraction) / nodes)


def amdahl_seq_time(nodes: int, runtime: float, serial_fraction: float, speed: float = 1.0) -> float:
    """The sequential time of a job that ran ``runtime`` seconds on ``nodes`` hosts (a trace job)."""
    return runtime * speed / (serial_fraction + (1.0 - serial_fraction) / nodes)


def amdahl_configs(
    nodes_max: int,
    seq_time: float,
    serial_fraction: float,
    speed: float = 1.0,
    choices: Iterable[int] | None = None,
) -> list[tuple[int, float]]:
    """``(nodes, duration)`` for each candidate host count (default: ``MIN_NODES`` .. ``nodes_max``; one
    host if ``nodes_max`` is 1), in increasing host count; counts outside ``1 .. nodes_max`` are dropped."""
    if nodes_max < 1 or seq_time <= 0 or not 0.0 <= serial_fraction <= 1.0 or speed <= 0:
        raise ValueError("amdahl_configs needs nodes_max >= 1, seq_time > 0, 0 <= f <= 1 and speed > 0")
    if choices is None:
        choices = range(min(MIN_NODES, nodes_max), nodes_max + 1)
    counts = sorted({int(n) for n in choices if 1 <= int(n) <= nodes_max})
    return [(n, amdahl_time(n, seq_time, serial_fraction, speed)) for n in counts]


def oar_configs(
    clusters: Mapping[str, int],
    seq_time: float,
    serial_fraction: float = SERIAL_FRACTION,
    speeds: Mapping[str, float] | None = None,
    min_nodes: int = MIN_NODES,
) -> list[Config]:
    """Every configuration an OAR user enumerates for a simple-moldable job: each cluster (name -> host
    count), each host count from ``min_nodes`` to the cluster's size, the Amdahl duration at that
    cluster's speed. With ``nC`` clusters of ``nH`` hosts that is ``nC x (nH - 1)`` (CooRM §IV-A)."""
    speeds = speeds or {}
    out: list[Config] = []
    for c in sorted(clusters):
        n_h = clusters[c]
        choices = range(min(min_nodes, n_h), n_h + 1)
        for n, d in amdahl_configs(n_h, seq_time, serial_fraction, speeds.get(c, 1.0), choices):
            out.append((c, n, d))
    return out


# -- the launcher -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Choice:
    config: Config
    start: float  # expected, from the view the choice was made on
    end: float


class MoldableLauncher(SelectingLauncher):
    kind = "moldable"

    def __init__(
        self,
        app: str,
        cluster: str | None,
        configs: Sequence[tuple[int, float] | Config],
        *,
        runtime_fraction: float = 1.0,
        adaptation_delay: float = 0.0,
        start_lag: float | None = None,
    ) -> None:
        super().__init__(app, adaptation_delay, start_lag)
        norm: list[Config] = []
        for cfg in configs:
            if len(cfg) == 2:
                if cluster is None:
                    raise ValueError("a (nodes, duration) configuration needs the launcher's cluster")
                c, (n, d) = cluster, cfg
            else:
                c, n, d = cfg
            if int(n) < 1 or not 0 < float(d) < INF:
                raise ValueError(f"bad configuration {cfg!r}: nodes >= 1 and a finite duration > 0")
            norm.append((str(c), int(n), float(d)))
        if not norm:
            raise ValueError("a moldable launcher needs at least one configuration")
        if not 0 < runtime_fraction <= 1.0:
            raise ValueError("runtime_fraction must be in (0, 1]: a job longer than its walltime is killed")
        self.configs: tuple[Config, ...] = tuple(norm)
        self._by_duration = tuple(sorted(norm, key=lambda cfg: (cfg[2], cfg[1], cfg[0])))
        self.clusters: tuple[str, ...] = tuple(sorted({c for c, _, _ in norm}))
        self.runtime_fraction = runtime_fraction
        self.current: str | None = None  # the waiting (or running) request
        self.choice: Choice | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.resubmissions = 0
        self._memo: dict[tuple, Choice] = {}

    # -- selection ------------------------------------------------------------------------------------
    def _input(self, views: Views, now: float) -> tuple[tuple, dict[str, StepFunction]]:
        seen = {c: views.non_preemptive[c].clip(now) for c in self.clusters if c in views.non_preemptive}
        key = tuple((c, f.times, f.values) for c, f in sorted(seen.items()))
        return key, seen

    def select(self, views: dict[str, StepFunction], now: float) -> Choice:
        """The configuration with the earliest completion (ties: fewer nodes, then cluster name)."""
        best: tuple | None = None
        peak = {c: f.max_value() for c, f in views.items()}
        for c, n, d in self._by_duration:
            if best is not None and now + d > best[0][0]:
                break  # this one and every longer one end later than the best, whenever they start
            view = views.get(c)
            start = INF if view is None or n > peak[c] else view.earliest_fit(n, d, now)
            rank = (start + d, n, c, d)
            if best is None or rank < best[0]:
                best = (rank, Choice((c, n, d), start, start + d))
        assert best is not None
        return best[1]

    def _reselect(self, now: float) -> list[Command]:
        if self.started_at is not None or self.closed or self._latest is None or self._answer_pending():
            return []
        key, seen = self._input(self._latest, now)
        choice = self._memo.get(key)
        if choice is None:
            self.count_configuration(key)
            choice = self._memo[key] = self.select(seen, now)
        if self.choice is not None and choice.config == self.choice.config:
            self.choice = choice  # same configuration: the RMS already moves the request
            self._held_since = None
            return []
        if self.choice is not None and self.current is not None:
            held = self.hold_back(now, self._still_fits(seen, now))
            if held is not None:
                return held
        c, n, d = choice.config
        new = RequestSpec(id=self.new_id(), cluster=c, nodes=n, duration=d)
        out: list[Command]
        if self.current is not None:  # the new request in place of the old, in one step
            out = [self._replace((self.current,), (self.current, self.choice), new)]
            self.resubmissions += 1
        else:
            out = [self.submit(new)]
        self.current, self.choice = new.id, choice
        return out

    def _restore(self, saved: object) -> None:
        self.current, self.choice = saved if isinstance(saved, tuple) else (None, None)

    def _still_fits(self, views: dict[str, StepFunction], now: float) -> bool:
        """The configuration waited with still starts, in ``views``, when it was expected to (or now)."""
        assert self.choice is not None
        c, n, d = self.choice.config
        view = views.get(c)
        return view is not None and view.earliest_fit(n, d, now) <= max(self.choice.start, now) + 1e-6

    # -- events ---------------------------------------------------------------------------------------
    def selecting(self) -> bool:
        return self.started_at is None and not self.closed

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key == "select":
            return self._reselect(now)
        if key == "end" and self.current in self.running:
            self.ended_at = now
            return [self.finish(self.current), *self.close()]
        return []

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        self._start_of_replaced(request)  # (a replace of it not answered yet is refused: it is kept)
        if request != self.current or self.started_at is not None:
            return []
        super().on_start(now, request, nodes)
        self.started_at = now
        assert self.choice is not None
        return [Timer(now + self.choice.config[2] * self.runtime_fraction, "end")]

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        was_running = request in self.running
        super().on_end(now, request, reason)
        if request == self.current and was_running:  # walltime, node failure...: the run is over
            self.ended_at = now
            return self.close()
        return []

    def stats(self) -> dict:
        cfg = self.choice.config if self.choice else None
        return {
            "cluster": cfg[0] if cfg else None,
            "nodes": cfg[1] if cfg else None,
            "duration": cfg[2] if cfg else None,
            "start": self.started_at,
            "end": self.ended_at,
            "computed_configurations": self.computed_configurations,
            "resubmissions": self.resubmissions,
        }
