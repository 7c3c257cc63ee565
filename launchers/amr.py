"""A synthetic AMR application: a non-predictably evolving application (NEA) with a sure execution
(CooRMv2 §IV, §V-A1, §V-C), whose working set and speed follow :mod:`coorm.launchers.amr_model`.

Opening (``on_open``): the user "guesses" the equivalent static allocation ``n_eq`` of its (seeded)
profile -- a posteriori knowledge, which ``overcommit`` then spoils: the launcher submits a
**pre-allocation** of ``ceil(overcommit * n_eq)`` nodes (never more than the cluster has) and, COALLOC'ed
to it, a first **non-preemptible** request of the nodes the first step needs (the whole pre-allocation in
``static`` mode). When ``n_eq`` does not exist (a target efficiency above ~0.8) it uses the fewest nodes
that hold the peak working set instead.

Durations: the pre-allocation must outlast the run. The launcher replays its own update policy on its
profile against an ideal RMS (:func:`~coorm.launchers.amr_model.ideal_run`: updates served at once, or exactly
one announce interval later) and asks for ``safety_factor`` times that run time (2 by default), plus
``update_allowance`` seconds (10) per planned update for what the real RMS adds to each one (the
re-scheduling interval, a preemption grace while other applications release nodes), plus
``duration_margin`` (60 s), plus one announce interval (so that an update announced before the planned
end still fits). Every non-preemptible request ends ``duration_margin`` seconds before the
pre-allocation does: the RMS starts it at its next pass, a little after it was sent, and it must still fit
inside the pre-allocation then.

Running: steps run one after the other in virtual time, with :class:`~coorm.launchers.base.Timer` commands.
Step ``i`` on ``n`` nodes takes ``t(n, S_i)``; the work of a step is measured as a fraction, progressing at
``1 / t(n, S_i)`` per second on the ``n`` nodes actually held, so a change of node count in the middle
of a step rescales what remains of it. At each step boundary the (dynamic) launcher computes the nodes
the step needs for the target efficiency, capped by the pre-allocation, and if it holds a different
count and no update is in flight it updates (DESIGN §3):

* **spontaneous** (``announce_interval`` 0): ``request(n', NEXT current, duration = rest of the
  pre-allocation)`` then ``done(current)``, naming the last ``n_current - n'`` of its node IDs as released
  when it shrinks (it stops using them at once);
* **announced**: ``request(n_current, announce_interval, NEXT current)``, ``request(n', NEXT that)``,
  ``done(current)``. ``n'`` is the count needed when the update was initiated (§V-C); when it shrinks, the
  RMS releases the intermediate request's last nodes at the hand-over. Both directions are announced,
  as in the paper's experiment (the AMR sends announced updates *instead of* spontaneous ones).

Until the successor's ``startNotify`` it keeps computing on the nodes it has (minus those it released).
An update inside the pre-allocation is guaranteed, but its start can come later than asked: nodes of the
pre-allocation lent to a malleable application are taken back within the RMS's preemption grace. An
announced update's bridge is then kept past its end by the RMS, so nothing changes for the launcher. A
spontaneous update's ``done`` ends the current request at once, though: if the successor does not start
in the same pass, the RMS frees the old nodes and the launcher holds nothing from that chain. It then
**pauses**: the step's progress is kept (as if its state had been checkpointed), no node-seconds are
counted, and it resumes where it stopped on the successor's ``startNotify``, on the node IDs given there
(``stats().paused_seconds`` adds these gaps up). One update is in flight at a time; the next step
boundary after its successor started re-evaluates.

Ending: after the last step it cancels a successor still waiting, sends ``done`` for its running request
and for the pre-allocation, and closes. A request of its chain or its pre-allocation ended by the RMS for
any other reason (walltime, node failure, violation, pre-allocation expired) fails the run: it gives back
what it still has and closes; ``stats().failed`` says why.

Invariants: every non-preemptible request it sends asks for at most the pre-allocation; it holds at most
one non-preemptible request of its chain at a time; it only names node IDs it was given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coorm.launchers import amr_model as model
from coorm.launchers.base import ClusterProps, Command, Launcher, Timer, Views
from coorm.shared.requests import Relation, RequestSpec, RequestType

_EPS = 1e-9
_HANDOVER = ("done", "next", "walltime")  # ends of a chain member that a waiting successor takes over
_GONE = ("violation", "session_closed")  # the session is over: nothing left to send


def _seq(request: str) -> int:
    return int(request.rsplit(".", 1)[1])


@dataclass(frozen=True, slots=True)
class AMRStats:
    steps_done: int
    node_seconds: float  # integral of the nodes held by its non-preemptible requests
    started_at: float | None
    end_time: float | None
    updates: int
    paused_seconds: float  # time spent holding nothing, waiting for a successor
    preallocation: int
    n_eq: int | None
    failed: str | None


class AMRLauncher(Launcher):
    kind = "amr"
    views_after_start = False  # it never needs its views: its pre-allocation guarantees its updates

    def __init__(
        self,
        app: str,
        cluster: str,
        *,
        overcommit: float = 1.0,
        target_efficiency: float = 0.75,
        announce_interval: float = 0.0,
        static: bool = False,
        seed: int = 0,
        smax_mib: float = model.SMAX_MIB,
        steps: int = model.STEPS,
        mem_per_node_mib: float | None = model.MEM_PER_NODE_MIB,
        safety_factor: float = 2.0,
        update_allowance: float = 10.0,
        duration_margin: float = 60.0,
    ) -> None:
        super().__init__(app)
        if overcommit <= 0:
            raise ValueError("the overcommit factor must be positive")
        if announce_interval < 0:
            raise ValueError("the announce interval cannot be negative")
        self.cluster = cluster
        self.overcommit = overcommit
        self.target = target_efficiency
        self.announce_interval = float(announce_interval)
        self.static = static
        self.seed = seed
        self.steps = steps
        self.safety_factor = safety_factor
        self.update_allowance = update_allowance
        self.margin = duration_margin
        self.sizes = model.working_set(seed, smax_mib, steps)
        self.wanted = model.dynamic_allocation(self.sizes, target_efficiency)  # before the cap
        self.n_eq = model.equivalent_static_allocation(self.sizes, target_efficiency, mem_per_node_mib)
        # the user's guess; above ~0.8 efficiency no static allocation matches: the fewest that hold the data
        self._guess = self.n_eq or model.memory_min_nodes(self.sizes, mem_per_node_mib)
        # set by on_open
        self.preallocation = 0
        self.pa_duration = 0.0
        self.pa: str | None = None
        self.pa_end: float | None = None
        self.initial: str | None = None
        # the chain of non-preemptible requests
        self.current: str | None = None  # the request it computes on
        self.nodes: tuple[str, ...] = ()  # its node IDs
        self.chain: list[str] = []  # an update's requests not started yet, in order
        # progress
        self.step = 0
        self.progress = 0.0  # fraction of the current step done
        self.held = 0
        self._last = 0.0
        self._gen = 0
        self._timer_key: str | None = None
        self.node_seconds = 0.0
        self.paused_seconds = 0.0
        self.started_at: float | None = None
        self.end_time: float | None = None
        self.updates = 0
        self.failed: str | None = None

    # -- what it needs -----------------------------------------------------------------------------------
    def need(self, step: int) -> int:
        """Nodes for ``step``: the whole pre-allocation in static mode, else the target efficiency's count
        capped by the pre-allocation."""
        if self.static:
            return self.preallocation
        return max(1, min(self.wanted[step], self.preallocation))

    def planned_run(self) -> model.IdealRun:
        needs = [self.need(i) for i in range(self.steps)]
        return model.ideal_run(self.sizes, needs, 0.0 if self.static else self.announce_interval)

    def stats(self) -> AMRStats:
        return AMRStats(
            steps_done=self.step,
            node_seconds=self.node_seconds,
            started_at=self.started_at,
            end_time=self.end_time,
            updates=self.updates,
            paused_seconds=self.paused_seconds,
            preallocation=self.preallocation,
            n_eq=self.n_eq,
            failed=self.failed,
        )

    # -- events ------------------------------------------------------------------------------------------
    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        pre = max(1, math.ceil(self.overcommit * self._guess - _EPS))
        size = props.nodes.get(self.cluster)
        if size:
            pre = min(pre, size)  # a bigger one would wait forever
        self.preallocation = pre
        plan = self.planned_run()
        self.pa_duration = (self.safety_factor * plan.end + self.update_allowance * plan.updates + self.margin
                            + (0.0 if self.static else self.announce_interval))
        self.pa, self.initial = self.new_id(), self.new_id()
        self._last = now
        return [
            self.submit(
                RequestSpec(id=self.pa, type=RequestType.PRE_ALLOCATION, cluster=self.cluster, nodes=pre,
                            duration=self.pa_duration),
                RequestSpec(id=self.initial, type=RequestType.NON_PREEMPTIBLE, cluster=self.cluster,
                            nodes=self.need(0), duration=self.pa_duration - self.margin,
                            related_to=self.pa, related_how=Relation.COALLOC),
            )
        ]

    def on_views(self, views: Views) -> list[Command]:
        return []

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        super().on_start(now, request, nodes)
        if self.finished:
            return []
        if request == self.pa:
            self.pa_end = now + self.pa_duration
            return []
        if request == self.initial:
            if self.pa_end is None:  # COALLOC: the pre-allocation started with it (no startNotify of its own)
                assert self.pa is not None  # asked for in on_open, with the initial request
                self.waiting.discard(self.pa)
                self.running[self.pa] = ()
                self.pa_end = now + self.pa_duration
            self.started_at = now
            self._last = now
            return self._hold(now, request, nodes)
        if self.chain and request == self.chain[0]:
            self.chain.pop(0)
            return self._hold(now, request, nodes)
        return []

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        super().on_end(now, request, reason)
        if self.finished:
            return []
        if request == self.current:
            if self.chain and reason in _HANDOVER:
                # its successor has not started (yet): it holds nothing from the chain meanwhile
                self.current, self.nodes = None, ()
                return self._set_held(now, 0)
            return self._fail(now, request, reason)
        if request == self.pa or request in self.chain:
            return self._fail(now, request, reason)
        return []  # a request it replaced already

    def on_timer(self, now: float, key: str) -> list[Command]:
        if self.finished or key != self._timer_key:
            return []  # a step whose timing changed since
        last = self._next_step(now)
        if last is not None:
            return last
        out: list[Command] = []
        want = self.need(self.step)
        if not self.chain and self.current is not None and want != self.held:
            out.extend(self._update(now, want))
        out.extend(self._schedule(now))
        return out

    # -- internals ---------------------------------------------------------------------------------------
    def _next_step(self, now: float) -> list[Command] | None:
        """The step whose timer fired is done: on to the next one; past the last, the commands that end the
        application."""
        self._advance(now)
        self.step += 1
        self.progress = 0.0
        self._timer_key = None
        return self._finish(now) if self.step >= self.steps else None

    def _advance(self, now: float) -> None:
        """Account for the time since the last change, on the nodes held meanwhile."""
        dt = now - self._last
        if dt > 0 and self.started_at is not None and self.end_time is None:
            self.node_seconds += self.held * dt
            if self.held > 0:
                self.progress += dt / model.step_time(self.held, self.sizes[self.step])
            else:
                self.paused_seconds += dt
        self._last = max(self._last, now)

    def _schedule(self, now: float) -> list[Command]:
        """A timer at the end of the current step, at the current rate (none while paused)."""
        self._gen += 1
        self._timer_key = None
        if self.held <= 0:
            return []
        self._timer_key = f"step:{self.step}:{self._gen}"
        left = max(0.0, 1.0 - self.progress) * model.step_time(self.held, self.sizes[self.step])
        return [Timer(now + left, self._timer_key)]

    def _set_held(self, now: float, n: int) -> list[Command]:
        self._advance(now)
        self.held = n
        return self._schedule(now)

    def _hold(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        self.current, self.nodes = request, tuple(nodes)
        return self._set_held(now, len(nodes))

    def _rest(self, now: float) -> float:
        """What a request sent now may last so that it still ends inside the pre-allocation."""
        assert self.pa_end is not None
        return self.pa_end - now - self.margin

    def _update(self, now: float, want: int) -> list[Command]:
        current, have = self.current, self.held
        assert current is not None and want <= self.preallocation
        interval = self.announce_interval
        if interval > 0 and self._rest(now) - interval > 0:
            bridge, target = self.new_id(), self.new_id()
            specs: tuple[RequestSpec, ...] = (
                RequestSpec(id=bridge, cluster=self.cluster, nodes=have, duration=interval,
                            related_to=current, related_how=Relation.NEXT),
                RequestSpec(id=target, cluster=self.cluster, nodes=want, duration=self._rest(now) - interval,
                            related_to=bridge, related_how=Relation.NEXT),
            )
            released: tuple[str, ...] = ()
        elif self._rest(now) > 0:  # spontaneous (or too late to announce: past the bound of the run)
            target = self.new_id()
            specs = (RequestSpec(id=target, cluster=self.cluster, nodes=want, duration=self._rest(now),
                                 related_to=current, related_how=Relation.NEXT),)
            released = self.nodes[want:] if want < have else ()
        else:
            return []  # too close to the end of the pre-allocation to ask for anything
        self.updates += 1
        self.chain = [s.id for s in specs]
        out: list[Command] = [self.submit(*specs), self.finish(current, released)]
        if released:  # released nodes are not used any more: the step goes on with those it keeps
            self.nodes, self.held = self.nodes[:want], want
        return out

    def _give_back(self) -> list[Command]:
        """Cancel what waits (the last of a chain first, so that nothing starts in between), end what
        runs (the pre-allocation last), close."""
        out: list[Command] = [self.cancel(r) for r in reversed(self.chain) if r in self.waiting]
        out.extend(self.cancel(r) for r in sorted(self.waiting, key=_seq, reverse=True))
        self.chain = []
        for r in [r for r in self.running if r != self.pa]:
            out.append(self.finish(r))
        if self.pa in self.running:
            out.append(self.finish(self.pa))
        self.current, self.nodes = None, ()
        out.extend(self.close())
        return out

    def _finish(self, now: float) -> list[Command]:
        self._advance(now)
        self.end_time = now
        self.held = 0
        return self._give_back()

    def _fail(self, now: float, request: str, reason: str) -> list[Command]:
        self._advance(now)
        self.failed = f"{request} ended: {reason}"
        self.end_time = now
        self.held = 0
        if reason in _GONE:
            self.closed = self.finished = True
            return []
        return self._give_back()
