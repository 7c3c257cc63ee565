"""A fully-predictably evolving application (CooRMv2 §IV): its phases are known at start and sent at
once as non-preemptible requests linked by NEXT. The RMS keeps its nodes from one phase to the next,
adding nodes when a phase grows and taking back the surplus when it shrinks."""

from __future__ import annotations

from coorm.launchers.base import ClusterProps, Command, Launcher
from coorm.shared.requests import RequestSpec


class NextChainLauncher(Launcher):
    kind = "next"

    def __init__(self, app: str, cluster: str, phases: list[tuple[int, float]]) -> None:
        super().__init__(app)
        if not phases:
            raise ValueError("a NEXT chain needs at least one phase")
        self.cluster = cluster
        self.phases = [(int(n), float(d)) for n, d in phases]
        self.ids: list[str] = []

    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        specs = []
        for nodes, duration in self.phases:
            rid = self.new_id()
            prev = self.ids[-1] if self.ids else None
            specs.append(RequestSpec(id=rid, cluster=self.cluster, nodes=nodes, duration=duration,
                                     related_to=prev, related_how="NEXT" if prev else "FREE"))
            self.ids.append(rid)
        return [self.submit(*specs)]

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        super().on_end(now, request, reason)
        if request == self.ids[-1] or reason not in ("next",):
            # the last phase reached its end, or the chain was broken (node failure...): stop
            cancel = [self.cancel(r) for r in self.ids if r in self.waiting]
            return cancel + self.close()
        return []
