"""A rigid application (CooRMv2 §IV): one non-preemptible request of fixed size and duration."""

from __future__ import annotations

from coorm.launchers.base import ClusterProps, Command, Launcher, Timer
from coorm.shared.requests import RequestSpec


class RigidLauncher(Launcher):
    kind = "rigid"

    def __init__(
        self, app: str, cluster: str, nodes: int, duration: float, runtime: float | None = None
    ) -> None:
        super().__init__(app)
        self.cluster = cluster
        self.nodes = nodes
        self.duration = duration
        # the user's estimate (duration) is the walltime; the job may really need more or less
        self.runtime = duration if runtime is None else runtime
        self.request: str | None = None

    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        self.request = self.new_id()
        spec = RequestSpec(id=self.request, cluster=self.cluster, nodes=self.nodes, duration=self.duration)
        return [self.submit(spec)]

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        super().on_start(now, request, nodes)
        if self.runtime < self.duration:
            return [Timer(now + self.runtime, "finished")]
        return []  # runs until the RMS ends it at its walltime

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key == "finished" and self.request in self.running:
            return [self.finish(self.request), *self.close()]
        return []

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        super().on_end(now, request, reason)
        return self.close()
