"""What the live system adds between the cores and the launchers, for the simulator to model (optional).

The papers' simulator -- and ours by default -- has an instant RMS: a launcher's command is applied when it
is sent, a decision is heard when it is taken, views go out after every pass, and an application's work
starts when it hears of its start. The live system is not instant (CooRM §IV-D measured its prototype
against its simulator; ``coorm experiment twin`` measures ours): each of these is a delay of its own, with
the names below. ``Delays()`` is that instant RMS (every delay 0, views after every pass): a simulation
given it, or given nothing, keeps the papers' experiments' results.

Rules the engine keeps when it models delays:
* a launcher hears of the RMS's decisions in the order they were taken (each one ``notify`` later), and the
  RMS applies a launcher's commands in the order they were sent (each one ``command`` later);
* with a ``view_period``, views go out in rounds paced by the live policy engine's own pure core
  (:class:`~coorm.services.policy_engine.view_pacing.ViewPacer`), computed as they stand at the round;
* a launcher that hears of a start with nodes launches its processes there: for ``launch + launch_per_node
  x nodes`` it hears of nothing else (the live runner handles one input at a time);
* an application whose work is a process (``Simulation.add(..., process_work=True)``: the live runner ends it
  when its processes exit) hears of its work's end ``exit + exit_per_node x nodes + exit_per_launching x
  launching`` after its start plus its work (its processes' start within the launch, and their exits'
  reports, from each of its nodes' agents), ``launching`` the nodes of the other applications' requests
  the RMS started within ``exit_window`` before its start or with it (the agents share the machine: a
  launch among others is answered later): the timers it arms on its start fire that much later;
* ``reply``: a launcher awaits the answer to each request and done it sends before it sends the next
  command or hears of anything (the live runner's one input at a time): its commands go out one ``reply``
  apart, and an application ends when it sends its close, after the answers to the commands before it.
  0 (the default, as before): its commands all go out at once, and it is never kept waiting;
* a new application's launcher runs ``open`` after it arrives (opening its session, asking the clusters'
  properties); the RMS knows of its session ``command`` after it arrives;
* ``live_views``: what a live session is sent, counted as live (the launcher acts on the same views): the
  views as they stand when it opens (the SDK asks for them), and its views after it started too (a launcher
  that no longer follows them ignores them);
* ``opening_views`` (with ``live_views``): the views a live session asks for on opening (the SDK's query,
  within its opening) are followed, not only counted: its launcher has them as it starts to run, before any
  round's (False, as before: counted, and the launcher waits for a round);
* ``view_notify``: the views' own latency, a round -> its launcher hears of it. Live, a start and the views
  of the pass that decided it travel apart -- the start through the node allocator, the views through the
  view publisher -- so a launcher may be shown its own request running before it hears that it started
  (the case :class:`~coorm.launchers.base.SelectingLauncher`'s ``start_lag`` is for). With it, views are
  heard in their own order (each ``view_notify`` after its round), not behind a start not heard yet, and
  still not while the launcher opens or launches. None (the default, the papers'): views are decisions like
  the others, heard ``notify`` later in the order taken, so never before the start they show;
* ``samples``: instead of the constants, each delay is drawn (seeded by ``seed``) from the live system's own
  samples of it -- ``notify``, ``command``, ``open``, ``exit``, ``view_notify`` (when set),
  ``launch_factor``, a launch's time over the line ``launch + launch_per_node x nodes``, and
  ``exit_factor``, a process work's overhead over its line above (drawn instead of ``exit`` when
  given): their jitter and
  tails, which decide which way a race goes (two arrivals a few milliseconds apart, an adaptive launcher's
  last view before its start). A delay without samples stays its constant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Delays:
    notify: float = 0.0  # an RMS decision (start, end, views) -> the launcher hears of it
    command: float = 0.0  # a launcher sends a command (open, request, done, close) -> the policy core applies it
    reply: float = 0.0  # a launcher sends a request or a done -> it has the RMS's answer (>= command when set)
    launch: float = 0.0  # a start heard -> its processes launched on its nodes: launch + launch_per_node x nodes
    launch_per_node: float = 0.0
    exit: float = 0.0  # process work: its end is heard exit + exit_per_node x nodes after its start heard + work
    exit_per_node: float = 0.0
    # ... + exit_per_launching x the nodes other applications were started on within exit_window before it
    exit_per_launching: float = 0.0
    exit_window: float = 0.1
    open: float = 0.0  # an application arrives -> its launcher has a session and the clusters' properties
    view_period: float | None = None  # None: views after every pass; else at most a round per period
    view_rate: float = 2000.0  # ... and at most this many view notifications a second (the live defaults)
    live_views: bool = False  # count the views a live session is sent beyond what its launcher follows
    opening_views: bool = False  # ... and follow those it asks for on opening (live_views)
    view_notify: float | None = None  # None: views heard notify later, in order with starts; else their own
    # (name, samples) pairs to draw from instead of the constants; ``seed`` seeds the draws
    samples: tuple[tuple[str, tuple[float, ...]], ...] = field(default=(), repr=False)
    seed: int = 0

    SAMPLED = ("notify", "command", "reply", "open", "exit", "launch_factor", "exit_factor", "view_notify")

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"delay {name} must be >= 0, not {value}")
        for name, pool in self.samples:
            if name not in self.SAMPLED:
                raise ValueError(f"no delay {name} to sample; one of {self.SAMPLED}")
            if not pool or min(pool) < 0:
                raise ValueError(f"the samples of {name} must be some, each >= 0")

    @property
    def instant(self) -> bool:
        """The papers' RMS: nothing to model."""
        return self == Delays()

    def describe(self) -> dict[str, float | None]:
        """The constants (the samples left out: they are stored with the measurements)."""
        return {k: v for k, v in asdict(self).items() if k != "samples"}
