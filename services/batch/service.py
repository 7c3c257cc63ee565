"""The batch service: the RMS hosts its users' batch jobs (``coorm batch``, ``coorm submit --no-wait``).

Theory of operation
* A submission is one request on ``batch.submit.<user>`` (NATS authenticated the user the subject names). It
  is checked (its array and dependencies parsed again, its size against the cluster's), written to Redis
  (``keys.BATCH_SPECS``: what was submitted, once for an array; ``keys.BATCH_JOBS``: a small state record
  per job), and only then answered with the job's id. A queued job costs a record, not a process.
* :class:`~coorm.services.batch.core.BatchCore` decides which jobs go to the RMS (holds, dependencies,
  array throttles). For each that goes, this service does what a user's launcher would: it opens a session
  *as the job's user* (it holds the services' identity, which may), lets the shipped rigid launcher object
  make its request, and runs it with :class:`~coorm.launchers.live.LiveRunner`: the RMS's policy decides
  when it starts; the node agents start its processes as the user, in its directory, with its environment,
  writing its output to its ``-o``/``-e`` files themselves (nothing goes through this service).
* Every step is written down (session, request, start, processes launched and exited): a service that was
  killed and started again takes each session up where it was (:meth:`Session.resume`: what started,
  ended or exited meanwhile is asked for), within the session timeout; past it, the RMS has reaped the
  session and killed its processes, and the job is recorded as failed with that reason.
* Arrays' tasks, and a user's separate jobs of one shape (cluster, nodes, walltime) when they are not attached,
  run in **task farms** (:mod:`coorm.services.batch.farm_runner`): a session for many jobs, whose requests
  (slots) each run the jobs one after the other -- a ``true`` costs some milliseconds of the system's CPU, not
  a session's seventy. See :meth:`BatchService._shape_farm` for which farm a separate job joins, and why that
  keeps the RMS's priorities.
* An ended job's record moves to ``keys.BATCH_HISTORY`` (indexed by end time in ``keys.BATCH_ENDED``; kept
  ``batch_history_days``), which ``coorm history`` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import json
import math
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from nats.aio.msg import Msg

from coorm.batch import jobscript
from coorm.launchers.base import ClusterProps
from coorm.launchers.live import LiveRunner, Resumed, RunResult
from coorm.launchers.rigid import RigidLauncher
from coorm.launchers.sdk import Exited, Killed, Session, SessionReaped, Started
from coorm.services.batch.core import (
    ENDED,
    BatchCore,
    BatchError,
    Dep,
    Enter,
    Job,
    JobState,
    Withdraw,
)
from coorm.services.batch.farm_runner import FarmRunner
from coorm.services.runtime import clock, redis_client, stay_in_the_cluster
from coorm.shared import bus, keys, subjects
from coorm.shared.endpoints import Role
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import (
    AGENT_KILL_REASONS,
    BatchAttached,
    BatchControl,
    BatchControlReply,
    BatchJob,
    BatchQuery,
    BatchQueryReply,
    BatchSubmit,
    BatchSubmitReply,
    NodesEvent,
    SessionOpenReply,
    StatusQuery,
    StatusReply,
)
from coorm.shared.settings import Settings
from coorm.shared.tasks import cancelled

_REAPED = ("its session ended while the batch service could not be heard (stopped or cut off for the session "
           "timeout): its processes were killed")


def _reaped(e: SessionReaped) -> str:
    """A job's reason when the RMS ended its session unheard: with the RMS's own word when it said it."""
    return f"{_REAPED} ({e.said})" if e.said else _REAPED
log = structlog.get_logger("coorm.batch")

NO_PROPS = ClusterProps(nodes={})  # a rigid launcher does not read them: two requests per job spared
KEEP_ENDED = 300.0  # seconds an ended job stays in the queue (a dependency may still name it), as Slurm's MinJobAge
SWEEP_EVERY = 30.0
SIZES_FOR = 2.0  # seconds the clusters' sizes are trusted (a submission's check: every node record read costs)
# an attached job's command is asked whether it still listens this often; gone this long (not just cut off by a
# NATS restart, which its command rides over), its job is cancelled, as srun's is when srun is killed
ATTACH_PROBE_EVERY = 2.0
ATTACH_GRACE = 10.0
# A separate job joins its shape's current farm while that farm's session opened less than this ago. The RMS
# orders applications by when their session opened, so a job in a farm takes the farm's priority: at most
# JOIN_YOUNG seconds earlier than a session of its own would have had. Since a farm takes only consecutive
# entries (_shape_farm: a batch job entered meanwhile ends the run), what such a job can pass is only an
# application opened outside the batch queue (coorm launch, the SDK) at most JOIN_YOUNG seconds before it,
# and only where both wait (on a cluster with free nodes neither does). Two seconds: a stream of like jobs (a
# script's loop, parallel submitters) mostly shares a farm -- on this 2-core machine 200 `true` jobs from 4
# submitters opened 12 farms with 1 s, 7 with 2 s (each farm costs a session's open and close, its slots'
# requests, starts and ends: ~60 ms of CPU over the system) -- and the inversion stays small against any
# wait that matters (fair-start holds nodes 5 s by default). Past it a new farm, with the priority of now,
# takes the shape's new jobs; the old one runs what it has, lends its idle slots to like jobs (held already:
# no request of theirs would start sooner) and closes.
JOIN_YOUNG = 2.0

# a job script runs from a private copy (the agent runs argv; a script is text): written as the user, in the
# user's TMPDIR, removed when it ends; its text comes in the environment (not visible in ps, unlike argv)
SCRIPT_RUNNER = (
    'umask 077; f=$(mktemp "${TMPDIR:-/tmp}/coorm-job.XXXXXX") || exit 1; '
    "trap 'rm -f \"$f\"' EXIT; trap 'exit 143' TERM INT HUP; "
    'printf "%s" "$COORM_JOB_SCRIPT" > "$f" && chmod 700 "$f" || exit 1; unset COORM_JOB_SCRIPT; '
    '"$f" "$@"'
)


@dataclass
class Record:
    """What this service keeps of a job in Redis (``keys.BATCH_JOBS``): the core's fields and its session."""

    id: str
    spec: str  # the submission's id (the job's own, or its array's)
    user: str
    name: str
    seq: int
    submitted: float
    state: str
    reason: str = ""
    array_id: str | None = None
    task: int | None = None
    deps: list[list] = field(default_factory=list)  # [[kind, [jobs]], ...]
    deps_any: bool = False
    throttle: int | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    session: dict | None = None  # SessionOpenReply, once a session is open for it
    node_ids: list[str] = field(default_factory=list)
    launched: list[list] = field(default_factory=list)  # [[node, pid, request], ...]
    exited: list[list] = field(default_factory=list)  # [[node, pid], ...]
    farmed: bool = False  # run by a task farm (its session is the farm's)
    slot: str | None = None  # the farm's request (slot) it runs on
    farm: str | None = None  # the farm's id (None in records written before shape farms: its array's id)

    def to_job(self, nodes: int) -> Job:
        return Job(id=self.id, user=self.user, name=self.name, seq=self.seq, submitted=self.submitted,
                   state=JobState(self.state), array_id=self.array_id, task=self.task,
                   deps=tuple(Dep(k, tuple(js)) for k, js in self.deps), deps_any=self.deps_any,
                   reason=self.reason, started=self.started, ended=self.ended, exit_code=self.exit_code, nodes=nodes)


