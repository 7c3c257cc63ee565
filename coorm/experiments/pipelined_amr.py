"""An AMR that pipelines its announced updates: the factor EXPERIMENTS.md's hypothesis about CooRMv2 Fig. 10
names. Used by :mod:`coorm.experiments.coormv2_fig10` only; the shipped launcher is
:class:`coorm.launchers.amr.AMRLauncher`.

The shipped AMR keeps one update in flight: with announce interval ``I`` it re-evaluates its need only
once its last update's target has started, so it changes its allocation about every ``I`` seconds (or
less often). The paper's text does not say whether its AMR waited: "the node-count in the update is equal
to the node-count required at the moment the update was initiated" (CooRMv2 §V-C). This variant announces
at *every* step boundary whose need differs from the last count it announced, each update taking effect
``I`` seconds after it was initiated, so that its allocation follows its need one interval late, step by
step (steps last ~15 s).

How, with the protocol's requests: a chain ``current -> t1 -> t2 ...`` of NEXT requests. An announced
update with nothing in flight is the shipped one (a bridge of the held count lasting ``I``, then the
target). With updates in flight, the last target (waiting, open-ended) is cancelled and sent again with a
duration that ends it at ``now + I``, and the new target follows it (NEXT): the RMS hands each over to the
next at its walltime. Node counts and durations of the chain are the launcher's own bookkeeping.
"""

from __future__ import annotations

from coorm.launchers.amr import AMRLauncher
from coorm.launchers.base import Command
from coorm.shared.requests import Relation, RequestSpec

MIN_DURATION = 1.0  # a re-sent target shorter than this is not worth an update: the next step decides


class PipelinedAMR(AMRLauncher):
    kind = "amr"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.specs: dict[str, tuple[int, float]] = {}  # request -> (nodes, duration)
        self.began: dict[str, float] = {}  # request -> its start

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        self.began[request] = now
        return super().on_start(now, request, nodes)

    def on_timer(self, now: float, key: str) -> list[Command]:
        if self.finished or key != self._timer_key or self.announce_interval <= 0 or self.static:
            return super().on_timer(now, key)
        last = self._next_step(now)
        if last is not None:
            return last
        out: list[Command] = []
        want = self.need(self.step)
        if self.current is not None:
            if not self.chain and want != self.held:
                out.extend(self._update(now, want))
                self._remember(now)
            elif self.chain and want != self.specs[self.chain[-1]][0]:
                out.extend(self._pipeline(now, want))
        out.extend(self._schedule(now))
        return out

    def _remember(self, now: float) -> None:
        """The bridge and target :meth:`AMRLauncher._update` just asked for (their sizes and durations)."""
        if len(self.chain) == 2:
            bridge, target = self.chain
            self.specs[bridge] = (self.held, self.announce_interval)
            self.specs[target] = (self.need(self.step), self._rest(now) - self.announce_interval)

    def _planned_end(self, request: str) -> float:
        """When a request of the chain ends: its predecessor's end plus its duration."""
        if request == self.current:
            return self.began.get(request, 0.0) + self.specs.get(request, (0, float("inf")))[1]
        i = self.chain.index(request)
        before = self.chain[i - 1] if i > 0 else self.current
        assert before is not None
        return self._planned_end(before) + self.specs[request][1]

    def _pipeline(self, now: float, want: int) -> list[Command]:
        """Cut the last target at ``now + I`` and add one of ``want`` nodes after it."""
        last = self.chain[-1]
        before = self.chain[-2] if len(self.chain) > 1 else self.current
        assert before is not None
        at = now + self.announce_interval
        start = self._planned_end(before)
        rest = self._rest(now) - self.announce_interval
        if at - start < MIN_DURATION or rest <= 0:
            return []
        cut, target = self.new_id(), self.new_id()
        nodes = self.specs[last][0]
        specs = (RequestSpec(id=cut, cluster=self.cluster, nodes=nodes, duration=at - start, related_to=before,
                             related_how=Relation.NEXT),
                 RequestSpec(id=target, cluster=self.cluster, nodes=want, duration=rest, related_to=cut,
                             related_how=Relation.NEXT))
        self.specs[cut], self.specs[target] = (nodes, at - start), (want, rest)
        self.chain[-1:] = [cut, target]
        self.updates += 1
        return [self.cancel(last), self.submit(*specs)]
