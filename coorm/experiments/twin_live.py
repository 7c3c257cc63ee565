"""The twin's live half: the scenario over ``coorm up`` (nats-server, valkey, every service, one node agent
per cluster starting and killing real processes), each application through the shipped launcher object
and :class:`~coorm.launchers.live.LiveRunner` -- and what the simulator needs to model it, measured.

What is measured, per application (times in seconds after the run's start):
* ``arrived`` (its scheduled arrival), ``opened`` (its launcher runs: session open, clusters' properties
  asked), when it heard of its first start and when it ended; its notifications and their bytes (what its
  session received); its requests' lives as the policy engine published them (``coorm.lifecycle``: start
  and end of each, decided when, with how many nodes);
and the delays (each a list of samples):
* ``notify``: a start decided (lifecycle ``started_at``) -> its launcher hears of it;
* ``command``: a launcher sends a request -> the policy core applies it (lifecycle ``submitted_at``);
* ``reply``: a launcher sends a request or a done -> it has the answer (it sends nothing else meanwhile);
* ``launch``: an application heard of a start -> every agent answered its launches there (and
  ``launch_nodes``: on how many nodes); a launch some agent refused is not counted;
* ``work_overhead``: a rigid job heard of its start -> it heard of its last process's exit, minus its WORK:
  the launch and exit delays together (the exit delay is what is left after the launch's), and
  ``work_overhead_nodes``: on how many nodes it ran, ``work_overhead_launching``: on how many nodes the
  RMS started other applications' requests (pre-allocations aside) in the ``Delays.exit_window`` before its
  own or with it (as the simulator counts them: the launches around it, on the machine the agents share);
* ``open``: arrival -> the launcher runs;
* ``views``: a round of views published (``ChangeNotify.now``) -> the launcher hears of it;
* ``views_unheld``: the same, of the rounds no pacing held (their pass a view period or more after the pass
  before it, any application's): the views' own path, without the wait for a round that the simulator's
  pacing makes itself;
* ``start_after_view``: a moldable or CEM launcher's start heard, less when it heard the first round of
  views published at or after that start was decided (the round that shows it running, at the latest):
  > 0, the views of its pass came first (the start's path, through the node allocator, is the slower);
  < 0, the start came first (the simulator's order without ``Delays.view_notify``);
and the CPU seconds of every process of the system (services, agents, servers) and of this one (the
launchers), for CooRM's Fig. 8(b).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

from coorm.experiments.twin_workload import TwinApp, launcher, props
from coorm.launchers.kinds import BY_NAME
from coorm.launchers.live import START_LAG, LiveRunner
from coorm.launchers.sdk import Exited, Session, Started, ViewsChanged
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import Lifecycle, LifecycleKind
from coorm.shared.requests import RequestType
from coorm.shared.settings import Settings
from coorm.simulator.delays import Delays


@dataclass
class LiveApp:
    name: str
    kind: str
    arrived: float
    app: str = ""
    opened: float | None = None
    heard_started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    notifications: int = 0
    notification_bytes: int = 0
    resubmissions: int | None = None  # a moldable or CEM launcher's: how often it chose again before its start
    held_back: int | None = None  # a moldable or CEM launcher's: views a new choice waited on (its start_lag)
    refused: list[str] = field(default_factory=list)  # what the RMS or an agent refused it (LiveRunner's)
    error: str | None = None


@dataclass
class LiveRun:
    apps: dict[str, LiveApp]
    requests: list[dict]  # name, request, type, cluster, nodes, start, end (RMS-side, lifecycle)
    delays: dict[str, list[float]]
    cpu_system: float
    cpu_launchers: float
    cpu_by_process: dict[str, float]
    wall: float
    settings: dict = field(default_factory=dict)
    # each application's views as it heard them, (the round's time, when it heard it), seconds from the run's
    # start: a view's latency by its round (how many views the round sent, its place among them). Pickled with
    # the run, not stored in its rows (not yet modelled)
    views_heard: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


class _TimedRunner(LiveRunner):
    """A LiveRunner that notes when it hears of each input and sends each command (for the delays).
    ``hold``: every start, kill and exit reaches the launcher that much later, views not -- the node
    allocator's path made slower than the view publisher's (:mod:`.twin_reselection`)."""

    def __init__(self, *a, t0: float, spec: TwinApp, measure: dict[str, list[float]], hold: float = 0.0,
                 **kw) -> None:
        super().__init__(*a, **kw)
        self.t0, self.spec, self.measure = t0, spec, measure
        self.overhead: float | None = None  # a rigid job's work_overhead (the run's end adds what it depends on)
        self.hold = hold
        self.sent: dict[str, float] = {}  # request -> when the launcher sent it
        self.heard: dict[str, float] = {}  # request -> when it heard of its start
        self.views_heard: list[tuple[float, float]] = []  # (the round's time, when it heard it), in order
        self.launched_at: float | None = None

    async def _pump(self) -> None:
        if self.hold <= 0:
            return await super()._pump()
        loop = asyncio.get_running_loop()
        async for ev in self.s.events():
            if isinstance(ev, ViewsChanged):
                self._inbox.put_nowait(ev)
            else:  # (the same delay for all keeps their order)
                loop.call_later(self.hold, self._inbox.put_nowait, ev)

    async def _handle(self, item) -> None:
        heard = self.clock()
        if isinstance(item, ViewsChanged):
            self.measure["views"].append(heard - item.views.now)
            self.views_heard.append((item.views.now, heard))
        elif isinstance(item, Started):
            self.heard.setdefault(item.request, heard)
        launched = [n for n in item.nodes if n not in item.kept] if isinstance(item, Started) else []
        refused = len(self.result.refused)
        await super()._handle(item)
        # (it launched there: every agent answered -- one refused is no launch's time: a PSA growing as the
        # run ends has its session closed under its launches)
        if launched and item.request in self.launcher.running and len(self.result.refused) == refused:
            self.measure["launch"].append(self.clock() - heard)
            self.measure["launch_nodes"].append(float(len(launched)))
        if isinstance(item, Started) and self.spec.process_work and item.nodes and self.launched_at is None:
            self.launched_at = heard
        elif (isinstance(item, Exited) and self.spec.process_work and self.launched_at is not None
              and self._running_procs == 0):
            # launch + exit: the processes ran WORK seconds of the time from the start heard to the last exit
            self.overhead = heard - self.launched_at - self.spec.params["work"]

    async def _execute(self, commands) -> None:
        from coorm.launchers.base import Done, Submit

        for c in commands:
            if isinstance(c, Submit):
                for r in c.requests:
                    self.sent.setdefault(r.id, self.clock())
            sent = self.clock()
            await super()._execute([c])
            if isinstance(c, Done) or (isinstance(c, Submit) and not c.replaces):
                # the answer awaited before the next command goes out (a replace's time holds what the
                # launcher does on its answer)
                self.measure["reply"].append(self.clock() - sent)
            if isinstance(c, Submit) and self.launcher.finished:
                return  # refused: the rest of the batch is not sent (LiveRunner's own rule)


def _cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of these processes so far, by name (what is gone counts 0)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            out[name] = 0.0
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


async def _run_app(spec: TwinApp, settings: Settings, t0: float, rec: LiveApp, measure, runners: dict,
                   clusters: dict[str, int], start_lag: float, hold: float) -> None:
    await asyncio.sleep(max(0.0, t0 + spec.at - time.time()))  # its arrival in the scenario
    kind = BY_NAME[spec.kind]
    session = await Session.open(settings, kind=spec.kind, name=spec.name, preemptive_views=kind.preemptive_views,
                                 views=kind.live_views)
    rec.app = session.app
    await session.cluster_props()  # what a launcher asks first (part of its opening delay)
    runner = _TimedRunner(session, launcher(spec, session.app, live=True), command=spec.command,
                          command_ends_work=spec.process_work, props=props(clusters), t0=t0, spec=spec,
                          measure=measure, start_lag=start_lag, hold=hold)
    runners[spec.name] = runner
    rec.opened = time.time() - t0
    measure["open"].append(rec.opened - spec.at)
    result = await runner.run()
    rec.exit_code = result.exit_code
    rec.ended = None if result.ended is None else result.ended - t0
    rec.heard_started = None if result.started is None else result.started - t0
    rec.notifications, rec.notification_bytes = result.notifications, result.notification_bytes
    rec.resubmissions = getattr(runner.launcher, "resubmissions", None)
    rec.held_back = getattr(runner.launcher, "held_back", None)
    rec.refused = list(result.refused)


async def _lifecycle(nc, apps: set[str], patience: float = 20.0) -> list[Lifecycle]:
    """The lifecycle messages the policy engine published during the run, read back from its JetStream stream
    (the twin runs no accounting that would consume them) until every one of ``apps`` has its session's end."""
    import nats.errors

    js = nc.jetstream()
    psub = await js.pull_subscribe(subjects.LIFECYCLE, stream=subjects.LIFECYCLE_STREAM)
    out: list[Lifecycle] = []
    waiting = set(apps)
    deadline = time.monotonic() + patience
    while waiting and time.monotonic() < deadline:
        try:
            msgs = await psub.fetch(500, timeout=1.0)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            m = Lifecycle.model_validate_json(msg.data)
            out.append(m)
            if m.kind is LifecycleKind.SESSION_ENDED:
                waiting.discard(m.app)
            await msg.ack()
    await psub.unsubscribe()
    return out


