"""A malleable application that negotiates (the adaptive-RMS paper, §6: "it accepts the additional processors
as long as the total number of processors is a power of 2").

It runs on a non-preemptible request of ``min_nodes`` (its minimum: never taken back, KOALA's rule) and
grows by negotiation:

* its minimum goes to ``cluster``, or, with a ``placement`` rule (KOALA's ``worst-fit``, ``first-fit``), to
  the cluster the RMS chooses by that rule among ``clusters`` (None: any); its start notification names the
  cluster, where it grows from then on;

* once its minimum started, it opens a *standing* negotiation for a preemptible growth whose allowed sizes
  keep its total within its size rule (``sizes``: ``pow2`` -- totals that are powers of two --, ``any``, or
  a list of totals) and at most ``max_nodes``; the RMS offers when nodes free up;
* an offer it can use (the RMS offers only allowed sizes, now) is accepted; an offer for later, or one whose
  size no longer fits what it holds (it shrank meanwhile), is countered with the largest size it can use,
  or rejected; a lapsed or refused negotiation is opened again while it runs;
* each growth that starts, or ends, changes what it holds: the negotiation is revised to the new sizes;
* its preemptive view drops below what it holds in growth: it gives whole growth requests back, latest
  first (a mandatory shrink: the RMS's deadline is ``preempt_grace`` away) -- at once, or when a drop its
  view announced comes (a timer: no new view comes then);
* ``work`` (node-seconds, None: until its minimum's walltime) is done at the rate of the nodes it holds;
  then it ends everything and closes;
* an offer made to a standing negotiation, and its lapse, come as notifications, which a cut connection
  loses: while it waits with nothing offered it asks again every ``REFRESH`` seconds (a revision, or a new
  negotiation if the RMS had closed it), so that a lost offer delays its growth, never stops it.

Decisions only: the SDK's :class:`~coorm.launchers.live.LiveRunner` carries them out live.
"""

from __future__ import annotations

from collections.abc import Sequence

from coorm.launchers.base import (
    ClusterProps,
    Command,
    Launcher,
    Negotiate,
    OfferSeen,
    Respond,
    Timer,
    Views,
)
from coorm.shared.negotiation import Answer, NegotiationTerms
from coorm.shared.requests import Placement, RequestSpec, RequestType

_EPS = 1e-6
REFRESH = 30.0  # seconds a standing negotiation waits with nothing offered before it is asked again
SIZE_RULES = ("pow2", "any")


def totals(rule: str | Sequence[int], max_nodes: int) -> tuple[int, ...]:
    """The total sizes the application can run on, up to ``max_nodes``."""
    if isinstance(rule, str):
        if rule == "any":
            return tuple(range(1, max_nodes + 1))
        if rule == "pow2":
            out, n = [], 1
            while n <= max_nodes:
                out.append(n)
                n *= 2
            return tuple(out)
        raise ValueError(f"sizes: {rule!r} is not one of {', '.join(SIZE_RULES)} nor a list of sizes")
    return tuple(sorted({int(n) for n in rule if 1 <= int(n) <= max_nodes}))


