"""The twin's scenario: applications of every kind, with the shipped launcher objects, for both halves.

One :class:`TwinApp` per application; :func:`launcher` builds its decision object for the live system or the
simulator. Rigid jobs' work is a real process (``sleep WORK``): live, the runner ends them when it exits;
the simulator's rigid launcher runs ``WORK`` seconds instead (``process_work``: with delays, plus the
launch and exit delays). The other kinds' work is the launcher's own timers, in both halves; live, each
node they hold runs a process (``sleep``) that the RMS kills when the node goes back."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from coorm.launchers.base import ClusterProps, Launcher
from coorm.launchers.cem import CEMLauncher, Selector
from coorm.launchers.kinds import BY_NAME

CLUSTERS = {"c0": 24, "c1": 24}
QUICK_CLUSTERS = {"c0": 8, "c1": 8}
# the live system's settings (coorm up's environment); the simulator's policy is derived from the same
ENV = {"COORM_RESCHEDULE_INTERVAL": "0.2", "COORM_FAIR_START": "1", "COORM_PREEMPT_GRACE": "3",
       "COORM_KILL_GRACE": "1", "COORM_LOG_LEVEL": "WARNING", "COORM_SESSION_TIMEOUT": "60",
       "COORM_OVERSIZE_WAITS": "false"}
MIN_GAP = 0.5  # seconds between two arrivals of the spaced scenario: beyond a session's opening (max 0.36 s)
LONG = "3600"  # the placeholder process of a kind whose work is its timers: killed when its node goes back


@dataclass(frozen=True)
class TwinApp:
    name: str
    kind: str
    at: float  # seconds after the run's start
    cluster: str
    params: dict = field(default_factory=dict)

    @property
    def process_work(self) -> bool:
        return self.kind == "rigid"

    @property
    def command(self) -> list[str]:
        return ["sleep", f"{self.params['work']:g}" if self.process_work else LONG]


# an adaptive application's configuration: its hosts per cluster, the first (FREE) request's cluster first
Pin = tuple[tuple[str, int], ...]


def launcher(spec: TwinApp, app: str, *, live: bool, start_lag: float | None = None,
             pin: Pin | None = None) -> Launcher:
    """``spec``'s launcher, with id ``app``; ``live``: its work is its process (rigid), not a timer.
    ``start_lag``: a moldable or CEM launcher's (:class:`~coorm.launchers.base.SelectingLauncher`; None: what
    its shell says -- live, :class:`~coorm.launchers.live.LiveRunner`'s; the simulator, 0). ``pin``: a moldable
    or CEM launcher held to that configuration (a live run's choice): it waits until the configuration fits its
    views, as it would on choosing it, and considers no other."""
    p = spec.params
    if pin is not None and spec.kind == "moldable":
        configs = [c for c in p["configs"] if c[0] == sum(n for _, n in pin)]
        if len(pin) != 1 or pin[0][0] != spec.cluster or not configs:
            raise ValueError(f"{app}: {pin} is not one of its configurations")
        p = {**p, "configs": configs}
    lz: Launcher
    if spec.kind == "rigid":
        from coorm.launchers.rigid import RigidLauncher

        # live: runtime = walltime, so no timer ends it -- its process's exit does
        lz = RigidLauncher(app, spec.cluster, p["nodes"], p["walltime"], None if live else p["work"])
    elif spec.kind == "moldable":
        from coorm.launchers.moldable import MoldableLauncher

        # (it ends a little before its walltime: at the walltime itself, the RMS's end and its own done race)
        lz = MoldableLauncher(app, spec.cluster, [tuple(c) for c in p["configs"]], runtime_fraction=0.9,
                              start_lag=start_lag)
    elif spec.kind == "cem":
        from coorm.launchers.cem import CEMModel

        model = CEMModel(iterations=p["iterations"], work=p["work"])
        lz = (CEMLauncher(app, model=model, start_lag=start_lag) if pin is None
              else PinnedCEM(app, pin, model=model, start_lag=start_lag))
    elif spec.kind == "psa":
        from coorm.launchers.psa import PSALauncher

        lz = PSALauncher(app, spec.cluster, task_duration=p["task_duration"], max_nodes=p.get("max_nodes"))
    elif spec.kind == "amr":
        from coorm.launchers.amr import AMRLauncher

        lz = AMRLauncher(app, spec.cluster, smax_mib=p["smax_mib"], steps=p["steps"], seed=p["seed"],
                         announce_interval=0.0)
    elif spec.kind == "next":
        from coorm.launchers.next_chain import NextChainLauncher

        lz = NextChainLauncher(app, spec.cluster, [tuple(ph) for ph in p["phases"]])
    else:
        raise ValueError(f"unknown kind {spec.kind}")
    # a rigid job's need is known: live, its session asks for no views (CooRM's own launchers all did); the
    # simulated one does the same, so both halves send the same notifications
    lz.adapts_to_views = BY_NAME[spec.kind].live_views
    return lz


class PinnedSelector(Selector):
    """The CEM heuristic held to one configuration: where its hosts fit under the caps, that; else none (the
    search then finds the earliest start where the configuration fits over its whole run, as for any)."""

    def __init__(self, pin: Pin, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pin = pin

    def _greedy(self, caps: dict[str, int], order: list[str]) -> dict[str, int] | None:
        return dict(self.pin) if all(caps.get(c, 0) >= n for c, n in self.pin) else None


class PinnedCEM(CEMLauncher):
    """A CEM launcher that chooses ``pin`` and nothing else."""

    def __init__(self, app: str, pin: Pin, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self.pin = pin

    def new_selector(self, props: ClusterProps) -> Selector:
        return PinnedSelector(self.pin, self.model, props, max_starts=self.max_starts,
                              fixpoint_rounds=self.fixpoint_rounds)


def props(clusters: dict[str, int]) -> ClusterProps:
    return ClusterProps(nodes=dict(clusters))


def workload(quick: bool = False, seed: int = 17, *, spaced: bool = False,
             cem_share: float | None = None, count: int | None = None) -> list[TwinApp]:
    """A mixed stream of applications arriving over the run: mostly rigid jobs of a few seconds and 1-8
    nodes, some moldable, a few CEM, AMR (evolving) and NEXT chains, and a PSA per cluster from the start
    (malleable: it takes what no one else uses, and gives it back within the preemption grace).

    ``spaced``: the same applications (the same draws), each arriving at least :data:`MIN_GAP` after the one
    before, the mean gap unchanged (``MIN_GAP`` plus an exponential of the rest): no two arrivals race to
    the policy core. ``cem_share``: that share of the applications are CEMs (:func:`with_cems`). ``count``:
    that many applications besides the PSAs, instead of the mode's; the first ones are the same whatever the
    count (one stream of draws), so a longer scenario extends a shorter one."""
    rng = random.Random(seed)
    n, gap, size = (14, 0.8, 4) if quick else (120, 1.3, 8)
    n = n if count is None else count
    apps = [TwinApp("psa-c0", "psa", 0.0, "c0", {"task_duration": 3.0}),
            TwinApp("psa-c1", "psa", 0.5, "c1", {"task_duration": 3.0})]
    t = 2.0
    for i in range(n):
        cluster = rng.choice(("c0", "c1"))
        draw = rng.random()
        name = f"{i:03d}"
        if draw < 0.06:
            apps.append(TwinApp(f"cem-{name}", "cem", t, cluster, {"iterations": 10, "work": 2.0 * size}))
        elif draw < 0.12:
            apps.append(TwinApp(f"amr-{name}", "amr", t, cluster,
                                {"smax_mib": size * 2048.0, "steps": 3 if quick else 4,
                                 "seed": rng.randrange(100)}))
        elif draw < 0.18:
            apps.append(TwinApp(f"next-{name}", "next", t, cluster,
                                {"phases": [[rng.randint(1, size // 2), 3.0], [rng.randint(1, size), 3.0]]}))
        elif draw < 0.33:
            work = rng.uniform(2.0, 6.0)
            apps.append(TwinApp(f"mold-{name}", "moldable", t, cluster,
                                {"configs": [[k, round(work * size / k, 2)] for k in (size // 4, size // 2, size)
                                             if k >= 1]}))
        else:
            work = round(rng.uniform(1.0, 5.0) if quick else rng.uniform(2.0, 8.0), 2)
            apps.append(TwinApp(f"rigid-{name}", "rigid", t, cluster,
                                {"nodes": rng.randint(1, size), "work": work, "walltime": round(3 * work + 20)}))
        t = round(t + (MIN_GAP + rng.expovariate(1 / (gap - MIN_GAP)) if spaced else rng.expovariate(1 / gap)), 2)
    return apps if cem_share is None else with_cems(apps, cem_share, size, seed)


def with_cems(apps: list[TwinApp], share: float, size: int, seed: int) -> list[TwinApp]:
    """CooRM §IV-D's validation workload: ``apps`` with ``share`` of them (the PSAs aside) replaced by CEM
    applications, at the same times on the same clusters (chosen at random, seeded); the CEMs not chosen
    become moldable jobs, so that exactly that share are CEMs."""
    rng = random.Random(seed + 1)
    others = [i for i, a in enumerate(apps) if a.kind != "psa"]
    chosen = set(rng.sample(others, round(share * len(others))))
    out = []
    for i, a in enumerate(apps):
        number = a.name.rsplit("-", 1)[1]
        if i in chosen:
            a = TwinApp(f"cem-{number}", "cem", a.at, a.cluster, {"iterations": 10, "work": 2.0 * size})
        elif a.kind == "cem":
            work = rng.uniform(2.0, 6.0)
            a = TwinApp(f"mold-{number}", "moldable", a.at, a.cluster,
                        {"configs": [[k, round(work * size / k, 2)] for k in (size // 4, size // 2, size) if k >= 1]})
        out.append(a)
    return out
