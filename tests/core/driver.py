"""A small script-like driver around the coupled cores for scenario tests: it keeps the clock, records
every decision, and answers "what did the RMS tell app X"."""

from __future__ import annotations

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.events import CloseSession, Done, OpenSession, Submit
from coorm.shared.requests import RequestSpec


def rq(rid: str, cluster: str, nodes: int, duration: float | None = None, type: str = "non-preemptible",
       to: str | None = None, how: str = "FREE") -> RequestSpec:
    return RequestSpec(id=rid, type=type, cluster=cluster, nodes=nodes, duration=duration,
                       related_to=to, related_how=how)


class Driver:
    def __init__(self, clusters: dict[str, int], **settings) -> None:
        # scenarios are easier to read when every event is scheduled at once; tests about coalescing
        # set the interval themselves
        settings.setdefault("reschedule_interval", 0.0)
        self.cores = CoupledCores(PolicySettings(**settings), validate=True)
        self.decisions: list = []
        for name, n in clusters.items():
            self._record(self.cores.register(0.0, name, [f"{name}n{i}" for i in range(n)]))

    # -- acting -------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.cores.now

    @property
    def policy(self):
        return self.cores.policy

    def _record(self, out: list) -> list:
        self.decisions.extend(out)
        return out

    def _advance(self, t: float) -> None:
        """Fire every wake-up that falls before ``t``, as a shell's timer would."""
        while (w := self.cores.next_wakeup()) is not None and w < t:
            self._record(self.cores.tick(max(w, self.now)))

    def open(self, at: float, app: str) -> list:
        self._advance(at)
        return self._record(self.cores.handle(OpenSession(at=at, app=app)))

    def submit(self, at: float, app: str, *requests: RequestSpec) -> list:
        self._advance(at)
        return self._record(self.cores.handle(Submit(at=at, app=app, requests=list(requests))))

    def done(self, at: float, app: str, request: str, released: tuple[str, ...] = ()) -> list:
        self._advance(at)
        return self._record(self.cores.handle(Done(at=at, app=app, request=request, released=released)))

    def close(self, at: float, app: str) -> list:
        self._advance(at)
        return self._record(self.cores.handle(CloseSession(at=at, app=app)))

    def node_down(self, at: float, node: str) -> list:
        self._advance(at)
        return self._record(self.cores.node_down(at, node))

    def register(self, at: float, cluster: str, nodes: list[str]) -> list:
        self._advance(at)
        return self._record(self.cores.register(at, cluster, nodes))

    def tick(self, at: float) -> list:
        return self._record(self.cores.tick(at))

    def run_until(self, t: float) -> None:
        """Follow the cores' wake-ups up to ``t`` (inclusive), as a shell would."""
        self._advance(t)
        while (w := self.cores.next_wakeup()) is not None and w <= t:
            self.tick(max(w, self.now))
        if self.now < t:
            self.tick(t)

    # -- observing ----------------------------------------------------------------------------------
    def of(self, kind: str, **match) -> list:
        return [d for d in self.decisions if d.kind == kind and all(getattr(d, k) == v for k, v in match.items())]

    def started(self, request: str):
        hits = self.of("start", request=request)
        return hits[0] if hits else None

    def ended(self, request: str):
        hits = self.of("end", request=request)
        return hits[0] if hits else None

    def nodes_of(self, request: str) -> tuple[str, ...]:
        return self.cores.allocator.nodes_of(request)

    def start_time(self, request: str) -> float:
        return self.policy.requests[request].start

    def np_view(self, app: str, cluster: str):
        return self.policy.schedule.np_view(app, cluster)

    def p_view(self, app: str, cluster: str):
        return self.policy.schedule.p_view(app, cluster)