async def run_workload(settings: Settings, specs: list[TwinApp], clusters: dict[str, int], pids: dict[str, int],
                       limit: float, start_lag: float = START_LAG, hold: float = 0.0) -> LiveRun:
    measure: dict[str, list[float]] = {k: [] for k in ("notify", "command", "launch", "launch_nodes",
                                                       "work_overhead", "work_overhead_nodes",
                                                       "work_overhead_launching", "open", "views",
                                                       "start_after_view", "reply", "views_unheld")}
    nc = await bus.connect(settings.nats_url, "coorm-twin", settings.identity(Role.SERVICE))
    apps = {s.name: LiveApp(s.name, s.kind, s.at) for s in specs}
    runners: dict[str, _TimedRunner] = {}
    cpu0, own0 = _cpu_of(pids), time.process_time()
    t0 = time.time()
    tasks = {s.name: asyncio.create_task(_run_app(s, settings, t0, apps[s.name], measure, runners, clusters,
                                                  start_lag, hold))
             for s in specs}
    foreground = [tasks[s.name] for s in specs if not launcher(s, "x", live=True).background]
    _, pending = await asyncio.wait(foreground, timeout=limit)
    for name, r in runners.items():  # the background applications (the PSAs) end with the run
        if not tasks[name].done():
            await r.s.close()
    await asyncio.wait(tasks.values(), timeout=30)
    wall = time.time() - t0
    cpu1, cpu_launchers = _cpu_of(pids), time.process_time() - own0
    by_process = {k: cpu1[k] - cpu0[k] for k in pids}
    life = await _lifecycle(nc, {a.app for a in apps.values() if a.app})
    await bus.shutdown(nc)
    for name, task in tasks.items():
        if not task.done():
            task.cancel()
            apps[name].error = "did not end in time"
        elif task.exception() is not None:
            apps[name].error = repr(task.exception())
    by_app = {a.app: a.name for a in apps.values() if a.app}
    requests = _requests(life, by_app, t0)
    for r in runners.values():  # the delays the lifecycle tells: start notification, request applied
        for req, heard in r.heard.items():
            decided = requests.get(req, {}).get("start")
            if decided is not None:
                measure["notify"].append(heard - t0 - decided)
        if r.spec.kind in ("moldable", "cem") and r.heard:  # (the launchers a view can make choose again)
            req, heard = min(r.heard.items(), key=lambda kv: kv[1])
            decided = requests.get(req, {}).get("start")
            after = [v for at, v in r.views_heard if decided is not None and at - t0 >= decided]
            if after:
                measure["start_after_view"].append(heard - after[0])
        for req, sent in r.sent.items():
            submitted = requests.get(req, {}).get("submitted")
            if submitted is not None:
                measure["command"].append(submitted - (sent - t0))
    measure.update(_overheads(runners, list(requests.values())))
    measure["views_unheld"] = _views_unheld(runners, settings.view_period)
    heard_views = {name: [(at - t0, heard - t0) for at, heard in r.views_heard] for name, r in runners.items()}
    return LiveRun(apps, list(requests.values()), measure, sum(by_process.values()), cpu_launchers, by_process, wall,
                   views_heard=heard_views)


