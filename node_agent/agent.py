"""The node agent: one process serving one host's nodes (or many emulated nodes) over NATS.

The I/O shell around :class:`coorm.node_agent.state.NodeBook`:

* registers its nodes on ``AGENT_REGISTER`` (request/reply, retried until the node allocator answers
  ``Ack``), again whenever anything arrives on ``AGENT_HELLO`` and after each NATS reconnection (what was
  sent to it while cut is lost: the answer says whom each node belongs to now); heartbeats on ``AGENT_HEARTBEAT``
  (request/reply: unanswered while its connection lives -- or the registration unanswered, for an agent that
  started there -- its NATS server may be cut from the cluster, and the agent moves to another server of its
  list through which the allocator answers);
* ``node_assign(node)``: the allocator says which request owns the node until when (and which token may
  launch); ``Ack`` if a reply is asked for. Obeyed only when signed with the services' key (as is a kill):
  NATS lets only the services publish them, and the agent checks that they did;
* ``node_launch(node, user)``: starts ``argv`` for the owner -- an application of that user, as that user
  (:mod:`coorm.node_agent.runas`: uid, groups, a clean environment, a directory the user may enter) -- in its
  own session (process group), streams its
  output on ``app_output(app, request)`` (or, when the launch names files, the child opens them as the user
  and writes there: nothing is published) and, once it ended and its output was sent, publishes
  :class:`ProcessExited` on ``app_exited(app)`` and ``AGENT_EXITED``;
* ``node_kill(node)``: TERM to each of the request's process groups there, KILL after ``grace``; replies
  once they are dead;
* kills a request's processes itself when its assignment's end passed more than ``kill_grace`` ago.

A launch is its process group, and its cgroup where the host lets the agent create one
(:mod:`coorm.node_agent.containment`: then ``setsid`` or a double fork cannot escape): when the group leader
exits, whatever it left running is killed (as batch systems do at the end of a job step).

Restarts: the agent keeps a state file of the processes it runs (``agent_state_dir``), and of its spawner.
An agent that was SIGKILLed left them running unsupervised; its spawner, which outlives it, reaps them and
writes how they ended to its ledger. The successor kills what is left of them (found by cgroup, or by pid
and start time), waits for the old spawner to leave, and reports each: with its own code if it ended while
no agent watched (an unknown code without a spawner), killed with reason ``agent_restarted`` if it was
still running; then it registers, and the node allocator sends it the current assignment of each of its
nodes, so launches go on working.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import errno
import hmac
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from coorm.node_agent import procs, runas
from coorm.node_agent.containment import Cgroups
from coorm.node_agent.nodes import default_agent_id, host_node_info, parse_nodes
from coorm.node_agent.spawn_client import Spawner, SpawnerGone, SpawnFailed
from coorm.node_agent.state import NodeBook, ProcessRecord, Refused, token_hash
from coorm.shared import metrics, subjects
from coorm.shared.bus import (
    MAX_LOOK_EVERY,
    WireError,
    answered_through,
    asking,
    call,
    connect,
    decode,
    encode,
    leave_if_cut_off,
    shutdown,
)
from coorm.shared.connection import nats_servers, redact
from coorm.shared.credentials import signed_by
from coorm.shared.endpoints import Role
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import (
    Ack,
    AgentHeartbeat,
    AgentRegister,
    AgentRegistered,
    ExitsQuery,
    ExitsReply,
    KillMsg,
    KillReply,
    LaunchMsg,
    LaunchReply,
    NodeAssign,
    NodeInfo,
    ProcessExited,
    ProcessOutput,
)
from coorm.shared.settings import Settings
from coorm.shared.tasks import cancelled

log = structlog.get_logger("coorm.agent")

CHUNK = 64 * 1024  # longest ProcessOutput.data (a longer line is sent in pieces)
REGISTER_TIMEOUT = 2.0  # one registration attempt
REGISTER_BACKOFF = (0.1, 2.0)  # first and longest pause between attempts
REGISTER_WAIT = 10.0  # how long a launch waits for the agent's registration (and its nodes' assignments)
STRAY_KILL_WAIT = 5.0  # how long to wait for a SIGKILLed group to be gone
OUTPUT_DRAIN = 2.0  # after a group is gone, how long its output pipes may stay open (escaped daemons)
POLL = 0.02  # polling a group that has no parent we can wait on
# a user's identity (uid, gid, groups, home, shell) is read from the user database at most this often: a
# lookup (getpwnam, getgrouplist) was 4 % of the agent's time on a stream of short launches; a change to a user's
# groups reaches new launches within it, as with nscd's cache
USER_CACHE = 30.0
RECENT_LAUNCHES = 4096  # launch ids remembered (a retried launch is answered, not started again)
RECENT_EXITS = 256  # exits kept per node for launchers that missed them (a reconnection)
STOP_WAIT = 5.0  # on stop, how long (beyond the kill grace) to wait for exits to be published
MAX_LOOK_GAP = 8.0  # s between two looks of an unanswered registration, at most (8 beats at the default 1 s)


class _Pipes(asyncio.SubprocessProtocol):
    """What a launched process does, as events: output chunks by fd (``None`` at EOF), and its exit.
    (``asyncio.create_subprocess_exec``'s ``wait()`` only returns once the pipes are closed, which never
    happens while something left in the group holds them.)"""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()
        self.exited: asyncio.Future[int] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.events.put_nowait((fd, data))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.events.put_nowait((fd, None))

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(self.transport.get_returncode())


class _SpawnedPipes:
    """:class:`_Pipes` for a launch the spawner made: its pipes' read ends, read by the loop, and its exit as
    the spawner (or, if the spawner died, the agent itself) saw it."""

    def __init__(self, exited: asyncio.Future[int | None]) -> None:
        self.events: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()
        self.exited = exited
        self.transport = self  # (close(), as the subprocess transport's)
        self._readers: list[asyncio.BaseTransport] = []

    async def connect(self, fds: dict[int, int]) -> None:
        loop = asyncio.get_running_loop()
        for fd, r in fds.items():
            transport, _ = await loop.connect_read_pipe(lambda fd=fd: _PipeReader(self, fd), open(r, "rb", 0))
            self._readers.append(transport)

    def close(self) -> None:
        for t in self._readers:
            t.close()


class _PipeReader(asyncio.Protocol):
    def __init__(self, pipes: _SpawnedPipes, fd: int) -> None:
        self.pipes, self.fd = pipes, fd

    def data_received(self, data: bytes) -> None:
        self.pipes.events.put_nowait((self.fd, data))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipes.events.put_nowait((self.fd, None))


@dataclass(eq=False)
class _Running:
    pid: int
    node: str
    app: str
    request: str  # as of the last look at the books (NEXT hand-overs change it)
    pipes: _Pipes | _SpawnedPipes
    cgroup: Path | None = None  # where the launch is contained (None: its process group only)
    token_sha256: str = ""  # of the session that launched it: who may read its exit later
    piped: frozenset[int] = frozenset({1, 2})  # the fds whose output is published (the others go to files)
    start_ticks: int | None = None  # when it started (with the pid, its identity for a successor)
    watcher: asyncio.Task | None = None
    record: ProcessRecord | None = None  # taken off the books when the leader was reaped
    kill_at: float | None = None  # monotonic deadline for the rest of the group after TERM
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Agent:
    """``Agent(settings, agent_id, cluster, nodes)``; ``await start()``, ``await run_forever()``,
    ``await stop()``.

    ``subreaper`` (default): from start to stop the process is the (Linux) child subreaper, so that what a
    killed group's leader leaves behind is re-parented to the agent and reaped at once: when a kill is
    answered, the group is gone. It is a process-wide setting (restored when the last agent stops);
    orphans of other code in the same process are re-parented too, and stay zombies until it exits.
    ``clock`` is the wall clock assignments' ends are compared with."""

    def __init__(self, settings: Settings, agent_id: str, cluster: str, nodes: list[NodeInfo], *,
                 subreaper: bool = True, clock: Callable[[], float] = time.time) -> None:
        if not nodes:
            raise ValueError("an agent needs at least one node")
        self.settings = settings
        self.agent_id = agent_id
        self.cluster = cluster
        self.node_info = list(nodes)
        self.book = NodeBook([n.id for n in nodes], kill_grace=settings.kill_grace)
        self.subreaper = subreaper
        self.clock = clock
        self.nc: NATS | None = None
        self.service_key: str = ""  # the services' public key: what assignments and kills must be signed with
        self.registered = asyncio.Event()  # set on each successful registration, cleared on AGENT_HELLO
        self.registrations = 0
        self._register_msg = AgentRegister(agent=agent_id, cluster=cluster, nodes=self.node_info)
        self._running: dict[int, _Running] = {}
        self._terminations: dict[int, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._register_task: asyncio.Task | None = None
        self._looking = asyncio.Lock()  # one look elsewhere at a time (the registration's or the heartbeats')
        self._releasing = True  # whether the registration under way ends what its answer does not name
        self._rearm = asyncio.Event()
        self._stopping = False
        self._closed = asyncio.Event()
        self._subreaper_held = False
        self._log = log.bind(agent=agent_id, cluster=cluster)
        self.cgroups: Cgroups | None = None
        self.state_file: Path = settings.agent_state_path(agent_id)
        self.leftovers_reaped = 0  # processes a predecessor left that this agent killed and reported
        self._assigns_seen: dict[str, int] = {}  # assignments received per node (see _sync)
        self._recent_exits: dict[str, collections.deque[tuple[ProcessExited, str]]] = {}
        self._launches: dict[tuple[str, str, str | None], list[int]] = {}  # (node, app, launch id) -> pids
        self._users: dict[str, tuple[float, runas.RunAs]] = {}  # user -> (when looked up, identity)
        self._spawner: Spawner | None = None  # forks the launches (COORM_AGENT_SPAWNER), started at need
        self._spawner_start: int | None = None  # (its identity with its pid, for a successor)
        self._save_pending = False  # a write of the state file is due at the end of this turn of the loop
        self._state_fd: int | None = None  # the state file, open
        self._state_len = 0  # its length (written over, never truncated)

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def process_count(self) -> int:
        return self.book.process_count

    async def start(self) -> None:
        """Connect, subscribe to every node's subjects, start heartbeats and the end-of-allocation timer,
        then register (retrying until the allocator answers)."""
        if self.nc is not None:
            raise RuntimeError("agent already started")
        # an agent obeys assignments and kills that a service signed, and no others: without the services'
        # key it could check none, so it does not start
        service_key = self.settings.service_public_key()
        if service_key is None:
            raise RuntimeError("no services' public key (COORM_SERVICE_KEY, or service.pub in COORM_CREDENTIALS_DIR): "
                               "the agent cannot tell the RMS's assignments from anyone's")
        self.service_key = service_key
        if self.subreaper:
            self._subreaper_held = procs.acquire_subreaper()
            if not self._subreaper_held:
                self._log.warning("cannot become child subreaper: killed groups are reaped by init")
        self.nc = await connect(self.settings.nats_url, f"coorm-agent-{self.agent_id}",
                                self.settings.identity(Role.AGENT), reconnected_cb=self._on_reconnected)
        self.cgroups = Cgroups.create(self.agent_id, str(self.state_file)) if self.settings.agent_cgroups else None
        if self.cgroups is not None:
            self._log.info("launches contained in cgroups", base=str(self.cgroups.base))
        else:
            self._log.warning("launches contained by process group only: a process that calls setsid or "
                              "double-forks escapes its kill", why=Cgroups.why_not or "COORM_AGENT_CGROUPS=0")
        await self._reap_leftovers()
        for node in self.book.nodes:
            await self._serve_node(node)
        await self.nc.subscribe(subjects.AGENT_HELLO, cb=self._on_hello)
        self._loops = [asyncio.create_task(self._heartbeat_loop()), asyncio.create_task(self._expiry_loop())]
        self._log.info("agent started", nodes=len(self.book.nodes), nats=self.settings.nats_url)
        self._register_task = asyncio.create_task(self._register())
        registered = asyncio.create_task(self.registered.wait())
        closed = asyncio.create_task(self._closed.wait())
        try:
            await asyncio.wait({registered, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            registered.cancel()
            closed.cancel()
            await asyncio.gather(registered, closed, return_exceptions=True)

    async def run_forever(self) -> None:
        """Until :meth:`stop`."""
        await self._closed.wait()

    async def stop(self) -> None:
        """Refuse new launches, kill every process started (TERM, KILL after ``kill_grace``), publish
        their exits, then drain the connection."""
        if self._stopping:
            await self._closed.wait()
            return
        self._stopping = True
        try:
            with contextlib.suppress(Exception):  # (a loop that had failed: the agent stops all the same)
                await cancelled(*self._loops, *([self._register_task] if self._register_task else []))
            pids = self.book.kill_all("agent_stopping")
            if pids:
                self._log.info("stopping: killing processes", pids=pids)
            await self._terminate(pids, self.settings.kill_grace)
            deadline = time.monotonic() + self.settings.kill_grace + STOP_WAIT
            while self._tasks and time.monotonic() < deadline:
                await asyncio.wait(list(self._tasks), timeout=max(0.0, deadline - time.monotonic()))
            for t in list(self._tasks):  # what is still waiting cannot be waited for any longer
                t.cancel()
            if self.nc is not None and not self.nc.is_closed:
                await shutdown(self.nc)
            if not self._running:  # a clean stop: nothing for a successor to find
                self._save_pending = False
                self._close_state()
                with contextlib.suppress(OSError):
                    self.state_file.unlink(missing_ok=True)
                if self.cgroups is not None:
                    Cgroups.remove(self.cgroups.base)
            self._log.info("agent stopped")
        finally:
            self._close_state()
            if self._spawner is not None:
                self._spawner.close()
                if self._spawner.ledger is not None and not self._running:
                    with contextlib.suppress(OSError):
                        os.unlink(self._spawner.ledger)
            if self._subreaper_held:
                self._subreaper_held = False
                procs.release_subreaper()
            self._closed.set()

    # -- registration and heartbeats ----------------------------------------------------------------
    async def _register(self, release: bool = True) -> None:
        """``release`` False (after a reconnection): learn the assignments sent meanwhile, but end nothing the
        answer does not name (see :meth:`_sync`)."""
        pause = REGISTER_BACKOFF[0]
        look_gap, next_look = 1.0, time.monotonic()
        while True:
            seen = dict(self._assigns_seen)
            try:
                reply = await call(self.nc, subjects.AGENT_REGISTER, self._register_msg, AgentRegistered,
                                   timeout=REGISTER_TIMEOUT)
            except WireError as e:
                self._log.warning("registration refused", code=e.code.value, reason=e.message)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                self._log.debug("no node allocator answered registration yet")
                # an agent started on a server already cut from its cluster has no answered heartbeat to miss:
                # its registration's silence is the sign, looked into at once, then 1, 2, 4, 8 s apart at most
                # as the heartbeats' looks are (an allocator not started yet costs a few looks); moved, the
                # reconnection registers again
                if time.monotonic() >= next_look:
                    if await self._leave_if_cut_off(self._heartbeat_msg()):
                        continue
                    next_look, look_gap = time.monotonic() + look_gap, min(2 * look_gap, MAX_LOOK_GAP)
            except nats.errors.Error as e:
                self._log.warning("registration failed", error=str(e))
            else:
                self._sync(reply, seen, release=release)
                self.registrations += 1
                self.registered.set()
                self._log.info("registered", nodes=[n.id for n in self.node_info])
                return
            await asyncio.sleep(pause)  # retry back-off
            pause = min(pause * 2, REGISTER_BACKOFF[1])

    def _sync(self, reply: AgentRegistered, seen: dict[str, int], release: bool = True) -> None:
        """Take the RMS's word for whom each node belongs to now: a restarted agent learns its assignments,
        one that was cut off kills what runs under allocations that ended meanwhile. A node assigned while
        the registration was under way keeps that newer assignment. Without ``release`` a node the answer
        names no owner of keeps its assignment (its processes end at its end, or at the RMS's kill): after a
        mere reconnection the allocator's records may lag -- a bookkeeping write dropped over a Valkey
        failover -- and a live job must not be killed for that."""
        current = {node: a for a in reply.assignments for node in a.nodes if node in self.book.nodes}
        doomed: list[int] = []
        for node in self.book.nodes:
            if self._assigns_seen.get(node, 0) != seen.get(node, 0):
                continue
            if node in current:
                doomed += self.book.assign(node, current[node])
            elif release:
                doomed += self.book.release(node, "allocation_ended")
        self._rearm.set()
        if doomed:
            self._log.warning("registered: killing the processes of allocations that ended meanwhile",
                              pids=doomed)
            self._save()
            self._background(self._terminate(doomed, self.settings.kill_grace))

    async def _on_hello(self, msg: Msg) -> None:
        if self._stopping:
            return
        self._log.info("hello from the allocator: registering again")
        self.registered.clear()
        self._register_again()

    async def _on_reconnected(self) -> None:
        """Back from a cut (its nats-server died, the agent moved to another of the cluster): the assignments
        and kills sent meanwhile are lost (core NATS), and a node's new owner would be refused its launches.
        The allocator's answer to a registration is every node's current assignment, taken without ending
        what it does not name (:meth:`_sync`: its records may lag). Launches go on being
        served meanwhile, from the books as they are (an owner refused for an assignment not learnt yet asks
        again: the SDK's ``Session.launch``)."""
        if self._stopping:
            return
        self._log.info("reconnected to NATS: registering again for the assignments sent meanwhile")
        self._register_again(release=False)

    def _register_again(self, release: bool = True) -> None:
        if self._register_task is not None and not self._register_task.done():
            self._register_task.cancel()
            release = release or self._releasing  # (a hello's full sync is not downgraded by a reconnection)
        self._releasing = release
        self._register_task = asyncio.create_task(self._register(release))

    async def _heartbeat_loop(self) -> None:
        # Each beat is a request the allocator answers: the cheapest sign that this connection's server is
        # cut from the cluster (alive, so nats-py stays with it, but nothing beyond it hears), since the beat
        # goes out anyway and its answer is one small message. Unanswered while the connection lives, the
        # agent looks for the allocator through the other servers of its list, as an SDK session does, after
        # 1, 2, 4, 8 unanswered beats: a take-over, when no server answers, costs every agent a few looks,
        # no more. Only once a beat was answered: an allocator older than the answer never answers, and its
        # agents must not look every few beats. A beat waits a period for its answer at most, and the look's
        # beat, answered through another server, is heard by the allocator: by default (1 s beats) it is heard
        # about 2 s after the last beat that got through, at most 5 s (the next beat, its wait, reaching the
        # other server, its answer), within the 5 s agent timeout.
        nodes = list(self.book.nodes)
        period = self.settings.agent_heartbeat
        look_every, unanswered, heard = 1, 0, False
        while True:
            began = time.monotonic()
            hb = self._heartbeat_msg(nodes)
            metrics.agent_processes.labels(self.agent_id, self.cluster).set(hb.processes)
            if await self._beat(hb, timeout=period):
                look_every, unanswered, heard = 1, 0, True
            elif heard:
                unanswered += 1
                if unanswered >= look_every:
                    unanswered = 0
                    look_every = 1 if await self._leave_if_cut_off(hb) else min(2 * look_every, MAX_LOOK_EVERY)
            await asyncio.sleep(max(0.0, began + period - time.monotonic()))  # the heartbeat period

    def _heartbeat_msg(self, nodes: list[str] | None = None) -> AgentHeartbeat:
        return AgentHeartbeat(agent=self.agent_id, nodes=list(self.book.nodes) if nodes is None else nodes,
                              processes=self.book.process_count)

    async def _beat(self, hb: AgentHeartbeat, timeout: float) -> bool:
        """Whether the allocator answered the heartbeat (a refusal is an answer: it was heard)."""
        answered = True
        try:
            await call(self.nc, subjects.AGENT_HEARTBEAT, hb, Ack, timeout=timeout)
        except WireError as e:
            self._log.warning("heartbeat refused", code=e.code.value, reason=e.message)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            answered = False
        except Exception as e:  # noqa: BLE001 - the loop must go on beating, whatever one beat met
            self._log.warning("heartbeat not sent", error=f"{type(e).__name__}: {e}")
            return False
        metrics.agent_heartbeats.labels(self.agent_id, self.cluster).inc()
        return answered

    async def _leave_if_cut_off(self, hb: AgentHeartbeat) -> bool:
        """Whether the allocator answered a heartbeat through another server of the agent's URL list (then the
        connection moves there, and the agent registers again, as after any reconnection)."""
        urls = nats_servers(self.settings.nats_url)
        if self.nc is None or len(urls) < 2 or self._looking.locked():
            return False
        timeout = self.settings.agent_heartbeat

        async def there_answers(url: str) -> bool:
            if await answered_through(url, f"coorm-agent-look-{self.agent_id}", self.settings.identity(Role.AGENT),
                                      asking(subjects.AGENT_HEARTBEAT, hb, Ack, timeout=timeout)):
                return True
            self._log.debug("the allocator does not answer there either", server=redact(url))
            return False

        def moving(here: str, url: str) -> None:
            self._log.warning("the allocator answers through another NATS server, not through this one: moving "
                              "there", cut=here, to=redact(url))

        async with self._looking:
            self._log.info("the allocator does not answer: looking for it through the other NATS servers of the "
                           "list")
            return await leave_if_cut_off(self.nc, urls, there_answers, lambda: self._beat(hb, timeout=timeout),
                                          moving)

    # -- end of allocations -------------------------------------------------------------------------
    async def _expiry_loop(self) -> None:
        while True:
            self._rearm.clear()
            due = self.book.next_expiry()
            timeout = None if due is None else max(0.0, due - self.clock()) + 0.001
            # (asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that comes as the
            # event is set -- a kill just before stop() -- and the stopping agent then hung until the next end)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._rearm.wait()
            expired = self.book.expire(self.clock())
            if expired:
                self._save()
            for ex in expired:
                self._log.warning("allocation ended without word from the RMS: killing its processes",
                                  node=ex.node, app=ex.app, request=ex.request, end=ex.end, pids=list(ex.pids))
                self._background(self._terminate(list(ex.pids), self.settings.kill_grace))

    # -- handlers -----------------------------------------------------------------------------------
    async def _serve_node(self, node: str) -> None:
        """One subscription per node, so that its messages are handled in the order they were sent (an
        assignment published just before a launch is in force for that launch). Assignments and launches
        are handled in turn; a kill updates the books in turn and waits for the deaths in the background.
        Every request gets a reply (an ``ErrorReply`` if it is refused or malformed)."""
        # the services' (signed): node.<node>.assign, node.<node>.kill; a user's (the subject names the user):
        # node.<node>.launch.<user>, node.<node>.exits.<user>
        services: dict[str, tuple[type, Callable]] = {
            subjects.node_assign(node): (NodeAssign, self._on_assign),
            subjects.node_kill(node): (KillMsg, self._on_kill),
        }
        users: dict[str, tuple[type, Callable]] = {
            subjects.node_launch(node, "").rstrip("."): (LaunchMsg, self._on_launch),
            subjects.node_exits(node, "").rstrip("."): (ExitsQuery, self._on_exits),
        }

        async def on_msg(raw: Msg) -> None:
            base, _, user = raw.subject.rpartition(".")
            signed = raw.subject in services
            entry = services[raw.subject] if signed else users.get(base)
            if entry is None:
                return
            model, handler = entry
            try:
                if signed:
                    if not signed_by(self.service_key, raw.subject, raw.data, raw.headers):
                        self._log.warning("refused: not signed by the services", subject=raw.subject)
                        raise WireError(ErrorCode.FORBIDDEN, f"{raw.subject} is the services' to send: not signed by "
                                                             "them")
                    out = await handler(node, decode(raw.data, model))
                else:
                    out = await handler(node, decode(raw.data, model), user)
            except WireError as e:
                out = e.reply()
            except Exception as e:  # noqa: BLE001 - a reply must go out whatever went wrong
                self._log.exception("handler failed", subject=raw.subject)
                out = WireError(ErrorCode.UNAVAILABLE, f"internal error: {type(e).__name__}: {e}").reply()
            if isinstance(out, asyncio.Future):  # a kill: the reply comes once the processes are dead
                self._background(self._reply_later(raw, out))
            else:
                await self._respond(raw, out)

        await self.nc.subscribe(subjects.node_any(node), cb=on_msg)

    async def _respond(self, raw: Msg, out) -> None:
        if raw.reply and out is not None:
            try:
                await raw.respond(encode(out))
            except nats.errors.Error as e:
                self._log.warning("reply not sent", subject=raw.subject, error=str(e))

    async def _reply_later(self, raw: Msg, fut: asyncio.Future) -> None:
        try:
            out = await fut
        except Exception as e:  # noqa: BLE001
            self._log.exception("kill failed", subject=raw.subject)
            out = WireError(ErrorCode.UNAVAILABLE, f"internal error: {type(e).__name__}: {e}").reply()
        await self._respond(raw, out)

    async def _on_assign(self, node: str, msg: NodeAssign) -> Ack:
        if node not in msg.nodes:
            raise WireError(ErrorCode.BAD_REQUEST, f"node {node} is not among the assignment's nodes")
        doomed = self.book.assign(node, msg)
        self._assigns_seen[node] = self._assigns_seen.get(node, 0) + 1
        if self.book.processes(node=node):  # a NEXT hand-over renamed them, or they are doomed
            self._save()
        self._rearm.set()
        self._log.info("node assigned", node=node, app=msg.app, request=msg.request, end=msg.end,
                       previous=msg.previous)
        if doomed:
            self._log.warning("node given to another request: killing the previous owner's processes",
                              node=node, pids=doomed)
            self._background(self._terminate(doomed, self.settings.kill_grace))
        return Ack()

    async def _on_launch(self, node: str, msg: LaunchMsg, user: str) -> LaunchReply:
        if self._stopping:
            raise WireError(ErrorCode.UNAVAILABLE, "the agent is stopping")
        if subjects.owner(msg.app) != user:  # (NATS lets only the user publish on their subject)
            raise WireError(ErrorCode.NOT_OWNER, f"application {msg.app} is not {user}'s")
        if not self.registered.is_set():
            # a (re)starting agent learns its nodes' assignments from the registration's answer: a launch
            # that comes first waits for it rather than be refused for an assignment sent while no agent ran
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.registered.wait(), REGISTER_WAIT)
        try:
            assignment = self.book.check_launch(node, msg.app, msg.request, msg.token, self.clock())
        except Refused as e:
            self._log.info("launch refused", node=node, app=msg.app, request=msg.request, reason=e.message)
            raise WireError(e.code, e.message) from None
        key = (node, msg.app, msg.launch_id)
        if msg.launch_id is not None and key in self._launches:
            return LaunchReply(pids=self._launches[key])  # a launcher's retry: started once already
        # as the application's user (never the agent's own environment: it holds the agent's credentials)
        try:
            run_as = self._run_as(user)
            env = runas.launch_env(run_as, msg.env, deny=self.settings.launch_env_deny, coorm={
                "COORM_NODE": node, "COORM_NODES": ",".join(assignment.nodes), "COORM_REQUEST": msg.request,
                "COORM_APP": msg.app})
            cwd = runas.check_cwd(run_as, msg.cwd)
        except runas.LaunchRefused as e:
            self._log.info("launch refused", node=node, app=msg.app, request=msg.request, reason=e.message)
            raise WireError(e.code, e.message) from None
        # output files (a batch job's -o/-e): opened by the child as the user, never with the agent's rights
        files = (runas.OutputFiles(msg.stdout, msg.stderr, append=msg.open_mode == "append")
                 if msg.stdout is not None or msg.stderr is not None else None)
        piped = frozenset({1, 2} if files is None else
                          {fd for fd, path in ((1, files.stdout), (2, files.stderr)) if path is None})
        cg = self.cgroups.prepare() if self.cgroups is not None else None
        pipes: _Pipes | _SpawnedPipes
        if self.settings.agent_spawner:
            if files is not None:
                files.close()  # (the spawner's child opens them, and says itself why it could not)
            pid, pipes, start = await self._spawn(node, msg, user, run_as, env, cwd, cg, piped)
        else:
            pid, pipes = await self._fork(msg, user, run_as, env, cwd, cg, files, piped)
            start = procs.start_time(pid)
        stale = self._running.get(pid)
        if stale is not None:  # a reaped leader whose watcher has not run yet: its pid was reused
            self._forget(stale)
        run = _Running(pid=pid, node=node, app=msg.app, request=msg.request, pipes=pipes, cgroup=cg,
                       token_sha256=assignment.token_sha256, start_ticks=start, piped=piped)
        self._running[pid] = run
        self.book.started(pid, node, msg.app, msg.request)
        if msg.launch_id is not None:
            self._launches[key] = [pid]
            while len(self._launches) > RECENT_LAUNCHES:
                self._launches.pop(next(iter(self._launches)))
        self._save()
        run.watcher = self._background(self._watch(run))
        self._log.info("launched", node=node, app=msg.app, request=msg.request, pid=pid, argv=msg.argv)
        # the assignment may have expired, or the agent begun stopping, while the process was created
        current = self.book.assignment(node)
        if current is None or current.app != msg.app or current.request != msg.request or self._stopping:
            self.book.mark_killed(pid, "reassigned")
            await self._terminate([pid], 0.0)
            raise WireError(ErrorCode.NOT_OWNER, f"node {node} changed hands during the launch")
        return LaunchReply(pids=[pid])

    def _run_as(self, user: str) -> runas.RunAs:
        """The user's identity, from the user database at most every ``USER_CACHE`` seconds (a refusal --
        no such user -- is not kept: a user created meanwhile may launch at once)."""
        now = time.monotonic()
        known = self._users.get(user)
        if known is not None and now - known[0] < USER_CACHE:
            return known[1]
        run_as = runas.resolve(user)
        if len(self._users) >= RECENT_LAUNCHES:
            self._users.clear()
        self._users[user] = (now, run_as)
        return run_as

    async def _spawn(self, node: str, msg: LaunchMsg, user: str, run_as: runas.RunAs, env: dict[str, str],
                     cwd: str, cg: Path | None, piped: frozenset[int]) -> tuple[int, _SpawnedPipes, int]:
        """Through the spawner (started at need, and again if it died): into its cgroup, the user's identity,
        its output files, as :meth:`_fork` does -- without a fork of the agent."""
        if self._spawner is None or self._spawner.dead:
            if self._spawner is not None and self._spawner.ledger is not None:  # (its launches are ours now)
                with contextlib.suppress(OSError):
                    os.unlink(self._spawner.ledger)
            self._spawner = Spawner.start(ledger=f"{self.state_file}.exits.{time.time_ns()}")
            self._spawner_start = procs.start_time(self._spawner.proc.pid)
        try:
            pid, fds, start = await self._spawner.spawn(
                argv=msg.argv, env=env, cwd=cwd, cgroup=str(cg) if cg is not None else None,
                drop=run_as.identity(), piped=sorted(piped),
                files=(msg.stdout, msg.stderr, msg.open_mode == "append")
                if msg.stdout is not None or msg.stderr is not None else None)
        except (SpawnFailed, SpawnerGone, OSError) as e:
            if cg is not None:  # (a launch the spawner died during may have started: nothing of it stays)
                if isinstance(e, SpawnerGone) and self.cgroups is not None:
                    self.cgroups.signal(cg, signal.SIGKILL)
                Cgroups.remove(cg)
            if isinstance(e, SpawnFailed) and e.stage == "files":
                reason = os.strerror(e.errno) if e.errno else "cannot be opened"
                why = f"{user} cannot write the output to {e.text}: {reason}"
                self._log.info("launch refused", node=node, app=msg.app, request=msg.request, reason=why)
                raise WireError(ErrorCode.BAD_OUTPUT, why) from None
            if isinstance(e, SpawnFailed) and e.stage in ("exec", "cwd"):
                raise _launch_error(msg, OSError(e.errno, os.strerror(e.errno) if e.errno else e.text,
                                                 cwd if e.stage == "cwd" else None)) from None
            if isinstance(e, SpawnerGone | OSError):
                self._log.warning("the spawner died during a launch: refused, to be asked again", error=str(e))
                raise WireError(ErrorCode.UNAVAILABLE, "the agent's spawner died during the launch; retry") from None
            raise WireError(ErrorCode.BAD_REQUEST, f"cannot start {msg.argv[0]!r}: {e}") from None
        pipes = _SpawnedPipes(self._spawner.exited(pid))
        await pipes.connect(fds)
        return pid, pipes, start

    async def _fork(self, msg: LaunchMsg, user: str, run_as: runas.RunAs, env: dict[str, str], cwd: str,
                    cg: Path | None, files: runas.OutputFiles | None, piped: frozenset[int]) -> tuple[int, _Pipes]:
        """The agent forks the launch itself (``COORM_AGENT_SPAWNER=0``), its child doing the steps."""
        try:
            transport, pipes = await asyncio.get_running_loop().subprocess_exec(
                _Pipes, *msg.argv, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if 1 in piped else subprocess.DEVNULL,
                stderr=subprocess.PIPE if 2 in piped else subprocess.DEVNULL,
                env=env, cwd=cwd, start_new_session=True,
                # into its cgroup (as root), then the user's identity, then (as the user) its output files
                preexec_fn=runas.chain(Cgroups.joiner(cg) if cg is not None else None, run_as.dropper(),
                                       files.opener() if files is not None else None),
            )
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            if cg is not None:
                Cgroups.remove(cg)
            why = files.refusal(user) if files is not None else None
            if why is not None:  # (the child failed before exec: nothing runs)
                self._log.info("launch refused", app=msg.app, request=msg.request, reason=why)
                raise WireError(ErrorCode.BAD_OUTPUT, why) from None
            raise _launch_error(msg, e) from None
        finally:
            if files is not None:
                files.close()
        return transport.get_pid(), pipes

    async def _on_exits(self, node: str, msg: ExitsQuery, user: str) -> ExitsReply:
        """The application's recent exits on the node, for its launcher back from a cut connection. Only
        the holder of the token the processes were launched with may read them."""
        if subjects.owner(msg.app) != user:
            raise WireError(ErrorCode.NOT_OWNER, f"application {msg.app} is not {user}'s")
        digest = token_hash(msg.token)
        mine = [ev for ev, sha in self._recent_exits.get(node, ()) if ev.app == msg.app]
        if mine and not any(hmac.compare_digest(sha, digest)
                            for ev, sha in self._recent_exits.get(node, ()) if ev.app == msg.app):
            raise WireError(ErrorCode.BAD_TOKEN, f"the token does not match application {msg.app}")
        return ExitsReply(exits=mine)

    async def _on_kill(self, node: str, msg: KillMsg) -> asyncio.Future:
        pids = self.book.kill(node, msg.request, msg.reason)
        self._rearm.set()
        self._log.info("kill", node=node, request=msg.request, pids=pids, grace=msg.grace, reason=msg.reason)

        async def dead() -> KillReply:
            await self._terminate(pids, msg.grace)
            return KillReply(killed=pids)

        return asyncio.ensure_future(dead())

    # -- processes ----------------------------------------------------------------------------------
    async def _terminate(self, pids: list[int], grace: float) -> None:
        """TERM each process group, KILL it after ``grace``; return once every one has ended and its exit
        was published. Idempotent per pid; cancelling the caller does not stop the kills."""
        tasks = []
        for pid in pids:
            if pid not in self._running:
                continue
            t = self._terminations.get(pid)
            if t is None:
                t = asyncio.create_task(self._terminate_one(self._running[pid], grace))
                self._terminations[pid] = t
                t.add_done_callback(lambda _t, pid=pid: self._terminations.pop(pid, None))
            tasks.append(t)
        if tasks:
            await asyncio.wait(tasks)

    async def _terminate_one(self, run: _Running, grace: float) -> None:
        run.kill_at = time.monotonic() + grace
        self._signal(run, signal.SIGTERM)
        if not run.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.done.wait(), grace)
        if not run.done.is_set():
            if not run.pipes.exited.done():
                self._log.info("still alive after grace: KILL", pid=run.pid, grace=grace)
                self._signal(run, signal.SIGKILL)
            await run.done.wait()

    def _signal(self, run: _Running, sig: int) -> None:
        """``sig`` to the launch: its process group, and every process of its cgroup (those that left the
        group)."""
        procs.signal_group(run.pid, sig)
        if run.cgroup is not None and self.cgroups is not None:
            self.cgroups.signal(run.cgroup, sig)

    async def _watch(self, run: _Running) -> None:
        """Pump the output, wait for the leader, clean the rest of its group, publish the exit."""
        pump = asyncio.create_task(self._pump(run))
        try:
            code = await self._exit_code(run)
            # the leader is reaped: its pid may be reused from now on, so it leaves the books at once
            rec = self._forget(run)
            await self._finish_group(run)
            with contextlib.suppress(TimeoutError):  # a daemon that left the group may hold the pipes
                await asyncio.wait_for(asyncio.shield(pump), OUTPUT_DRAIN)
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            run.pipes.transport.close()
            if rec is not None:
                await self._report(ProcessExited(node=rec.node, app=rec.app, request=rec.request, pid=run.pid,
                                                 code=code, killed=rec.killed,
                                                 reason=rec.reason if rec.killed else None), run.token_sha256)
        finally:
            pump.cancel()
            run.pipes.transport.close()
            self._forget(run)
            if run.cgroup is not None and not Cgroups.remove(run.cgroup):
                self._log.warning("cgroup not removed: something still runs in it", cgroup=str(run.cgroup))
            self._save()
            run.done.set()

    async def _report(self, ev: ProcessExited, token_sha256: str = "") -> None:
        """Tell the application (and the RMS) how one of its processes ended; keep it among the node's
        recent exits, for a launcher that was disconnected when it was published."""
        recent = self._recent_exits.setdefault(ev.node, collections.deque(maxlen=RECENT_EXITS))
        recent.append((ev, token_sha256))
        self._log.info("process exited", node=ev.node, app=ev.app, request=ev.request, pid=ev.pid, code=ev.code,
                       killed=ev.killed, reason=ev.reason)
        outcome = "killed" if ev.killed else "ok" if ev.code == 0 else "failed"
        metrics.agent_process_exits.labels(self.agent_id, self.cluster, outcome).inc()
        try:
            await self.nc.publish(subjects.app_exited(ev.app), encode(ev))
            await self.nc.publish(subjects.AGENT_EXITED, encode(ev))
        except nats.errors.Error as e:
            self._log.warning("exit not published", pid=ev.pid, error=str(e))

    @staticmethod
    async def _exit_code(run: _Running) -> int:
        """The leader's exit status, as asyncio's child watcher reports it. The watcher always reports (a
        pidfd, or a thread in ``waitpid``): nothing else here reaps a launched leader
        (:func:`procs.reap_group` keeps them), so the status is the process's own."""
        return await run.pipes.exited

    def _forget(self, run: _Running) -> ProcessRecord | None:
        """Take the process off the books (once); its last record."""
        if self._running.get(run.pid) is run:
            del self._running[run.pid]
            run.record = self.book.exited(run.pid)
            if run.record is not None:
                run.request = run.record.request
        return run.record

    async def _finish_group(self, run: _Running) -> None:
        """The leader ended: let the rest of its group finish until the kill deadline (if it is being
        killed), then KILL what is left and wait until nothing of it runs."""
        if not self._alive(run):
            return
        if run.kill_at is not None:
            while time.monotonic() < run.kill_at and self._alive(run):
                await asyncio.sleep(POLL)  # polling: the members are not our children
        else:
            self._log.info("leader exited: killing the rest of its group", pid=run.pid)
        self._signal(run, signal.SIGKILL)
        deadline = time.monotonic() + STRAY_KILL_WAIT
        while self._alive(run):
            if time.monotonic() > deadline:
                self._log.warning("process group still alive after KILL", pgid=run.pid)
                return
            await asyncio.sleep(POLL)  # polling: the members are not our children
        if run.cgroup is not None:
            procs.reap_orphans(self._running.keys())  # what left the group comes back to us as a zombie

    def _alive(self, run: _Running) -> bool:
        """Whether anything of the launch still runs (its group; its cgroup, where it has one)."""
        keep = self._running.keys()
        if procs.group_alive(run.pid, keep):
            return True
        if run.cgroup is not None and Cgroups.populated(run.cgroup):
            procs.reap_group(run.pid, keep)
            return True
        return False

    # -- the state file, and what a predecessor left --------------------------------------------------
    def _save(self) -> None:
        """Write the state file once the handlers running now are done: the launches and exits of one turn of
        the loop in one write (a rename took milliseconds, and 64 launches at once wrote it 64 times, the agent
        waiting each time). What a successor could miss meanwhile is in a cgroup it kills all the same."""
        if not self._save_pending:
            self._save_pending = True
            asyncio.get_running_loop().call_soon(self._save_now)

    def _save_now(self) -> None:
        """Which processes run here, for a successor should this agent be killed: one small file, written
        over in place by one ``pwrite`` (a process killed cannot tear it; a crash of the host takes the
        processes with it, so no fsync), padded with spaces rather than truncated. (It used to be replaced by
        a rename: ext4 flushed the file's data at each one while the agent waited, a third of its time on a
        stream of short launches.)"""
        if not self._save_pending:
            return  # (cancelled: a clean stop removed the file)
        self._save_pending = False
        entries = [{"pid": pid, "node": r.node, "app": r.app, "request": (self.book.process(pid) or r).request,
                    "start": r.start_ticks, "cgroup": str(r.cgroup) if r.cgroup else None,
                    "token_sha256": r.token_sha256}
                   for pid, r in self._running.items()]
        state: dict = {"agent": self.agent_id, "processes": entries}
        if self._spawner is not None and not self._spawner.dead:  # (a successor reads how they ended from it)
            state["spawner"] = {"pid": self._spawner.proc.pid, "start": self._spawner_start,
                                "ledger": self._spawner.ledger}
        data = json.dumps(state).encode()
        try:
            if self._state_fd is None:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                self._state_fd = os.open(self.state_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                self._state_len = os.fstat(self._state_fd).st_size
            os.pwrite(self._state_fd, data.ljust(self._state_len), 0)  # (JSON allows the trailing spaces)
            self._state_len = max(self._state_len, len(data))
        except OSError as e:
            self._log.warning("state file not written: a successor could not find these processes",
                              path=str(self.state_file), error=str(e))

    def _close_state(self) -> None:
        if self._state_fd is not None:
            os.close(self._state_fd)
            self._state_fd = None

    async def _reap_leftovers(self) -> None:
        """Kill what a predecessor (SIGKILLed, or its host's agent restarted) left running, and report how each
        process it started ended: from its spawner's ledger of exits, which outlived it (the code of one that
        ended while no agent watched, ``-9`` for one killed here: ``agent_restarted``); without a ledger
        entry (no spawner, ``COORM_AGENT_SPAWNER=0``), killed if it still ran, else with an unknown code."""
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            state = {"processes": []}
        except (OSError, ValueError) as e:
            self._log.error("state file unreadable: what a predecessor left is not reported", error=str(e))
            state = {"processes": []}
        mine = set(self.book.nodes)
        left = [p for p in state.get("processes", []) if p.get("node") in mine]
        cgroups = set(self.cgroups.leftovers()) if self.cgroups is not None else set()
        killed: set[int] = set()
        for p in left:
            pid, cg = int(p["pid"]), Path(p["cgroup"]) if p.get("cgroup") else None
            running = p.get("start") is not None and procs.start_time(pid) == p["start"]
            if running:
                procs.signal_group(pid, signal.SIGKILL)
            if cg is not None and self.cgroups is not None:
                running = running or Cgroups.populated(cg)
                self.cgroups.signal(cg, signal.SIGKILL)
            if running:
                killed.add(pid)
        for cg in cgroups:  # including launches the predecessor never recorded (killed mid-launch)
            assert self.cgroups is not None
            self.cgroups.signal(cg, signal.SIGKILL)
        deadline = time.monotonic() + STRAY_KILL_WAIT
        while any(Cgroups.populated(cg) for cg in cgroups) and time.monotonic() < deadline:
            await asyncio.sleep(POLL)  # polling: they are not our children
        for cg in cgroups:
            Cgroups.remove(cg)
        ended = await self._predecessor_ledger(state.get("spawner"))
        for p in left:
            pid = int(p["pid"])
            code = ended.get((pid, p.get("start")))
            self.leftovers_reaped += 1
            if code is not None and not (pid in killed and code == -signal.SIGKILL):
                self._log.warning("a predecessor's process ended while no agent watched", pid=pid, node=p["node"],
                                  app=p["app"], request=p["request"], code=code)
                ev = ProcessExited(node=p["node"], app=p["app"], request=p["request"], pid=pid, code=code)
            else:
                running = pid in killed
                self._log.warning("a predecessor's process: killed" if running else
                                  "a predecessor's process ended unwatched: its exit status is unknown",
                                  pid=pid, node=p["node"], app=p["app"], request=p["request"])
                ev = ProcessExited(node=p["node"], app=p["app"], request=p["request"], pid=pid,
                                   code=-signal.SIGKILL if running else None, killed=running,
                                   reason="agent_restarted")
            await self._report(ev, p.get("token_sha256", ""))
        self._save()

    async def _predecessor_ledger(self, spawner: dict | None) -> dict[tuple[int, int | None], int]:
        """How the predecessor's launches ended, (pid, start) -> code, from its spawner's ledger, once that
        spawner has reaped them all and left (it outlives its agent until its last launch ends)."""
        if not isinstance(spawner, dict) or not spawner.get("ledger"):
            return {}
        pid, start, ledger = spawner.get("pid"), spawner.get("start"), str(spawner["ledger"])
        deadline = time.monotonic() + STRAY_KILL_WAIT
        while (isinstance(pid, int) and start is not None and procs.start_time(pid) == start
               and time.monotonic() < deadline):
            await asyncio.sleep(POLL)  # polling: it is not our child
        ended: dict[tuple[int, int | None], int] = {}
        try:
            with open(ledger, "rb") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) == 3 and all(x.lstrip(b"-").isdigit() for x in fields):
                        ended[int(fields[0]), int(fields[1])] = int(fields[2])
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                self._log.warning("a predecessor's ledger of exits unreadable: its exit codes are unknown",
                                  path=ledger, error=str(e))
        with contextlib.suppress(OSError):
            os.unlink(ledger)
        return ended

    async def _pump(self, run: _Running) -> None:
        """Publish the output, line by line (pieces of at most CHUNK characters), until both pipes end (those
        there are: a stream that goes to a file has none)."""
        names = {fd: name for fd, name in ((1, "stdout"), (2, "stderr")) if fd in run.piped}
        decoders = {fd: codecs.getincrementaldecoder("utf-8")(errors="replace") for fd in names}
        bufs = dict.fromkeys(names, "")
        open_fds = set(names)
        while open_fds:
            fd, data = await run.pipes.events.get()
            if fd not in open_fds:
                continue
            if data is None:
                open_fds.discard(fd)
                rest = bufs[fd] + decoders[fd].decode(b"", final=True)
                if rest:
                    await self._output(run, names[fd], rest)
                continue
            *lines, bufs[fd] = (bufs[fd] + decoders[fd].decode(data)).split("\n")
            for line in lines:
                await self._output(run, names[fd], line + "\n")
            while len(bufs[fd]) >= CHUNK:
                piece, bufs[fd] = bufs[fd][:CHUNK], bufs[fd][CHUNK:]
                await self._output(run, names[fd], piece)

    async def _output(self, run: _Running, stream: str, data: str) -> None:
        if self._running.get(run.pid) is run:  # still running: its request may have changed (NEXT)
            rec = self.book.process(run.pid)
            if rec is not None:
                run.request = rec.request
        msg = ProcessOutput(node=run.node, request=run.request, pid=run.pid, stream=stream, data=data)
        try:
            await self.nc.publish(subjects.app_output(run.app, run.request), encode(msg))
        except nats.errors.Error as e:
            self._log.warning("output not published", pid=run.pid, error=str(e))

    def _background(self, coro) -> asyncio.Task:
        """A task that :meth:`stop` waits for."""
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t


def _launch_error(msg: LaunchMsg, e: Exception) -> WireError:
    """Why a launch could not start, with a shell's distinction: no such program (127), not executable
    (126), or anything else (a missing working directory, ...)."""
    program = msg.argv[0]
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) == str(msg.cwd):
        return WireError(ErrorCode.BAD_REQUEST, f"cannot enter the working directory {msg.cwd!r}: {e.strerror}")
    if isinstance(e, FileNotFoundError) or (isinstance(e, OSError) and e.errno == errno.ENOENT):
        return WireError(ErrorCode.COMMAND_NOT_FOUND, f"{program}: command not found")
    if isinstance(e, PermissionError) or (isinstance(e, OSError) and e.errno in (errno.EACCES, errno.ENOEXEC)):
        return WireError(ErrorCode.NOT_EXECUTABLE, f"{program}: cannot execute: {e.strerror}")
    return WireError(ErrorCode.BAD_REQUEST, f"cannot start {program!r}: {e}")


