"""Every service of CooRM and agents emulating the nodes, in one asyncio loop, against running servers.
Each part still talks to the others only over NATS and keeps its state in Redis, as the separate
processes of ``coorm up`` do; this form lets tests reach into each part and stop one at will."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from coorm.node_agent.agent import Agent
from coorm.node_agent.nodes import host_node_info
from coorm.services.batch.service import BatchService
from coorm.services.node_allocator.service import NodeAllocatorService
from coorm.services.policy_engine.service import PolicyEngine
from coorm.services.view_publisher.service import ViewPublisher
from coorm.shared.settings import Settings

log = structlog.get_logger("coorm.stack")


def node_names(cluster: str, n: int) -> list[str]:
    return [f"{cluster}n{i}" for i in range(n)]


async def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll a condition on state another task changes, with a deadline (no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class _Part:
    obj: object
    stop: asyncio.Event
    task: asyncio.Task


@dataclass
class LocalStack:
    settings: Settings
    clusters: dict[str, int]
    with_engine: bool = True  # False: a policy engine runs elsewhere (another process)
    with_batch: bool = False  # the batch service too
    agents: dict[str, Agent] = field(default_factory=dict)
    parts: dict[str, _Part] = field(default_factory=dict)

    @property
    def engine(self) -> PolicyEngine:
        return self.parts["policy-engine"].obj  # type: ignore[return-value]

    @property
    def allocator(self) -> NodeAllocatorService:
        return self.parts["node-allocator"].obj  # type: ignore[return-value]

    @property
    def publisher(self) -> ViewPublisher:
        return self.parts["view-publisher"].obj  # type: ignore[return-value]

    @property
    def batch(self) -> BatchService:
        return self.parts["batch"].obj  # type: ignore[return-value]

    async def start_batch(self) -> BatchService:
        """(Again, after :meth:`stop_part`: a new instance takes the queue up from Redis.)"""
        self._spawn("batch", BatchService(self.settings))
        await self._ready(self.batch.ready, "batch")
        return self.batch

    def _spawn(self, name: str, obj) -> None:
        stop = asyncio.Event()
        self.parts[name] = _Part(obj, stop, asyncio.create_task(obj.run(stop), name=name))

    async def start(self) -> LocalStack:
        if self.with_engine:
            self._spawn("policy-engine", PolicyEngine(self.settings))
            await self._ready(self.engine.leader, "policy-engine")
        self._spawn("node-allocator", NodeAllocatorService(self.settings))
        await self._ready(self.allocator.ready, "node-allocator")
        self._spawn("view-publisher", ViewPublisher(self.settings))
        await self._ready(self.publisher.ready, "view-publisher")
        for cluster, n in self.clusters.items():
            agent = Agent(self.settings, f"agent-{cluster}", cluster,
                          host_node_info(node_names(cluster, n), cores=1, memory_mb=1024))
            await agent.start()
            self.agents[cluster] = agent
        await self.wait_nodes_up()
        if self.with_batch:
            await self.start_batch()
        return self

    async def wait_nodes_up(self, timeout: float = 15.0) -> None:
        """Until the policy engine (wherever it runs) has every node up."""
        from coorm.shared import bus, subjects
        from coorm.shared.protocol import StatusQuery, StatusReply

        deadline = time.monotonic() + timeout
        while True:
            try:
                st = await bus.call(self.allocator.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=2)
                up = {c.cluster: c.up for c in st.clusters}
                if all(up.get(c) == n for c, n in self.clusters.items()):
                    return
            except Exception:  # noqa: BLE001 - no leader yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("every node up")
            await asyncio.sleep(0.02)  # polling the engine's status: there is nothing to wait on

    async def _ready(self, event: asyncio.Event, name: str) -> None:
        waiter = asyncio.create_task(event.wait())
        done, _ = await asyncio.wait({waiter, self.parts[name].task}, timeout=15,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            task = self.parts[name].task
            if task.done():
                task.result()  # raises what stopped it
            raise TimeoutError(f"{name} did not become ready")

    async def stop_part(self, name: str) -> None:
        part = self.parts.pop(name)
        part.stop.set()
        await asyncio.wait_for(part.task, 15)

    async def stop(self) -> None:
        for cluster, agent in self.agents.items():
            await self._timed(f"agent-{cluster}", agent.stop())
        for name in list(self.parts)[::-1]:
            await self._timed(name, self.stop_part(name))

    @staticmethod
    async def _timed(name: str, coro) -> None:
        t = time.monotonic()
        try:
            await asyncio.wait_for(coro, 15)
        except Exception as e:  # noqa: BLE001 - stop the others regardless
            log.warning("could not stop cleanly", part=name, error=repr(e))
        if time.monotonic() - t > 2:
            log.warning("slow to stop", part=name, seconds=round(time.monotonic() - t, 1))

    async def __aenter__(self) -> LocalStack:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc) -> None:
        await self.stop()
