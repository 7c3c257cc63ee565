"""The view publisher: ``changeNotify`` to each application when, and only when, one of its views changed;
``listClustersInfo`` and ``listInterClusterInfo`` (DESIGN §2, §3).

The policy engine sends, in paced rounds, the views of the applications whose views changed -- only the
clusters of each application's filter (:class:`~coorm.shared.protocol.ViewsEpoch`); this service compares them with
what it last sent each application, per cluster and view type, and sends only the changes
(:class:`~coorm.launchers.delivery.ViewDeliverer`, the simulator's too). Cluster
properties come from the agents' registrations (``keys.NODES``) and an optional inventory file (speeds, WAN
latencies and bandwidths)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import structlog
import yaml
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, ConfigDict, Field

from coorm.launchers.delivery import ViewDeliverer
from coorm.services.runtime import redis_client, stay_in_the_cluster
from coorm.shared import bus, keys, metrics, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import (
    AppViews,
    Change,
    ChangeNotify,
    ChangeType,
    ClusterInfo,
    ClustersInfoReply,
    InfoQuery,
    InterClusterInfoReply,
    Link,
    ViewsEpoch,
    ViewsQuery,
)
from coorm.shared.settings import Settings
from coorm.shared.stepfn import StepFunction
from coorm.shared.tasks import cancelled

log = structlog.get_logger("coorm.view_publisher")

DEFAULT_LATENCY_MS = 10.0
DEFAULT_BANDWIDTH_MBPS = 1000.0


Views = tuple[StepFunction, StepFunction | None]  # a cluster's non-preemptive view, preemptive view or None


def _functions(v: AppViews, made: dict[int, Views]) -> Views:
    """``v``'s views as step functions, made once per message for a view that many applications share."""
    fns = made.get(id(v))
    if fns is None:
        fns = made[id(v)] = (StepFunction.from_wire(v.non_preemptive),
                             None if v.preemptive is None else StepFunction.from_wire(v.preemptive))
    return fns


def _app_prefix(app: str) -> bytes:
    """How a ``ChangeNotify``'s JSON starts (its first field is the application, an identifier: nothing in
    it is escaped), so that the rest, the same for every application told the same, is encoded once."""
    return b'{"app":"' + app.encode() + b'"'


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    speed: float = Field(default=1.0, gt=0)


class Inventory(BaseModel):
    """The operator's inventory file (YAML)::

        clusters: {c0: {speed: 1.0}, c1: {speed: 1.2}}
        links: [{a: c0, b: c1, latency_ms: 12, bandwidth_mbps: 10000}]
    """

    model_config = ConfigDict(extra="forbid")
    clusters: dict[str, ClusterSpec] = Field(default_factory=dict)
    links: list[Link] = Field(default_factory=list)

    @classmethod
    def load(cls, path: Path | None) -> Inventory:
        if path is None:
            return cls()
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})