class BatchService:
    def __init__(self, settings: Settings, clock=clock) -> None:
        self.settings = settings
        self.clock = clock
        self.core = BatchCore()
        self.records: dict[str, Record] = {}
        self.specs: dict[str, dict] = {}  # spec id -> {"submit": BatchSubmit, "user", "submitted"}
        self.runners: dict[str, asyncio.Task] = {}
        self.sessions: dict[str, Session] = {}
        self.ready = asyncio.Event()
        self.nc: Any = None  # (set once connected, in run())
        self.redis: Any = None
        self._closing: set[asyncio.Task] = set()
        self._to_enter: list[tuple[int, int, str]] = []  # eligible jobs, by submission order
        self._enter_wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one command at a time changes the queue (a handler awaits Redis)
        self._attached: dict[str, _Attached] = {}  # job -> its command's events, for attached jobs
        self._sizes: tuple[float, dict[str, int]] | None = None  # (when, nodes per cluster), read again after
        self.farms: dict[str, FarmRunner] = {}  # farm id -> its task farm (while it has tasks to run)
        self.shapes: dict[tuple, list[str]] = {}  # (user, cluster, nodes, walltime) -> its farms, the newest last
        self.drained: set[str] = set()  # nodes an operator drains: a farm's slot there starts no new job
        self.entries = 0  # jobs handed to the RMS so far (their order: a farm takes only consecutive ones)
        self.opening = asyncio.Lock()  # farms open their sessions one at a time, in the order they were made
        self._farm_runs: set[asyncio.Task] = set()

    # ============================================================================================
    # life
    # ============================================================================================
    async def run(self, stop: asyncio.Event) -> None:
        self.redis = redis_client(self.settings.redis_url, ride_over=self.settings.reconnect_window)
        self.nc = await bus.connect(self.settings.nats_url, "batch", self.settings.identity(Role.SERVICE),
                                    reconnected_cb=self._reconnected)
        background: list[asyncio.Task] = []
        try:
            # (a copy of the operators' drains, which the policy engine serves: a farm's slot on a drained
            # node must not start the farm's next job there)
            drains = await self.nc.subscribe(subjects.NODES_EVENT, cb=self._on_nodes_event)
            await self._load()
            subs = [
                await bus.serve(self.nc, subjects.BATCH_SUBMIT_ANY, BatchSubmit, self._on_submit, concurrent=True),
                await bus.serve(self.nc, subjects.BATCH_CANCEL_ANY, BatchControl, self._on_cancel, concurrent=True),
                await bus.serve(self.nc, subjects.BATCH_HOLD_ANY, BatchControl, self._on_hold, concurrent=True),
                await bus.serve(self.nc, subjects.BATCH_RELEASE_ANY, BatchControl, self._on_release,
                                concurrent=True),
                await bus.serve(self.nc, subjects.BATCH_QUERY, BatchQuery, self._on_query, concurrent=True),
                drains,
            ]
            sweeper = asyncio.create_task(self._sweep(stop))
            opener = asyncio.create_task(self._opener())
            background = [sweeper, opener, asyncio.create_task(stay_in_the_cluster(self.nc, self.settings, "batch"))]
            self.ready.set()
            log.info("batch service ready", jobs=len(self.records))
            done, _ = await asyncio.wait({asyncio.create_task(stop.wait()), opener},
                                         return_when=asyncio.FIRST_COMPLETED)
            if opener in done:
                opener.result()  # (NATS lost for good: the service ends, its supervisor starts another)
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        finally:
            with contextlib.suppress(Exception):  # (what failed was raised above, or is the next instance's)
                await cancelled(*background)
            # the jobs go on: their sessions are taken up by the next instance (within the session timeout)
            for a in self._attached.values():
                a.close()
            with contextlib.suppress(Exception):  # (a job runner that failed: the next instance takes its job up)
                await cancelled(*self.runners.values(), *self._farm_runs)
            await bus.shutdown(self.nc)
            await self.redis.aclose()

    async def _reconnected(self) -> None:
        """NATS is back: the starts, ends and exits sent to the jobs' sessions while it was cut are lost
        (a job whose process exited then would run for ever): each session asks for them."""
        log.info("NATS connection back: the jobs' sessions ask what they missed", sessions=len(self.sessions))
        for session in [*self.sessions.values(), *(f.session for f in self.farms.values() if f.session)]:
            session.reconnected()

    async def _on_nodes_event(self, raw: Msg) -> None:
        try:
            msg = NodesEvent.model_validate_json(raw.data)
        except ValueError:
            return  # (the policy engine answers it with the error)
        if msg.kind not in ("drain", "resume"):
            return
        on = msg.kind == "drain"
        (self.drained.update if on else self.drained.difference_update)(msg.nodes)
        for farm in self.farms.values():
            farm.drain(list(msg.nodes), on)

    async def _load(self) -> None:
        """The queue as the last instance left it: every job not ended, and those ended lately (a dependency
        may name them); sessions taken up, eligible jobs entered."""
        assert self.redis is not None
        self.drained |= set(await self.redis.hkeys(keys.NODE_DRAINS))
        specs = await self.redis.hgetall(keys.BATCH_SPECS)
        for sid, raw in specs.items():
            d = json.loads(raw)
            self.specs[sid] = {"submit": BatchSubmit.model_validate(d["submit"]), "user": d["user"],
                               "submitted": d["submitted"]}
        raw_jobs = await self.redis.hgetall(keys.BATCH_JOBS)
        recs = sorted((Record(**json.loads(v)) for v in raw_jobs.values()), key=lambda r: r.seq)
        recent = await self.redis.zrangebyscore(keys.BATCH_ENDED, self.clock() - KEEP_ENDED, "+inf")
        ended = await self.redis.hmget(keys.BATCH_HISTORY, recent) if recent else []
        for raw in ended:
            if raw is None:
                continue
            info = BatchJob.model_validate_json(raw)
            if info.id in raw_jobs:
                continue
            recs.append(Record(id=info.id, spec="", user=info.user, name=info.name, seq=_seq(info.id),
                               submitted=info.submitted, state=info.state, reason=info.reason,
                               array_id=info.array_id, task=info.task, started=info.started, ended=info.ended,
                               exit_code=info.exit_code))
        recs.sort(key=lambda r: (r.seq, r.task or 0))
        for r in recs:
            self.records[r.id] = r
        self.core.load([r.to_job(self._nodes(r)) for r in recs],
                       {r.array_id: r.throttle for r in recs if r.array_id and r.throttle})
        self.core.take_changed()
        actions = self.core.settle_all(self.clock())
        farms = await self.redis.hgetall(keys.BATCH_FARMS)
        farmed: dict[str, list[str]] = {}
        for r in recs:
            if r.state in (JobState.QUEUED, JobState.RUNNING) and r.farmed:
                farmed.setdefault(r.farm or r.spec, []).append(r.id)
            elif r.state in (JobState.QUEUED, JobState.RUNNING):
                self._spawn(r.id)
            elif r.state not in ENDED and r.spec in self.specs:
                self._attach(r.id, self.specs[r.spec]["submit"])  # waiting: its command is watched
        for sid, tasks in farmed.items():
            if sid in farms:
                self._start_farm(sid, tasks[0], resume=json.loads(farms[sid]), members=tasks)
            else:  # (its farm ended as they were entered: they run in a new one)
                self.farm_again(sid, [t for t in tasks if self.core.jobs[t].state is JobState.QUEUED])
                for t in tasks:
                    if self.core.jobs[t].state is JobState.RUNNING:
                        await self._end(t, JobState.NODE_FAIL, None, "its task farm was lost")
        for sid in set(farms) - set(farmed):
            await self._close_stale_farm(sid, json.loads(farms[sid]))
        await self._flush()
        self._act(actions)

    def _nodes(self, r: Record) -> int:
        spec = self.specs.get(r.spec)
        return spec["submit"].nodes if spec else 0

    async def _sweep(self, stop: asyncio.Event) -> None:
        """Ended jobs leave the queue after ``KEEP_ENDED`` (their history stays), old history goes."""
        assert self.redis is not None
        while not stop.is_set():
            await asyncio.sleep(SWEEP_EVERY)  # the sweep's period
            now = self.clock()
            async with self._lock:
                old = [j.id for j in self.core.jobs.values()
                       if j.state in ENDED and (j.ended or now) < now - KEEP_ENDED]
                for job in old:
                    self.core.forget(job)
                    self.records.pop(job, None)
            horizon = now - self.settings.batch_history_days * 86400
            old = await self.redis.zrangebyscore(keys.BATCH_ENDED, "-inf", horizon, start=0, num=10_000)
            if old:
                async with self.redis.pipeline(transaction=True) as p:
                    p.hdel(keys.BATCH_HISTORY, *old)
                    p.zrem(keys.BATCH_ENDED, *old)
                    await p.execute()

    # ============================================================================================
    # commands
    # ============================================================================================
    async def _on_submit(self, msg: BatchSubmit, raw: Msg) -> BatchSubmitReply:
        assert self.redis is not None
        user = subjects.user_of(raw.subject)
        if not msg.argv and msg.script is None and msg.wrap is None:
            raise bus.WireError(ErrorCode.BAD_REQUEST, "nothing to run: give a command or a script")
        if msg.script is not None and msg.wrap is not None:
            raise bus.WireError(ErrorCode.BAD_REQUEST, "a script or a wrapped command line, not both")
        if msg.script is not None and not msg.script.startswith("#!"):
            raise bus.WireError(ErrorCode.BAD_REQUEST, "a script must start with #! (its interpreter)")
        if msg.attach is not None:
            if not msg.attach.startswith(subjects.inbox_user(user) + "."):  # (another's: spam, forged output)
                raise bus.WireError(ErrorCode.FORBIDDEN, f"attach: {msg.attach} is not a subject of {user}'s inbox")
            if msg.array:
                raise bus.WireError(ErrorCode.BAD_REQUEST, "an array cannot be attached: submit it with coorm batch")
        try:
            array = jobscript.parse_array(msg.array, max_tasks=self.settings.batch_max_array) if msg.array else None
            deps = jobscript.parse_dependency(msg.dependency) if msg.dependency else None
        except jobscript.ScriptError as e:
            raise bus.WireError(ErrorCode.BAD_REQUEST, str(e)) from None
        cluster = await self._check_size(msg)
        msg = msg.model_copy(update={"cluster": cluster})
        dep_terms = tuple(Dep(d.kind, tuple(d.jobs)) for d in deps.terms) if deps else ()
        answer = None if msg.submission is None else keys.batch_answer(user, msg.submission)
        async with self._lock:  # (a copy of the submission handled meanwhile has written its job down)
            if (known := await self._answered(answer)) is not None:  # sent again: its reply was lost or late
                log.info("submission sent again: answered with its job", user=user)
                return BatchSubmitReply.model_validate_json(known)
            now = self.clock()
            n = int(await self.redis.incr(keys.BATCH_SEQ))
            sid = str(n)
            name = msg.name or _default_name(msg)
            tasks = array.indices if array else (None,)
            jobs = [Job(id=sid if t is None else f"{sid}_{t}", user=user, name=name, seq=n, submitted=now,
                        state=JobState.BLOCKED, array_id=None if t is None else sid, task=t, deps=dep_terms,
                        deps_any=bool(deps and deps.any_of), nodes=msg.nodes) for t in tasks]
            throttle = array.max_running if array else None
            try:
                actions = self.core.submit(jobs, now, hold=msg.hold, throttle=throttle)
            except BatchError as e:
                raise bus.WireError(ErrorCode.BAD_REQUEST, str(e)) from None
            self.specs[sid] = {"submit": msg, "user": user, "submitted": now}
            for j in jobs:
                self.records[j.id] = Record(id=j.id, spec=sid, user=user, name=name, seq=n, submitted=now,
                                            state=j.state.value, reason=j.reason, array_id=j.array_id, task=j.task,
                                            deps=[[d.kind, list(d.jobs)] for d in dep_terms],
                                            deps_any=j.deps_any, throttle=throttle)
            # written before it is answered: an accepted job is never lost (a job written but not answered --
            # the service died in between -- runs all the same; the user sees it in the queue, and a command
            # sending the same submission again is answered with it). Its submission, its records and its
            # submission id in one transaction: one round trip
            reply = BatchSubmitReply(job=sid, tasks=len(jobs))
            await self._persist_jobs(self.core.take_changed(), spec=(sid, json.dumps({
                "submit": msg.model_dump(mode="json"), "user": user, "submitted": now})),
                answer=None if answer is None else (answer, reply.model_dump_json()))
        log.info("submitted", job=sid, user=user, tasks=len(jobs), nodes=msg.nodes, cluster=cluster)
        if msg.attach is not None and self.core.jobs[sid].state not in ENDED:
            self._attach(sid, msg)  # watched from now: a command killed while its job waits cancels it
        self._act(actions)
        return reply

    async def _answered(self, answer: str | None) -> str | None:
        """The reply already given to a submission or command sent again (``keys.batch_answer``), if any."""
        assert self.redis is not None
        return None if answer is None else await self.redis.get(answer)

    async def _cluster_sizes(self) -> dict[str, int]:
        """Nodes per cluster, up or down (read again after ``SIZES_FOR``)."""
        assert self.redis is not None
        now = self.clock()
        if self._sizes is None or now - self._sizes[0] > SIZES_FOR:
            counted: dict[str, int] = {}
            for rec in (await self.redis.hgetall(keys.NODES)).values():
                c = json.loads(rec)["cluster"]
                counted[c] = counted.get(c, 0) + 1
            self._sizes = (now, counted)
        return self._sizes[1]

    async def _check_size(self, msg: BatchSubmit) -> str:
        """The cluster (the first by name when none is named); a job larger than every node it has, up or
        down, could never start: refused now rather than left to wait for ever."""
        sizes = await self._cluster_sizes()
        if not sizes:
            self._sizes = None  # (none yet: asked again next time)
            raise bus.WireError(ErrorCode.UNAVAILABLE, "no node is registered yet")
        cluster = msg.cluster or sorted(sizes)[0]
        if cluster not in sizes:
            raise bus.WireError(ErrorCode.UNKNOWN_CLUSTER, f"unknown cluster {cluster} (known: "
                                                           f"{', '.join(sorted(sizes))})")
        if msg.nodes > sizes[cluster] and not self.settings.oversize_waits:
            raise bus.WireError(ErrorCode.TOO_LARGE, f"{msg.nodes} nodes: cluster {cluster} has {sizes[cluster]}; "
                                                     "the job could never start")
        return cluster

    def _select(self, user: str, msg: BatchControl) -> list[str]:
        if not msg.jobs and msg.name is None and msg.states is None:
            raise bus.WireError(ErrorCode.BAD_REQUEST, "name the jobs: ids, a name or states")
        if msg.jobs:
            ids = []
            for i in msg.jobs:
                members = self.core.members(i)
                if not members:
                    raise bus.WireError(ErrorCode.UNKNOWN_JOB, f"no job {i}")
                if any(m.user != user for m in members):
                    raise bus.WireError(ErrorCode.FORBIDDEN, f"job {i} is not {user}'s")
                ids += [m.id for m in members]
        else:
            ids = [j.id for j in self.core.jobs.values() if j.user == user]
        return [i for i in ids if (msg.name is None or self.core.jobs[i].name == msg.name)
                and (msg.states is None or self.core.jobs[i].state.value in msg.states)]

    async def _on_cancel(self, msg: BatchControl, raw: Msg) -> BatchControlReply:
        return await self._control("cancel", msg, raw, self.core.cancel)

    async def _on_hold(self, msg: BatchControl, raw: Msg) -> BatchControlReply:
        return await self._control("hold", msg, raw, lambda ids, _now: (self.core.hold(ids), []))

    async def _on_release(self, msg: BatchControl, raw: Msg) -> BatchControlReply:
        return await self._control("release", msg, raw, self.core.release)

    async def _control(self, verb: str, msg: BatchControl, raw: Msg, change) -> BatchControlReply:
        """A user's command on their jobs: ``change(ids, now)`` returns the jobs it changed and what the
        shell must do; the others the user named are ``unchanged``."""
        user = subjects.user_of(raw.subject)
        answer = None if msg.command is None else keys.batch_answer(user, msg.command)
        async with self._lock:
            if (known := await self._answered(answer)) is not None:  # sent again: its reply was lost or late
                log.info(f"{verb} sent again: answered as before", user=user)
                return BatchControlReply.model_validate_json(known)
            ids = self._select(user, msg)
            changed, actions = change(ids, self.clock())
            done = set(changed)
            reply = BatchControlReply(jobs=changed, unchanged=[i for i in ids if i not in done])
            await self._persist_jobs(self.core.take_changed(),
                                     answer=None if answer is None else (answer, reply.model_dump_json()))
        self._act(actions)
        log.info(verb, user=user, jobs=len(changed))
        return reply

    async def _on_query(self, msg: BatchQuery, raw: Msg) -> BatchQueryReply:
        assert self.redis is not None
        now = self.clock()
        if msg.ended:
            since = msg.since if msg.since is not None else now - 86400
            ids = await self.redis.zrangebyscore(keys.BATCH_ENDED, since, "+inf")
            if msg.jobs is not None:
                wanted = set(msg.jobs)
                ids = [i for i in ids if i in wanted or i.split("_")[0] in wanted]
            raws = await self.redis.hmget(keys.BATCH_HISTORY, ids) if ids else []
            jobs = [BatchJob.model_validate_json(r) for r in raws if r is not None]
        else:  # (the page's records only are built: a queue may hold a hundred thousand jobs)
            named = set(msg.jobs) if msg.jobs is not None else None
            states = set(msg.states) if msg.states is not None else None
            live = [j for j in self.core.jobs.values() if j.state not in ENDED
                    and (named is None or j.id in named or (j.array_id or "") in named)
                    and (msg.user is None or j.user == msg.user) and (states is None or j.state.value in states)]
            live.sort(key=lambda j: (j.seq, j.task or 0))
            page = [self._info(j) for j in live[msg.offset:msg.offset + msg.limit]]
            await self._estimate(page)
            return BatchQueryReply(now=now, jobs=page, total=len(live))
        jobs = [j for j in jobs if (msg.user is None or j.user == msg.user)
                and (msg.states is None or j.state in msg.states)]
        jobs.sort(key=lambda j: (_seq(j.id), j.task or 0))
        return BatchQueryReply(now=now, jobs=jobs[msg.offset:msg.offset + msg.limit], total=len(jobs))

    async def _estimate(self, jobs: list[BatchJob]) -> None:
        """When the RMS plans to start each queued job now (its request's start in the schedule): the
        ``Resources`` reason's time. Left out if the policy engine does not answer."""
        queued: dict[str, BatchJob] = {}
        for j in jobs:  # (an array's tasks share their farm's application: its first queued task is the next)
            if j.state == JobState.QUEUED.value and j.app:
                queued.setdefault(j.app, j)
        if not queued:
            return
        try:
            st = await bus.call(self.nc, subjects.QUERY_STATUS, StatusQuery(apps=list(queued), limit=5000),
                                StatusReply, timeout=2)
        except Exception as e:  # noqa: BLE001 - the queue is shown without the estimates
            log.warning("no start estimates: the policy engine did not answer", error=repr(e))
            return
        for r in st.requests:  # (a farm's first slot to start)
            if r.state == "waiting" and r.app in queued and r.start is not None:
                j = queued[r.app]
                j.start_estimate = r.start if j.start_estimate is None else min(j.start_estimate, r.start)

    def _info(self, j: Job) -> BatchJob:
        r = self.records[j.id]
        spec = self.specs.get(r.spec)
        sub: BatchSubmit | None = spec["submit"] if spec else None
        output, error = self._files(j, sub) if sub else ("", "")
        # (built unchecked: every value is this service's own; validating ten thousand of them for a page of
        # coorm queue cost a quarter of its time)
        return BatchJob.model_construct(
            id=j.id, user=j.user, name=j.name, state=j.state.value, reason=j.reason,
            cluster=(sub.cluster or "") if sub else "", nodes=sub.nodes if sub else 0,
            walltime=sub.walltime if sub else 0.0, submitted=j.submitted, started=j.started, ended=j.ended,
            exit_code=j.exit_code, app=self._app_of(r), node_ids=list(r.node_ids), array_id=j.array_id,
            task=j.task, command=_command_text(sub) if sub else "", cwd=sub.cwd if sub else "", output=output,
            error=error, dependency=sub.dependency if sub else None)

    def _app_of(self, r: Record) -> str | None:
        """The application a job is in the RMS as: its session's, or its task farm's."""
        if r.farmed:
            farm = self.farms.get(r.farm or r.spec)
            return farm.core.app or None if farm is not None else None
        return (r.session or {}).get("app")

    # ============================================================================================
    # running jobs
    # ============================================================================================
    def _act(self, actions) -> None:
        for a in actions:
            if isinstance(a, Enter):
                self.entries += 1
                j = self.core.jobs[a.job]
                if j.array_id is not None and self.settings.batch_farm:
                    self._farm(j.array_id).add(a.job)
                    continue
                if self._farmable(j):
                    self._shape_farm(a.job).add(a.job)
                    continue
                heapq.heappush(self._to_enter, (j.seq, j.task or 0, a.job))
                self._enter_wake.set()
            elif isinstance(a, Withdraw):
                r = self.records.get(a.job)
                if r is not None and r.farmed:
                    farm = self.farms.get(r.farm or r.spec)
                    if farm is not None:
                        farm.withdraw(a.job)
                    continue
                s = self.sessions.get(a.job)
                if s is not None:  # closing its session cancels its request or ends its run
                    task = asyncio.create_task(s.close())
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)

    # -- task farms (an array's tasks, a user's like jobs) ---------------------------------------------
    def _farm(self, sid: str) -> FarmRunner:
        farm = self.farms.get(sid)
        return farm if farm is not None else self._start_farm(sid, self.core.arrays[sid][0])

    def _farmable(self, j: Job) -> bool:
        """A separate job runs in its shape's farm: not an attached one (``coorm submit`` streams its output
        through a session of its own), nor one whose session the last instance opened (it is run as it was)."""
        r = self.records.get(j.id)
        if not self.settings.batch_farm or r is None or r.session is not None or r.spec not in self.specs:
            return False
        return self.specs[r.spec]["submit"].attach is None

    def _shape_farm(self, job: str) -> FarmRunner:
        """The farm a separate job joins: one of its shape's farms with an idle slot that can run it at once
        (held already: no request of the job's own would start sooner), else the shape's current farm while
        it is young (``JOIN_YOUNG``: the priority it lends is at most that much older) and took the job
        entered just before this one (none of another's in between, which the farm's priority would pass: 60
        jobs of mixed shapes released at once kept their queue's order so, and the backfill its makespan),
        else a new farm, whose session opens now and which becomes the shape's current one; the older ones
        run what they have and close."""
        r = self.records[job]
        sub: BatchSubmit = self.specs[r.spec]["submit"]
        shape = (r.user, sub.cluster or "", sub.nodes, sub.walltime)
        now = self.clock()
        fids = self.shapes.get(shape, [])
        chosen = next((f for f in map(self.farms.get, fids) if f is not None and f.free(now) > 0), None)
        current = self.farms.get(fids[-1]) if fids else None
        if chosen is None and current is not None and now - current.opened < JOIN_YOUNG \
                and current.last_entry == self.entries - 1:
            chosen = current
        if chosen is None:
            chosen = self._start_farm(f"farm-{uuid.uuid4().hex[:12]}", job)
        chosen.last_entry = self.entries
        return chosen

    def _start_farm(self, sid: str, first: str, resume: dict | None = None,
                    members: list[str] | None = None) -> FarmRunner:
        """``sid``: the farm's id (an array's own); ``first``: a job of it, whose submission gives its shape."""
        r = self.records[first]
        per_job = r.array_id is None
        farm = self.farms[sid] = FarmRunner(self, sid, self.specs[r.spec]["submit"], r.user, per_job=per_job,
                                            opened=self.clock() if resume is None else -math.inf)
        if per_job:
            farm.keep_until = farm.opened + JOIN_YOUNG if resume is None else None
            farm.members.update(members or ())
            self.shapes.setdefault(farm.shape(), []).append(sid)
        task = asyncio.create_task(self._run_farm(farm, resume), name=f"farm-{sid}")
        self._farm_runs.add(task)
        task.add_done_callback(self._farm_runs.discard)
        return farm

    async def _run_farm(self, farm: FarmRunner, resume: dict | None) -> None:
        sub = farm.sub
        try:
            # (the sizes the submissions were checked with, however old: a wait here would let farms made
            # together open their sessions out of order)
            sizes = self._sizes[1] if self._sizes is not None else await self._cluster_sizes()
            farm.core.width = max(1, sizes.get(sub.cluster or "", 1) // max(1, sub.nodes))
            await farm.run(resume)
        except asyncio.CancelledError:
            raise  # the service stops: the farm goes on, the next instance takes it up
        except bus.Unreachable:
            log.error("NATS lost for good: the farm is taken up by the next instance", farm=farm.sid)
            raise
        except SessionReaped as e:
            # this service could not be heard for the session timeout (stopped, cut off) and the RMS ended the
            # farm's session, killing its processes: as when the service was down (_take_up), its running tasks
            # failed with their nodes, its queued ones go to a new farm
            log.error("the RMS ended a task farm's session unheard", farm=farm.sid)
            self.farm_closing(farm.sid, farm)
            await self.farm_lost(farm.sid, [self.core.jobs[t] for t in farm._mine() if t in self.core.jobs],
                                 _reaped(e))
        except Exception as e:  # noqa: BLE001 - one farm's failure must not stop the others
            log.exception("a task farm failed", farm=farm.sid)
            self.farm_closing(farm.sid, farm)  # (nothing more is handed to it)
            handed = []  # (jobs handed to it, not yet entered: they end too rather than wait for ever)
            while not farm.inbox.empty():
                item = farm.inbox.get_nowait()
                if isinstance(item, tuple) and item[0] == "add":
                    handed.append(item[1])
            for t in [*farm._mine(), *handed]:
                j = self.core.jobs.get(t)
                if j is None:
                    continue
                if (j.state in (JobState.QUEUED, JobState.RUNNING) and self.records[t].farmed
                        and (self.records[t].farm or self.records[t].spec) == farm.sid) \
                        or (t in handed and j.state is JobState.ELIGIBLE):
                    await self._end(t, JobState.FAILED, None, f"internal error: {type(e).__name__}: {e}")
            if farm.session is not None:
                with contextlib.suppress(Exception):
                    await farm.session.close()
            with contextlib.suppress(Exception):
                await self.redis.hdel(keys.BATCH_FARMS, farm.sid)
        finally:
            self.farm_closing(farm.sid, farm)

    def farm_closing(self, sid: str, farm: FarmRunner) -> None:
        """The farm has nothing left to run: tasks entered from now on go to a new one."""
        if self.farms.get(sid) is farm:
            del self.farms[sid]
            if farm.per_job:
                fids = self.shapes.get(farm.shape(), [])
                if sid in fids:
                    fids.remove(sid)
                if not fids:
                    self.shapes.pop(farm.shape(), None)

    async def farm_lost(self, sid: str, members: list[Job], why: str) -> None:
        """A farm whose session the RMS ended, killing its processes: its running tasks failed with their nodes
        (``node_fail``, ``why``), its record goes, its queued tasks run in a new farm. (A record left by a Redis
        error is found unknown again by the next instance, which repeats this: the running tasks have ended,
        the queued ones belong to their new farm.)"""
        for member in members:
            if member.state is JobState.RUNNING:
                await self._end(member.id, JobState.NODE_FAIL, None, why)
        with contextlib.suppress(Exception):
            await self.redis.hdel(keys.BATCH_FARMS, sid)
        self.farm_again(sid, [m.id for m in members if m.state is JobState.QUEUED])

    def farm_again(self, sid: str, tasks: list[str]) -> None:
        """Queued tasks whose farm's session was lost: a new farm runs them (an array's: its own again; separate
        jobs: their shape's, as if they entered now)."""
        if not tasks:
            return
        if self.records[tasks[0]].array_id is not None:
            farm = self._start_farm(sid, tasks[0])  # (in the lost one's place: it takes no more)
            for t in tasks:
                farm.add(t)
            return
        if sid in self.farms:
            self.farm_closing(sid, self.farms[sid])
        for t in tasks:
            self.entries += 1
            self._shape_farm(t).add(t)

    async def _close_stale_farm(self, sid: str, rec: dict) -> None:
        """A farm written down with no task left to it (the service died as it closed): its session goes."""
        await self._close_stale(Record(id=sid, spec=sid, user="", name="", seq=0, submitted=0.0, state="",
                                       session=rec["session"]))
        assert self.redis is not None
        await self.redis.hdel(keys.BATCH_FARMS, sid)

    @staticmethod
    def argv_of(sub: BatchSubmit) -> list[str]:
        if sub.script is not None:
            return ["/bin/sh", "-c", SCRIPT_RUNNER, "coorm-job", *sub.argv]
        if sub.wrap is not None:  # (the shell runs it as it is: no copy of a script to make and remove)
            return ["/bin/sh", "-c", sub.wrap, "coorm-job", *sub.argv]
        return sub.argv

    def _spawn(self, job: str, session: Session | None = None) -> None:
        if job in self.runners:
            return
        task = asyncio.create_task(self._run(job, session), name=f"batch-{job}")
        self.runners[job] = task
        # (only its own entry: a job sent again has a runner of its own by the time this one is done)
        task.add_done_callback(lambda t: self.runners.pop(job) if self.runners.get(job) is t else None)

    def _files(self, j: Job, sub: BatchSubmit) -> tuple[str, str]:
        if sub.attach is not None:
            return "", ""  # (its output goes to its command)
        return _files(j.id, j.array_id, j.task, j.user, j.name, sub.cwd, sub.output, sub.error)

    def _launch_env(self, j: Job, sub: BatchSubmit) -> dict[str, str]:
        env = dict(sub.env)
        ids = {"JOB_ID": j.id if j.array_id is None else str(_seq(j.id)), "JOB_NAME": j.name,
               "SUBMIT_DIR": sub.cwd, "JOB_NODES": str(sub.nodes)}
        if j.array_id is not None:
            ids |= {"ARRAY_JOB_ID": j.array_id, "ARRAY_TASK_ID": str(j.task)}
        for k, v in ids.items():  # Slurm's names too: scripts written for sbatch read them
            env[f"COORM_{k}"] = env[f"SLURM_{k}"] = v
        if sub.script is not None:
            env["COORM_JOB_SCRIPT"] = sub.script
        return env

    async def _opener(self) -> None:
        """Eligible jobs open their sessions one at a time, in submission order: an application's priority
        is when its session opened, so that jobs released or made eligible together keep their queue order
        (first come, first served, then backfilled by the RMS's policy)."""
        while True:
            await self._enter_wake.wait()
            self._enter_wake.clear()
            while self._to_enter:
                _, _, job = heapq.heappop(self._to_enter)
                j, r = self.core.jobs.get(job), self.records.get(job)
                if j is None or r is None or j.state is not JobState.ELIGIBLE or job in self.runners:
                    continue
                try:
                    if r.session is not None:  # opened, but whether its request went is not known: afresh
                        await self._close_stale(r)
                    session = await Session.open(self.settings, user=j.user, name=j.name or job, kind="batch",
                                                 preemptive_views=False, views=False, nc=self.nc,
                                                 moves_connection=True)
                except bus.Unreachable:
                    raise
                except Exception as e:  # noqa: BLE001 - one job's failure must not stop the others
                    log.exception("could not open a batch job's session", job=job)
                    await self._end(job, JobState.FAILED, None, f"could not open its session: {e}")
                    continue
                r.session = session.reply.model_dump(mode="json")
                await self._save(r)
                self._spawn(job, session)

    async def _run(self, job: str, opened: Session | None = None) -> None:
        """One job's life in the RMS, as its own launcher would live it (``opened``: its new session; else
        it is taken up from its records)."""
        j, r = self.core.jobs[job], self.records[job]
        spec = self.specs[r.spec]
        sub: BatchSubmit = spec["submit"]
        resumed = Resumed(launched={}, exited=frozenset())
        session: Session | None = None
        try:
            if opened is None:
                reply = SessionOpenReply.model_validate(r.session)
                launched = {(n, p): q for n, p, q in r.launched}
                exited = frozenset((n, p) for n, p in r.exited)
                resumed = Resumed(launched=launched, exited=exited, exit_code=j.exit_code or 0, started=j.started)
                try:
                    running = {k: v for k, v in launched.items() if k not in exited}
                    session = await Session.resume(self.settings, reply, self.nc, running, views=False,
                                                   moves_connection=True)
                except bus.WireError as e:
                    if e.code not in (ErrorCode.UNKNOWN_APP, ErrorCode.BAD_TOKEN):
                        raise
                    await self._end(job, JobState.NODE_FAIL, None, "its session ended while the batch service "
                                                                  "was down (its processes were killed)")
                    return
                launcher = RigidLauncher(reply.app, sub.cluster or "", sub.nodes, sub.walltime)
            else:
                session = opened
                launcher = RigidLauncher(session.app, sub.cluster or "", sub.nodes, sub.walltime)
                opening = launcher.on_open(self.clock(), NO_PROPS)
                try:
                    for c in opening:
                        if hasattr(c, "requests"):
                            await session.request(*c.requests)
                except bus.WireError as e:
                    await session.close()
                    await self._end(job, JobState.FAILED, None, f"the RMS refused its request: {e.message}")
                    return
                if self.core.jobs[job].state is not JobState.ELIGIBLE:  # cancelled meanwhile
                    await session.close()
                    return
                async with self._lock:
                    self.core.entered(job)
                    await self._flush()
                # the runner takes it from here as it takes up a job after a restart: with a launcher of its own
                # (request ids are the app's, counted: the same again), its requests already sent
                launcher = RigidLauncher(session.app, sub.cluster or "", sub.nodes, sub.walltime)
            self.sessions[job] = session
            argv = self.argv_of(sub)
            attached = self._attach(job, sub)
            if attached is not None:  # (the agents send its output here: it goes on to its command)
                options: dict = {}
            else:
                out, err = self._files(j, sub)
                options = {"stdout": out, "stderr": err or None, "open_mode": sub.open_mode}
            runner = LiveRunner(session, launcher, command=argv, command_ends_work=True,
                                env=self._launch_env(j, sub), cwd=sub.cwd, clock=self.clock, launch_options=options,
                                on_output=attached.output if attached is not None else None,
                                observe=functools.partial(self._observe, job), resumed=resumed,
                                detach_on_cancel=True, props=NO_PROPS,
                                first_node_only=(sub.script is not None or sub.wrap is not None)
                                and attached is None)
            result = await runner.run()
        except asyncio.CancelledError:
            raise  # the service stops: the job goes on, the next instance takes it up
        except bus.Unreachable:
            log.error("NATS lost for good: the jobs are taken up by the next instance", job=job)
            raise
        except SessionReaped as e:
            if self.core.jobs[job].state is JobState.QUEUED:
                await self._requeue(job)
            else:
                await self._end(job, JobState.NODE_FAIL, None, _reaped(e))
            return
        except Exception as e:  # noqa: BLE001 - one job's failure must not stop the others
            log.exception("a batch job's launcher failed", job=job)
            if self.core.jobs.get(job) is not None and self.core.jobs[job].state not in ENDED:
                await self._end(job, JobState.FAILED, None, f"internal error: {type(e).__name__}: {e}")
            return
        finally:
            self.sessions.pop(job, None)
        if self.core.jobs[job].state in ENDED:
            return  # cancelled: its session was closed
        state, code, reason = _outcome(result)
        await self._end(job, state, code, reason, at=result.ended)

    def _attach(self, job: str, sub: BatchSubmit) -> _Attached | None:
        """The events of an attached job, sent in order to its command, which is watched: gone, the job is
        cancelled."""
        if sub.attach is None:
            return None
        if job not in self._attached:
            self._attached[job] = _Attached(self.nc, sub.attach, job, functools.partial(self._gone, job),
                                            started=self.core.jobs[job].started is not None)
        return self._attached[job]

    async def _gone(self, job: str) -> None:
        j = self.core.jobs.get(job)
        if j is None or j.state in ENDED:
            return
        log.info("an attached job's command went away: cancelling it", job=job)
        async with self._lock:
            _, actions = self.core.cancel([job], self.clock(), reason="its command (coorm submit) went away")
            await self._flush()
        self._act(actions)

    async def _close_stale(self, r: Record) -> None:
        from coorm.shared.protocol import Ack, CloseMsg

        reply = SessionOpenReply.model_validate(r.session)
        with contextlib.suppress(Exception):
            await bus.call(self.nc, reply.subjects.close, CloseMsg(token=reply.token), Ack, timeout=5)
        r.session = None

    async def _observe(self, job: str, item: object, result: RunResult) -> None:
        r = self.records.get(job)
        j = self.core.jobs.get(job)
        if r is None or j is None or j.state in ENDED:
            return
        if isinstance(item, Started):
            if job in self._attached and item.nodes:
                self._attached[job].started(list(item.nodes))
            r.node_ids = list(item.nodes)
            r.launched = [[n, p, item.request] for n, p in result.launched]
            if j.state is JobState.QUEUED:
                async with self._lock:
                    actions = self.core.started(job, result.started or self.clock())
                    await self._flush()
                self._act(actions)
            else:
                await self._save(self._sync(job))
        elif isinstance(item, Exited):
            r.exited.append([item.node, item.pid])
            j.exit_code = result.exit_code or None
            await self._save(self._sync(job))
        elif isinstance(item, Killed):
            j.reason = item.reason

    async def _requeue(self, job: str) -> None:
        """A job whose session the RMS reaped before it started (this service unheard past the session
        timeout): nothing of it ran, so it enters the RMS again -- as a farm's queued tasks go to a new farm
        -- rather than fail for what was never its own fault. Called by its runner, which ends here."""
        async with self._lock:
            actions = self.core.requeue(job)
            await self._persist_jobs(self.core.take_changed())
        self.runners.pop(job, None)  # (the opener may give it a new runner at once)
        log.warning("a job's session was ended before it started: it enters the RMS again", job=job)
        self._act(actions)

    async def _end(self, job: str, state: JobState, code: int | None, reason: str, at: float | None = None) -> None:
        """``at``: when its work ended (its last process), which may be a little before its session closed."""
        await self.end_many([(job, state, code, reason)], at)

    async def end_many(self, ends: list[tuple[str, JobState, int | None, str]], at: float | None = None,
                       also: Sequence[Record] = ()) -> None:
        """Jobs' runs ended (a farm's tasks, together: written down in one go, with ``also``: other jobs' records
        that changed without the queue's knowing -- their launches)."""
        actions = []
        async with self._lock:
            now = at or self.clock()
            for job, state, code, reason in ends:
                actions += self.core.ended(job, state, now, code, reason)
            await self._persist_jobs(self.core.take_changed(), also=also)
        self._act(actions)
        for job, state, code, reason in ends:
            log.info("job ended", job=job, state=state.value, exit_code=code, reason=reason)

    # -- records --------------------------------------------------------------------------------------
    async def _save(self, r: Record) -> None:
        assert self.redis is not None
        await self.redis.hset(keys.BATCH_JOBS, r.id, _dump(r))

    async def save_many(self, records: list[Record]) -> None:
        assert self.redis is not None
        live = {r.id: _dump(r) for r in records if JobState(r.state) not in ENDED}
        if live:
            await self.redis.hset(keys.BATCH_JOBS, mapping=live)

    def _sync(self, job: str) -> Record:
        j, r = self.core.jobs[job], self.records[job]
        r.state, r.reason, r.started, r.ended, r.exit_code = j.state.value, j.reason, j.started, j.ended, j.exit_code
        return r

    async def _flush(self) -> None:
        await self._persist_jobs(self.core.take_changed())

    async def _persist_jobs(self, ids: list[str], spec: tuple[str, str] | None = None,
                            also: Sequence[Record] = (), answer: tuple[str, str] | None = None) -> None:
        """Write the jobs' records; an ended one moves to the history (and its submission goes with its last
        job). ``spec``: a new submission (id, text), written with them; ``also``: records of live jobs that
        changed outside the queue (:meth:`save_many`'s), written with them; ``answer``: the key of a submission's
        or command's own id and the reply it gets (``keys.batch_answer``), written with them."""
        assert self.redis is not None
        if not ids:
            if spec is not None or answer is not None:
                async with self.redis.pipeline(transaction=True) as p:
                    if spec is not None:
                        p.hset(keys.BATCH_SPECS, *spec)
                    if answer is not None:
                        p.set(*answer, ex=keys.BATCH_ANSWER_KEPT)
                    await p.execute()
            await self.save_many(list(also))
            return
        live: dict[str, str] = {r.id: _dump(r) for r in also if JobState(r.state) not in ENDED and r.id not in ids}
        ended: list[Record] = []
        for i in ids:
            r = self._sync(i)
            (ended.append(r) if JobState(r.state) in ENDED else live.__setitem__(i, _dump(r)))
        async with self.redis.pipeline(transaction=True) as p:
            if spec is not None:
                p.hset(keys.BATCH_SPECS, *spec)
            if answer is not None:
                p.set(*answer, ex=keys.BATCH_ANSWER_KEPT)
            if live:
                p.hset(keys.BATCH_JOBS, mapping=live)
            for r in ended:
                info = self._info(self.core.jobs[r.id])
                p.hset(keys.BATCH_HISTORY, r.id, info.model_dump_json())
                p.zadd(keys.BATCH_ENDED, {r.id: r.ended or self.clock()})
                p.hdel(keys.BATCH_JOBS, r.id)
            # (an array's last tasks end last: looked at from the end, a running array is told at once)
            done_specs = {sid for sid in {r.spec for r in ended}
                          if all(self.core.jobs[o].state in ENDED for o in reversed(self._jobs_of(sid)))}
            for sid in done_specs:
                p.hdel(keys.BATCH_SPECS, sid)
            await p.execute()
        for r in ended:  # (written down first: its command then learns what the history says)
            attached = self._attached.pop(r.id, None)
            if attached is not None:
                attached.end(BatchAttached(job=r.id, event="ended", state=r.state, exit_code=r.exit_code,
                                           reason=r.reason))
        for sid in done_specs:
            self.specs.pop(sid, None)

    def _jobs_of(self, sid: str) -> list[str]:
        return self.core.arrays.get(sid, [sid] if sid in self.core.jobs else [])


class _Attached:
    """An attached job's command (``BatchSubmit.attach``): its events, sent in order on its subject, and a
    watch that calls ``gone`` once no one has listened there for ``ATTACH_GRACE`` seconds (NATS answers a
    request to a subject nobody subscribes to at once, with "no responders"; the command itself never
    answers the probe: a listener makes it time out)."""

    def __init__(self, nc: Any, subject: str, job: str, gone, started: bool) -> None:
        self.nc, self.subject, self.job, self._gone = nc, subject, job, gone
        self._queue: asyncio.Queue[BatchAttached | None] = asyncio.Queue()
        self._sender = asyncio.create_task(self._send_all())
        self._watch = asyncio.create_task(self._watch_command())
        # output held until "started" is sent (a job's first node may print before its last is launched)
        self._held: list[BatchAttached] | None = None if started else []

    def output(self, out) -> None:
        event = BatchAttached(job=self.job, event="output", node=out.node, stream=out.stream, data=out.data)
        if self._held is not None:
            self._held.append(event)
        else:
            self._queue.put_nowait(event)

    def started(self, nodes: list[str]) -> None:
        if self._held is not None:
            self._queue.put_nowait(BatchAttached(job=self.job, event="started", nodes=nodes))
            for event in self._held:
                self._queue.put_nowait(event)
            self._held = None

    def end(self, event: BatchAttached) -> None:
        """The last event: sent after what came before it; then the watch stops."""
        if self._watch is not asyncio.current_task():
            self._watch.cancel()
        for held in self._held or ():
            self._queue.put_nowait(held)
        self._queue.put_nowait(event)
        self._queue.put_nowait(None)

    def close(self) -> None:
        """This service stops (the next instance watches the job and sends its events)."""
        self._watch.cancel()
        self._sender.cancel()

    async def _send_all(self) -> None:
        while (event := await self._queue.get()) is not None:
            with contextlib.suppress(Exception):  # (NATS down: its command asks the queue when it is back)
                await self.nc.publish(self.subject, event.model_dump_json(exclude_defaults=True).encode())

    async def _watch_command(self) -> None:
        from nats.errors import NoRespondersError

        absent_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(ATTACH_PROBE_EVERY)
            try:
                await self.nc.request(self.subject, b"", timeout=ATTACH_PROBE_EVERY / 2)
                absent_since = None
            except NoRespondersError:
                absent_since = absent_since or loop.time()
                if loop.time() - absent_since >= ATTACH_GRACE:
                    await self._gone()
                    return
            except Exception:  # noqa: BLE001 - a timeout: someone listens (NATS down: nothing is known)
                absent_since = None


@functools.lru_cache(maxsize=100_000)  # (coorm queue shows every job's: 60 % of a 10,000-job page's time)
def _files(job: str, array_id: str | None, task: int | None, user: str, name: str, cwd: str, output: str | None,
           error: str | None) -> tuple[str, str]:
    """A job's output and error files (error "": with the output), as Slurm expands their patterns."""
    default = "coorm-%A_%a.out" if array_id is not None else "coorm-%j.out"

    def path(pattern: str) -> str:
        p = jobscript.expand_filename(pattern, job_id=job if array_id is None else f"{_seq(job)}",
                                      array_job_id=array_id, task=task, user=user, name=name)
        return os.path.normpath(os.path.join(cwd, p))

    return path(output or default), (path(error) if error else "")


def _outcome(result: RunResult) -> tuple[JobState, int, str]:
    """How a job ended, from its launcher's run, in Slurm's words (and its exit code, as coorm submit's)."""
    code = result.exit_code
    why = result.end_reason
    if result.started is None:  # its request ended before it started (the RMS ended it, or its session)
        return JobState.FAILED if result.refused else JobState.NODE_FAIL, code or 1, \
            result.refused[0] if result.refused else f"ended before it started{f': {why}' if why else ''}"
    if why == "walltime":
        return JobState.TIMEOUT, code or 124, "its walltime"
    if why:
        return JobState.NODE_FAIL, code or 1, AGENT_KILL_REASONS.get(why) or f"ended by the RMS: {why}"
    if result.refused:
        return JobState.FAILED, code or 1, result.refused[0]
    return (JobState.COMPLETED, 0, "") if code == 0 else (JobState.FAILED, code, f"exit code {code}")


def _dump(r: Record) -> str:
    return json.dumps(vars(r))  # (asdict would deep-copy every list first: 6 % of this service's CPU)


def _seq(job_id: str) -> int:
    return int(job_id.split("_")[0])


def _default_name(msg: BatchSubmit) -> str:
    if msg.wrap is not None:
        return "wrap"
    if msg.argv and msg.script is None:
        return os.path.basename(msg.argv[0])[:128]
    return "script"


def _command_text(sub: BatchSubmit) -> str:
    if sub.wrap is not None:
        return f"{sub.wrap} {' '.join(sub.argv)}".strip()[:200]
    if sub.script is not None:
        first = sub.script.splitlines()[0] if sub.script else ""
        return f"(script {first[:60]}) {' '.join(sub.argv)}".strip()
    return " ".join(sub.argv)[:200]


async def main(settings: Settings | None = None, stop: asyncio.Event | None = None) -> None:
    from coorm.services.runtime import stop_on_signals
    from coorm.shared import metrics

    settings = settings or Settings()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    await BatchService(settings).run(stop or stop_on_signals())