def _views_unheld(runners: dict[str, _TimedRunner], period: float) -> list[float]:
    """The latency of the views of rounds no pacing held: those whose pass came at least ``period`` after the
    pass before it (any application's). On a loaded machine most rounds are held, and the median of all the
    views' latencies (44 ms on a quick run beside two busy processes, against 12 ms for these) counted the
    pacing's wait twice: the simulated starts came late (a CI run of the quick twin)."""
    passes = sorted({at for r in runners.values() for at, _ in r.views_heard})
    free = set(passes[:1]) | {b for a, b in zip(passes, passes[1:], strict=False) if b - a >= period}
    return [heard - at for r in runners.values() for at, heard in r.views_heard if at in free]


def _overheads(runners: dict[str, _TimedRunner], requests: list[dict]) -> dict[str, list[float]]:
    """The rigid jobs' work_overhead samples, each with its nodes and the nodes of the other applications'
    requests (pre-allocations aside) the RMS started in the ``exit_window`` before its own or with it."""
    window = Delays().exit_window
    started = [r for r in requests if r["start"] is not None and r["type"] != RequestType.PRE_ALLOCATION.value]
    out: dict[str, list[float]] = {"work_overhead": [], "work_overhead_nodes": [], "work_overhead_launching": []}
    for name, r in runners.items():
        own = [q["start"] for q in started if q["name"] == name]
        if r.overhead is None or not own:
            continue
        out["work_overhead"].append(r.overhead)
        out["work_overhead_nodes"].append(float(r.spec.params["nodes"]))
        out["work_overhead_launching"].append(float(sum(q["nodes"] for q in started if q["name"] != name
                                                        and min(own) - window <= q["start"] <= min(own))))
    return out