class ViewPublisher:
    def __init__(self, settings: Settings, name: str = "view-publisher") -> None:
        self.settings = settings
        self.name = name
        self.inventory = Inventory.load(settings.inventory)
        self.told = ViewDeliverer()  # what each application was last told, per cluster and view type
        self.current: dict[str, dict[str, object]] = {}  # app -> cluster -> its latest AppViews
        self.latest_epoch = (0, 0.0)
        self._lock = asyncio.Lock()  # an epoch and a refresh never interleave
        self.ready = asyncio.Event()
        self._syncing: asyncio.Task | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self.redis = redis_client(self.settings.redis_url)
        self.nc = await bus.connect(self.settings.nats_url, self.name, self.settings.identity(Role.SERVICE),
                                    reconnected_cb=self._reconnected)
        subs = [
            await bus.serve(self.nc, subjects.SCHEDULE_EPOCH, ViewsEpoch, self._on_epoch),
            # (each on its own: one waiting on Valkey -- a failover -- must not hold every other)
            await bus.serve(self.nc, subjects.CLUSTERS_INFO, InfoQuery, self._on_info, concurrent=True),
            await bus.serve(self.nc, subjects.CLUSTERS_INTERINFO, InfoQuery, self._on_interinfo, concurrent=True),
            await bus.serve(self.nc, subjects.APP_VIEWS_ANY, InfoQuery, self._on_refresh),
        ]
        self._syncing = asyncio.create_task(self._sync())
        watch = asyncio.create_task(stay_in_the_cluster(self.nc, self.settings, self.name))
        self.ready.set()
        try:
            await stop.wait()
        finally:
            await cancelled(self._syncing, watch)
            for s in subs:
                with contextlib.suppress(Exception):
                    await s.unsubscribe()
            await bus.shutdown(self.nc)
            await self.redis.aclose()

    async def _reconnected(self) -> None:
        """Views the policy engine sent while this was cut from NATS are lost (core NATS; in a cluster, the
        engine on another server goes on sending them): ask for every view again. An application whose
        first views were lost so waited for them for ever."""
        if self._syncing is None or self._syncing.done():
            self._syncing = asyncio.create_task(self._sync())

    async def _sync(self) -> None:
        """After a (re)start: ask the policy engine for every view, until a leader answers."""
        pause = 0.5
        while True:
            try:
                offset = 0
                while True:  # a page of applications at a time: one reply for all may not fit a message
                    epoch = await bus.call(self.nc, subjects.VIEWS_QUERY, ViewsQuery(offset=offset), ViewsEpoch,
                                           timeout=5.0)
                    await self._on_epoch(epoch, None)
                    if not epoch.more:
                        return
                    offset += len(epoch.views)
            except (NoRespondersError, NatsTimeout):
                pass  # no leader yet
            except Exception:  # noqa: BLE001 - a refusal or a failure now must not end the views for good
                log.exception("views not synchronised: retrying")
                pause = min(pause * 2, 5.0)
            await asyncio.sleep(pause)  # retry later (a poll with back-off: nothing to wait on)

    # -- views ----------------------------------------------------------------------------------------
    async def _on_epoch(self, msg: ViewsEpoch, raw: Msg | None) -> None:
        async with self._lock:
            self.latest_epoch = (msg.epoch, msg.now)
            for app in msg.closed:
                self.told.forget(app)
                self.current.pop(app, None)
            # a view many applications share (one object in the message) is read and encoded once: what
            # each of them is told differs only by its name when they were told the same before
            functions: dict[int, Views] = {}
            encoded: dict[tuple, bytes] = {}
            same: dict = {}
            sent = sent_bytes = 0
            try:  # (what went out is counted, even if a publish fails)
                for app, per_cluster in msg.app_views().items():
                    self.current.setdefault(app, {}).update(per_cluster)
                    told = self.told.changes(app, {c: _functions(v, functions) for c, v in per_cluster.items()}, same)
                    if not told:
                        continue
                    key = tuple((c, typ, id(view)) for c, typ, view in told)
                    tail = encoded.get(key)
                    if tail is None:
                        changes = [Change(cluster=c, type=ChangeType(typ), cap=view.to_wire()) for c, typ, view in told]
                        data = bus.encode(ChangeNotify(app=app, epoch=msg.epoch, now=msg.now, changes=changes))
                        encoded[key] = data[len(_app_prefix(app)):]
                    else:
                        data = _app_prefix(app) + tail
                    await self.nc.publish(subjects.notify_change(app), data)
                    sent += 1
                    sent_bytes += len(data)
            finally:
                if sent:
                    metrics.notifications.labels("change").inc(sent)
                    metrics.notification_bytes.labels("change").inc(sent_bytes)
        return None

    def _changes(self, app: str, per_cluster: dict) -> list[Change]:
        views = {c: _functions(v, {}) for c, v in per_cluster.items()}
        return [Change(cluster=c, type=ChangeType(typ), cap=view.to_wire())
                for c, typ, view in self.told.changes(app, views)]

    async def _on_refresh(self, msg: InfoQuery, raw: Msg) -> ChangeNotify:
        """Every current view of the application: a launcher asks once it has subscribed, since the first
        ``changeNotify`` may have gone out before it listened."""
        app = subjects.app_of(raw.subject)
        async with self._lock:
            self.told.forget(app)
            epoch, now = self.latest_epoch
            changes = self._changes(app, self.current.get(app, {}))
            return ChangeNotify(app=app, epoch=epoch, now=now, changes=changes)

    # -- cluster info ---------------------------------------------------------------------------------
    async def _on_info(self, msg, raw: Msg) -> ClustersInfoReply:
        per: dict[str, list[dict]] = {}
        for rec in (json.loads(v) for v in (await self.redis.hgetall(keys.NODES)).values()):
            per.setdefault(rec["cluster"], []).append(rec)
        out = []
        for cluster, nodes in sorted(per.items()):
            up = [n for n in nodes if n.get("state") == "up"]
            spec = self.inventory.clusters.get(cluster, ClusterSpec())
            out.append(ClusterInfo(id=cluster, nodes=len(up),
                                   cores_per_node=min((n["cores"] for n in up), default=0),
                                   memory_mb_per_node=min((n["memory_mb"] for n in up), default=0),
                                   speed=spec.speed))
        return ClustersInfoReply(clusters=out)

    async def _on_interinfo(self, msg, raw: Msg) -> InterClusterInfoReply:
        clusters = sorted({json.loads(v)["cluster"] for v in (await self.redis.hgetall(keys.NODES)).values()})
        known = {frozenset((lk.a, lk.b)): lk for lk in self.inventory.links}
        links = []
        for i, a in enumerate(clusters):
            for b in clusters[i + 1:]:
                links.append(known.get(frozenset((a, b))) or Link(
                    a=a, b=b, latency_ms=DEFAULT_LATENCY_MS, bandwidth_mbps=DEFAULT_BANDWIDTH_MBPS))
        return InterClusterInfoReply(links=links)


async def main(settings: Settings | None = None, stop: asyncio.Event | None = None) -> None:
    from coorm.services.runtime import stop_on_signals

    settings = settings or Settings()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    await ViewPublisher(settings).run(stop or stop_on_signals())
