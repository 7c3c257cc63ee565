"""The launcher contract: the application side of CooRM, as a pure decision object.

A launcher reacts to what the RMS tells it -- views (``changeNotify``), starts (``startNotify``), ends
(walltime, kill) -- and to its own timers, and answers with protocol commands: submit requests, ``done``
(with released node IDs), close the session, set a timer. It never does I/O and never reads a clock:
``now`` is passed in. The simulator and the live SDK drive the very same objects.

Rules every launcher keeps:
* request ids are ``<app>.<n>``, never reused;
* a launcher only names requests it submitted and node IDs it was given;
* ``finished`` becomes true once it has nothing running or waiting and has asked to close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coorm.shared.negotiation import Answer, NegotiationTerms
from coorm.shared.requests import RequestSpec
from coorm.shared.stepfn import StepFunction


@dataclass(frozen=True, slots=True)
class Views:
    """An application's two views, per cluster."""

    now: float
    non_preemptive: dict[str, StepFunction]
    preemptive: dict[str, StepFunction]


@dataclass(frozen=True, slots=True)
class ClusterProps:
    """What ``listClustersInfo`` / ``listInterClusterInfo`` tell a launcher (CINFO / ICINFO)."""

    nodes: dict[str, int]
    speed: dict[str, float] = field(default_factory=dict)
    latency_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    bandwidth_mbps: dict[tuple[str, str], float] = field(default_factory=dict)

    def speed_of(self, cluster: str) -> float:
        return self.speed.get(cluster, 1.0)

    def latency(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        return self.latency_ms.get((a, b), self.latency_ms.get((b, a), 10.0))


# -- commands ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """Submit ``requests`` (one batch). ``replaces``: waiting requests of the application the batch replaces,
    cancelled in the same step as the batch is accepted (an atomic replace: none of them can start after
    it); if one of them has started, nothing changes -- the launcher is told
    (:meth:`Launcher.on_replace_answered`) and keeps what started."""

    requests: tuple[RequestSpec, ...]
    replaces: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Done:
    request: str
    released: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Close:
    pass


@dataclass(frozen=True, slots=True)
class Timer:
    at: float
    key: str


@dataclass(frozen=True, slots=True)
class Negotiate:
    """Open or revise a negotiation (the adaptive-RMS paper): the RMS answers with an offer."""

    terms: NegotiationTerms


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer an offer: accept, counter with ``nodes``, or reject."""

    offer: str
    answer: Answer
    nodes: int | None = None


Command = Submit | Done | Close | Timer | Negotiate | Respond


@dataclass(frozen=True, slots=True)
class OfferSeen:
    """What a launcher is told of an offer: ``offer`` None and ``waiting`` when a standing negotiation has
    nothing yet; ``lapsed`` when it was not answered in time; ``refused`` (an error code) when the RMS
    refused the negotiation or the answer."""

    negotiation: str
    offer: str | None = None
    nodes: int = 0
    start: float | None = None
    deadline: float | None = None
    waiting: bool = False
    lapsed: bool = False
    refused: str | None = None


class Launcher:
    """Base class: bookkeeping shared by every shipped launcher."""

    kind = "launcher"
    background = False  # True: runs for as long as there is room (a PSA); a simulation does not wait for it
    wants_preemptive = False  # the RMS sends preemptive views too
    views_after_start = False  # keeps following its views once running (malleable, evolving)
    # subscribes to its views (the papers' applications all do; a live rigid job opens its session with
    # ``views=False`` instead: the RMS knows its need, sends it no views and holds no node for it)
    adapts_to_views = True

    def __init__(self, app: str) -> None:
        self.app = app
        self._n = 0
        self.finished = False
        self.closed = False
        self.running: dict[str, tuple[str, ...]] = {}  # request -> node IDs
        # request -> the cluster it started on, as its start notification says (whoever delivers the start
        # fills it in first): the RMS's choice for a request that left the cluster to it (``placement``)
        self.placed: dict[str, str] = {}
        self.waiting: set[str] = set()
        self.computed_configurations = 0  # distinct views the selection ran on (CooRM §II)
        self._seen_views: set[tuple] = set()

    # -- helpers --------------------------------------------------------------------------------------
    def new_id(self) -> str:
        self._n += 1
        return f"{self.app}.{self._n}"

    def submit(self, *specs: RequestSpec) -> Submit:
        for s in specs:
            self.waiting.add(s.id)
        return Submit(tuple(specs))

    def replace(self, old: tuple[str, ...], *specs: RequestSpec) -> Submit:
        """Submit ``specs`` in place of the waiting requests ``old``, in one step (:class:`Submit`'s
        ``replaces``); the answer comes to :meth:`on_replace_answered`."""
        for s in specs:
            self.waiting.add(s.id)
        for r in old:
            self.waiting.discard(r)
        return Submit(tuple(specs), tuple(old))

    def cancel(self, request: str) -> Done:
        self.waiting.discard(request)
        return Done(request)

    def finish(self, request: str, released: tuple[str, ...] = ()) -> Done:
        self.running.pop(request, None)
        self.waiting.discard(request)
        return Done(request, released)

    def close(self) -> list[Command]:
        if self.closed:
            return []
        self.closed = True
        self.finished = True
        return [Close()]

    def count_configuration(self, key: tuple) -> bool:
        """Memoisation as in CooRM: a selection is computed once per distinct input."""
        if key in self._seen_views:
            return False
        self._seen_views.add(key)
        self.computed_configurations += 1
        return True

    # -- events (override what the launcher cares about) ----------------------------------------------
    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        return []

    def on_views(self, views: Views) -> list[Command]:
        return []

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        self.waiting.discard(request)
        self.running[request] = nodes
        return []

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        """The RMS ended ``request`` (walltime, node failure, violation, NEXT handover...)."""
        self.running.pop(request, None)
        self.waiting.discard(request)
        return []

    def on_timer(self, now: float, key: str) -> list[Command]:
        return []

    def on_offer(self, now: float, offer: OfferSeen) -> list[Command]:
        """An offer of the RMS (the answer to a negotiation or a counter, or unsolicited), a lapse, a refusal."""
        return []

    def on_accepted(self, now: float, negotiation: str, request: str) -> list[Command]:
        """An accepted offer became ``request``: it waits to start (a ``startNotify`` follows)."""
        self.waiting.add(request)
        return []

    def on_replace_answered(self, now: float, submit: Submit, refused: str | None) -> list[Command]:
        """The RMS's answer to a :class:`Submit` with ``replaces``: accepted (``refused`` None: the old
        requests are cancelled, the new ones wait) or refused with an error code -- ``started`` (one of the
        old requests has started: nothing changed, the application keeps it; its ``startNotify`` comes, or
        came) or ``ended`` (one of them ended meanwhile). A refused replace submitted nothing."""
        if refused is not None:
            for s in submit.requests:
                self.waiting.discard(s.id)
            self.waiting.update(r for r in submit.replaces if r not in self.running)
        return []


class SelectingLauncher(Launcher):
    """A launcher that runs its resource selection on each new view until it starts (CooRM §III-B,
    steps 6-7). With an ``adaptation_delay`` (CooRM §IV-C) each view arms a timer and the selection then
    runs on the latest view: a slow selection. Subclasses say when they are still selecting and how.

    ``start_lag``: how long after a view its start may be heard. A start and the views of the pass that
    decided it travel apart -- live, the start through the node allocator, the views through the view
    publisher, which is faster -- so a launcher may be shown its own request running before it hears that
    it started. Chosen again on that view, it would cancel a request that has started and take what is
    left: every such ``done`` frees nodes for fair-start and changes the views of everyone below it, and
    that choice starts and is cancelled in its turn (issue 17's livelock). So when the configuration it
    waits with no longer fits where it expected it (its own unheard start, or a higher priority took it),
    a new choice is held back for ``start_lag`` seconds, a timer looks again then; a start heard meanwhile
    ends the selection. 0 (the papers' simulator): a start is heard with the views that show it. None:
    what the shell that drives it says (:class:`~coorm.launchers.live.LiveRunner`: its ``start_lag``).

    A new choice is sent as one atomic replace (:class:`Submit`'s ``replaces``): the new request(s) in place of
    the waiting one(s), so that no pass can start the old one between the two (CooRM Fig. 5's request, then
    ``done``, let one start there: 3 of the twin-spaced run's live requests did). If the old one had started
    before the replace reached the RMS, the RMS refuses it (``started``) and nothing changes: the launcher
    keeps what started (:meth:`on_replace_answered`, or the start heard first). Until a replace is answered, a
    new choice waits for the answer (made then on the latest view)."""

    def __init__(self, app: str, adaptation_delay: float = 0.0, start_lag: float | None = None) -> None:
        super().__init__(app)
        if adaptation_delay < 0:
            raise ValueError("adaptation_delay must be >= 0")
        if start_lag is not None and start_lag < 0:
            raise ValueError("start_lag must be >= 0")
        self.adaptation_delay = adaptation_delay
        self.start_lag = start_lag
        self._latest: Views | None = None
        self._held_since: float | None = None  # since when a new choice waits for a start maybe unheard
        self._held_timer: float | None = None
        self.held_back = 0  # views a new choice was held back on (a start not heard yet)
        # the replace sent and not answered yet, and what the launcher waited with before it (restored if the
        # RMS refuses it); views that came meanwhile are chosen on once it is answered
        self._replacing: Submit | None = None
        self._before_replace: object = None
        self._chose_while_replacing = False
        self.replace_refused = 0  # replaces the RMS refused (``started``: what it waited with had started, kept)

    # -- the atomic replace (issue 17): the new choice and the cancel of the old one in one step --------------
    def _replace(self, old: tuple[str, ...], saved: object, *specs: RequestSpec) -> Submit:
        """The command that submits ``specs`` in place of ``old``; ``saved``: the state to restore if the RMS
        refuses it (:meth:`_restore`)."""
        sub = self.replace(old, *specs)
        self._replacing, self._before_replace = sub, saved
        return sub

    def _answer_pending(self) -> bool:
        """A replace is not answered yet: a new choice waits for the answer (it is made then, on the latest
        view), so that the launcher never replaces a request the RMS may not have accepted."""
        if self._replacing is None:
            return False
        self._chose_while_replacing = True
        return True

    def _restore(self, saved: object) -> None:
        """Wait again with what the launcher waited with before the replace (``saved``)."""
        raise NotImplementedError

    def _start_of_replaced(self, request: str) -> None:
        """The start of a request a pending replace names is heard: the RMS started it before the replace
        reached it, so the replace is refused (``started``) -- the launcher keeps that request at once."""
        if self._replacing is not None and request in self._replacing.replaces:
            self._restore(self._before_replace)
            self._replacing, self._before_replace, self._chose_while_replacing = None, None, False
            self.replace_refused += 1

    def on_replace_answered(self, now: float, submit: Submit, refused: str | None) -> list[Command]:
        super().on_replace_answered(now, submit, refused)
        if submit != self._replacing:
            return []  # (a start of a request it replaces was heard first: the launcher kept it then)
        saved = self._before_replace
        self._replacing, self._before_replace = None, None
        again, self._chose_while_replacing = self._chose_while_replacing, False
        if refused is None:
            return self._reselect(now) if again else []
        self.replace_refused += 1
        self._restore(saved)
        if refused == "ended" and not any(r in self.running for r in submit.replaces):
            # what it waited with is gone without a start (never seen so far): choose afresh
            self._restore(None)
            return self._reselect(now)
        return []

    def selecting(self) -> bool:
        return not self.closed

    def _reselect(self, now: float) -> list[Command]:
        raise NotImplementedError

    def hold_back(self, now: float, still_fits: bool) -> list[Command] | None:
        """Whether a new choice that would replace the waiting request(s) waits (a list: the commands
        meanwhile, a timer to look again) or goes ahead (None). ``still_fits``: the configuration waited
        with still fits, in the view chosen on, where it was expected to start -- then the view does not
        show it running, and a better choice is a real one."""
        lag = self.start_lag or 0.0
        if lag <= 0 or still_fits:
            self._held_since = None
            return None
        if self._held_since is None:
            self._held_since = now
        until = self._held_since + lag
        if now >= until:  # no start came: it was taken by a higher priority, choose again
            self._held_since = None
            return None
        self.held_back += 1
        if self._held_timer == until:
            return []
        self._held_timer = until
        return [Timer(until, "select")]

    def on_views(self, views: Views) -> list[Command]:
        if not self.selecting():
            return []
        self._latest = views
        if self.adaptation_delay > 0:
            return [Timer(views.now + self.adaptation_delay, "select")]
        return self._reselect(views.now)