def _requests(life: list[Lifecycle], by_app: dict[str, str], t0: float) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for m in life:
        if m.request is None or m.app not in by_app:
            continue
        r = out.setdefault(m.request, {"name": by_app[m.app], "request": m.request, "type": m.type,
                                       "cluster": m.cluster, "nodes": m.nodes, "start": None, "end": None,
                                       "submitted": None})
        if m.kind is LifecycleKind.STARTED:
            r["start"] = m.at - t0
            r["submitted"] = None if m.submitted_at is None else m.submitted_at - t0
        elif m.kind is LifecycleKind.ENDED:
            r["end"] = m.at - t0
            if m.started_at is not None:
                r["start"] = m.started_at - t0
    return out


def run(specs: list[TwinApp], clusters: dict[str, int], env: dict[str, str], limit: float = 600.0, *,
        start_lag: float = START_LAG, hold: float = 0.0) -> LiveRun:
    """Start the embedded system, run the scenario on it, stop it. ``start_lag``: the selecting launchers'
    (:class:`~coorm.launchers.base.SelectingLauncher`; 0 behaves as before issue 17's fix); ``hold``: see
    :class:`_TimedRunner`."""
    from coorm.cli.up import Up

    up = Up(clusters, env=env, write_connection=False, accounting=False)
    try:
        settings = up.start(120)
        pids = {name: p.pid for name, p in up.procs.items()}
        live = asyncio.run(run_workload(settings, specs, clusters, pids, limit, start_lag, hold))
        live.settings = {k: getattr(settings, k) for k in ("reschedule_interval", "pass_burst", "fair_start",
                                                            "preempt_grace", "view_period", "view_rate",
                                                            "oversize_waits", "malleable_policy")}
        live.settings["start_lag"] = start_lag  # the launchers' (a calibrated simulator runs them with it)
        return live
    finally:
        up.stop()