# -- the ``coorm agent`` command ------------------------------------------------------------------------
def main(cluster: str, nodes: str, agent_id: str | None = None, cores: int | None = None,
         memory_mb: int | None = None) -> None:
    """Serve ``nodes`` (``n0..n15``, ``a,b,c``) of ``cluster`` until SIGINT or SIGTERM, then kill every
    process started and exit. Settings come from ``COORM_*`` (see :class:`Settings`)."""
    settings = Settings()
    infos = host_node_info(parse_nodes(nodes), cores=cores, memory_mb=memory_mb)
    asyncio.run(serve_agent(settings, agent_id or default_agent_id(cluster), cluster, infos))


async def serve_agent(settings: Settings, agent_id: str, cluster: str, nodes: list[NodeInfo]) -> None:
    procs.use_pidfd_child_watcher()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    metrics.zero(metrics.agent_process_exits, *((agent_id, cluster, o) for o in ("ok", "failed", "killed")))
    agent = Agent(settings, agent_id, cluster, nodes)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def run() -> None:
        await agent.start()
        await agent.run_forever()

    runner = asyncio.create_task(run())
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        stopper.cancel()
        if not runner.done():
            runner.cancel()
        await asyncio.gather(runner, stopper, return_exceptions=True)
        await agent.stop()
    if runner.done() and not runner.cancelled() and runner.exception() is not None:
        raise runner.exception()