class MalleableLauncher(Launcher):
    kind = "malleable"
    wants_preemptive = True
    views_after_start = True

    def __init__(self, app: str, cluster: str, min_nodes: int, max_nodes: int, *, sizes: str | Sequence[int] = "pow2",
                 duration: float = 3600.0, work: float | None = None, respond_within: float = 5.0,
                 placement: Placement | None = None, clusters: Sequence[str] | None = None) -> None:
        super().__init__(app)
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError("need 1 <= min_nodes <= max_nodes")
        self.placement = placement
        self.clusters = list(clusters) if clusters else None
        self.cluster = "" if placement else cluster  # (left to the RMS: known once its minimum starts)
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.totals = totals(sizes, max_nodes)
        if min_nodes not in self.totals:
            raise ValueError(f"min_nodes {min_nodes} is not one of the sizes it can run on {list(self.totals)[:8]}")
        self.duration = duration
        self.work = work
        self.respond_within = respond_within
        self.base: str | None = None
        self.growth: dict[str, int] = {}  # started growth requests -> nodes, in start order
        self.pending: dict[str, int] = {}  # accepted growth requests not started yet -> nodes
        self.negotiation: str | None = None  # the open standing negotiation
        self.offer: OfferSeen | None = None  # its open offer
        self.done_work = 0.0
        self._since = 0.0
        self._timer = 0
        self._asks = 0  # Negotiate commands sent: a refresh timer is for the last one only
        self._watch = 0  # the timer set at the next drop of its view below what it holds
        self.views: Views | None = None
        # what the experiment and `coorm launch` report
        self.offers = self.accepted = self.countered = self.rejected = self.lapsed = 0
        self.grows = self.shrinks = 0
        self.peak = 0
        self.sizes_held: list[tuple[float, int]] = []  # (time, nodes held) at every change

    # -- what it holds --------------------------------------------------------------------------------
    def held(self) -> int:
        return (self.min_nodes if self.base in self.running else 0) + sum(self.growth.values())

    def growth_sizes(self) -> tuple[int, ...]:
        held = self.held() + sum(self.pending.values())
        return tuple(t - held for t in self.totals if t > held)

    def stats(self) -> dict[str, int]:
        return {"offers": self.offers, "accepted": self.accepted, "countered": self.countered,
                "rejected": self.rejected, "lapsed": self.lapsed, "grows": self.grows, "shrinks": self.shrinks,
                "peak_nodes": self.peak}

    def _progress(self, now: float) -> None:
        self.done_work += self.held() * max(0.0, now - self._since)
        self._since = now

    def _changed(self, now: float) -> list[Command]:
        """What it holds changed: note it, re-plan the end of its work, revise its negotiation."""
        held = self.held()
        self.peak = max(self.peak, held)
        self.sizes_held.append((now, held))
        out: list[Command] = []
        if self.work is not None and held > 0:
            self._timer += 1
            out.append(Timer(now + max(0.0, self.work - self.done_work) / held, f"work{self._timer}"))
        return out + self._negotiate()

    def _negotiate(self) -> list[Command]:
        """Open, or revise, the standing negotiation for what it can still grow by (none: close it)."""
        if self.closed or self.base not in self.running:
            return []
        sizes = self.growth_sizes()
        if not sizes:
            return self._reject_open()
        self.negotiation = self.negotiation or self.new_id()
        self.offer = None
        terms = NegotiationTerms(negotiation=self.negotiation, cluster=self.cluster, type=RequestType.PREEMPTIBLE,
                                 min_nodes=sizes[0], max_nodes=sizes[-1], sizes=sizes,
                                 respond_within=self.respond_within, standing=True)
        self._asks += 1
        return [Negotiate(terms)]

    def _reject_open(self) -> list[Command]:
        out: list[Command] = []
        if self.offer is not None and self.offer.offer is not None:
            self.rejected += 1
            out.append(Respond(self.offer.offer, Answer.REJECT))
        self.negotiation, self.offer = None, None
        return out

    # -- events ---------------------------------------------------------------------------------------
    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        self.base = self.new_id()
        self._since = now
        if self.placement:
            return [self.submit(RequestSpec(id=self.base, nodes=self.min_nodes, duration=self.duration,
                                            placement=self.placement, clusters=self.clusters))]
        return [self.submit(RequestSpec(id=self.base, cluster=self.cluster, nodes=self.min_nodes,
                                        duration=self.duration))]

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        self._progress(now)
        super().on_start(now, request, nodes)
        if request == self.base and self.placement:
            self.cluster = self.placed[request]  # the RMS's choice: it grows there
        if request != self.base:
            self.pending.pop(request, None)
            self.growth[request] = len(nodes)
            self.grows += 1
            # the view it holds may announce a drop below what it now holds, and no new view comes when that
            # view did not change (the same future seen from a later now): it wakes up at the drop. (It gives
            # nothing back now: the view it holds may be older than this start, a new one on its way.)
            return self._changed(now) + self._watch_drop(now)
        return self._changed(now)

    def on_offer(self, now: float, offer: OfferSeen) -> list[Command]:
        if offer.negotiation != self.negotiation or self.closed:
            if offer.offer is not None and not offer.lapsed and offer.refused is None:
                return [Respond(offer.offer, Answer.REJECT)]  # a negotiation it left: its nodes go back at once
            return []
        if offer.lapsed or offer.refused is not None:
            self.lapsed += offer.lapsed
            self.negotiation, self.offer = None, None
            return self._negotiate()  # asked again while it can still grow
        if offer.waiting or offer.offer is None:
            self.offer = None
            return [Timer(now + REFRESH, f"ask{self._asks}")]
        self.offers += 1
        self.offer = offer
        sizes = self.growth_sizes()
        if offer.nodes in sizes and (offer.start is None or offer.start <= now + _EPS):
            self.accepted += 1
            self.pending[offer.negotiation] = offer.nodes  # (the request is named after its negotiation)
            self.offer = None
            self.negotiation = None  # the accepted offer becomes its request; the next growth is a new one
            return [Respond(offer.offer, Answer.ACCEPT)]
        usable = [s for s in sizes if s <= offer.nodes]
        if usable and offer.start is not None and offer.start <= now + _EPS:
            self.countered += 1
            return [Respond(offer.offer, Answer.COUNTER, usable[-1])]
        return self._reject_open() + self._negotiate()

    def on_views(self, views: Views) -> list[Command]:
        self.views = views
        return self._follow(views.now)

    def _follow(self, now: float) -> list[Command]:
        view = self.views.preemptive.get(self.cluster) if self.views else None
        if view is None or not self.growth:
            return []
        allowed = view.value_at(now)
        out: list[Command] = []
        self._progress(now)
        # a mandatory shrink: whole growth requests go back, latest first, until it holds no more than its view
        while self.growth and sum(self.growth.values()) > allowed:
            rid = next(reversed(self.growth))
            self.growth.pop(rid)
            self.shrinks += 1
            out.append(self.finish(rid))
        if out:
            out += self._changed(now)
        return out + self._watch_drop(now)

    def _watch_drop(self, now: float) -> list[Command]:
        """A drop its view announces for later, below the growth it holds, brings no new view when it comes:
        a timer wakes it up then (to follow its view, whichever it holds by then)."""
        view = self.views.preemptive.get(self.cluster) if self.views else None
        held = sum(self.growth.values())
        if view is None or not held:
            return []
        drop = next((t for t in view.breakpoints_after(now) if view.value_at(t) < held), None)
        if drop is None:
            return []
        self._watch += 1
        return [Timer(drop, f"view{self._watch}")]

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        self._progress(now)
        super().on_end(now, request, reason)
        if request == self.base:
            return self._finish_all()
        self.pending.pop(request, None)
        if self.growth.pop(request, None) is not None:
            self.shrinks += 1
            return self._changed(now)
        return []

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key == f"ask{self._asks}" and self.negotiation is not None and self.offer is None and not self.closed:
            return self._negotiate()  # nothing heard since it was told to wait: an offer may have been lost
        if key == f"view{self._watch}" and not self.closed:
            return self._follow(now)
        if key != f"work{self._timer}" or self.closed:
            return []
        self._progress(now)
        if self.work is not None and self.done_work >= self.work - 1e-6 * max(1.0, self.work):
            return self._finish_all()
        return self._changed(now)

    def _finish_all(self) -> list[Command]:
        out = self._reject_open()
        out += [self.finish(r) for r in list(self.running)]
        out += [self.cancel(r) for r in list(self.waiting)]
        self.growth.clear()
        return out + self.close()
