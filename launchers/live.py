"""Running a launcher decision object live: the same objects the simulator drives, over a real
:class:`~coorm.launchers.sdk.Session`, in wall-clock time.

The runner feeds the launcher what the RMS says (views, starts, ends) and its own timers, one at a time,
and carries out its commands (requests, ``done``, close, timers). With a ``command`` it also starts the
application's processes: one on every node each request gets (a NEXT successor's kept nodes go on running
what they ran). For the kinds whose work *is* the command (rigid, moldable, CEM), the application is done
when every process it started has exited, and the runner's exit code is the first non-zero one."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from nats.errors import Error as NatsError

from coorm.launchers.base import (
    Close,
    ClusterProps,
    Command,
    Done,
    Launcher,
    Negotiate,
    OfferSeen,
    Respond,
    SelectingLauncher,
    Submit,
    Timer,
)
from coorm.launchers.sdk import (
    Closed,
    Exited,
    Killed,
    OfferReceived,
    ReplaceRefused,
    Session,
    Started,
    ViewsChanged,
)
from coorm.shared import bus, tasks
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import RELEASE_KILL_REASONS, OfferMsg, ProcessOutput

log = structlog.get_logger("coorm.launcher")


CANNOT_RUN = {ErrorCode.COMMAND_NOT_FOUND: 127, ErrorCode.NOT_EXECUTABLE: 126}
# seconds a start may be heard after the views that show it (they come through the view publisher, it
# through the node allocator): a selecting launcher waits that long for its start rather than choosing
# again on a view that shows its own request running (issue 17). The twin's live runs measured the start
# notification at 0.52 s p95, 1.93 s at most.
START_LAG = 2.0


def process_exit_code(ev: Exited) -> int:
    """What a process's end means for the job's exit code, as a shell would report it: its own status, 128 +
    the signal that ended it, 124 if the RMS ended it at the walltime -- and 0 for a process the RMS killed
    because the application released its node (its own ``done``). A process killed for any other reason
    (its agent stopped or restarted, its node failed, preemption) fails the job even if it exited 0 on
    SIGTERM; an unknown status (it ended while its agent was down) is a failure too: the job is not known to
    have completed."""
    if ev.killed and ev.reason in RELEASE_KILL_REASONS:
        return 0
    if ev.killed and ev.reason == "walltime":
        return 124
    if ev.code is None:
        return 1
    if ev.code > 0:
        return ev.code
    if ev.code < 0:
        return 128 - ev.code
    return 128 + signal.SIGTERM if ev.killed else 0


def offer_seen(offer: OfferMsg) -> OfferSeen:
    """What a launcher is told of an offer message."""
    return OfferSeen(offer.negotiation, offer.offer, offer.nodes, offer.start, offer.deadline, offer.waiting,
                     offer.lapsed)


@dataclass
class RunResult:
    app: str
    exit_code: int
    started: float | None = None
    ended: float | None = None
    end_reason: str | None = None
    processes: int = 0
    notifications: int = 0
    notification_bytes: int = 0
    refused: list[str] = field(default_factory=list)
    # replaces the RMS refused (their codes: ``started``, ``ended``): what the launcher replaced had started
    # first, and it kept it -- a race resolved, not a failure
    replace_refused: list[str] = field(default_factory=list)
    launched: list[tuple[str, int]] = field(default_factory=list)  # (node, pid) of every process started
    # an adaptive launcher's shrink races, not failures (LiveRunner.adapts): launches on a node its request no
    # longer held, and processes the agent killed because their node went to another request
    overtaken: int = 0
    reassigned: int = 0


@dataclass(frozen=True)
class Resumed:
    """Where a launcher's run stood when the process that ran it died (from its records)."""

    launched: dict[tuple[str, int], str]  # (node, pid) -> request: every process it had started
    exited: frozenset[tuple[str, int]]  # those whose exit it had heard of
    exit_code: int = 0
    started: float | None = None

    @property
    def nodes_launched(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.launched)


class LiveRunner:
    def __init__(self, session: Session, launcher: Launcher, *, command: list[str] | None = None,
                 command_ends_work: bool = False, on_output: Callable[[ProcessOutput], None] | None = None,
                 env: dict[str, str] | None = None, cwd: str | None = None,
                 clock: Callable[[], float] = time.time, launch_options: dict | None = None,
                 observe: Callable[[object, RunResult], Awaitable[None]] | None = None,
                 resumed: Resumed | None = None, detach_on_cancel: bool = False,
                 props: ClusterProps | None = None, first_node_only: bool = False,
                 start_lag: float = START_LAG) -> None:
        self.s = session
        self.launcher = launcher
        if isinstance(launcher, SelectingLauncher) and launcher.start_lag is None:
            launcher.start_lag = start_lag  # (a launcher given its own keeps it)
        self.command = command
        self.env, self.cwd = env, cwd  # the command's, on every node (None: the user's home, a clean environment)
        self.command_ends_work = command_ends_work
        self.on_output = on_output
        self.clock = clock
        self.result = RunResult(app=session.app, exit_code=0)
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._timers: set[asyncio.Task] = set()
        self._running_procs = 0
        self._launched_any = False
        # what Session.launch is given beyond the command (the batch service's output files)
        self.launch_options = launch_options or {}
        self.observe = observe  # told of every input once handled, with the result so far (to keep records)
        self.resumed = resumed
        self.detach_on_cancel = detach_on_cancel
        self.props = props  # what the launcher is opened with (None: asked of the RMS)
        # the command runs on the first node of a request only (a batch script, as sbatch runs it), not on each
        self.first_node_only = first_node_only
        if resumed is not None:  # another process ran this launcher until now: what it had started stays started
            self._running_procs = len(resumed.launched) - len(resumed.exited)
            self._launched_any = bool(resumed.launched)
            self.result.exit_code = resumed.exit_code
            self.result.started = resumed.started
            self.result.processes = len(resumed.launched)

    async def run(self) -> RunResult:
        pump = asyncio.create_task(self._pump())
        outs = asyncio.create_task(self._outputs()) if self.on_output else None
        cancelled = False
        try:
            props = self.props or await self.s.cluster_props()
            opening = self.launcher.on_open(self.clock(), props)
            if self.resumed is not None:  # its requests were sent then (the launcher's ids are the same again)
                opening = [c for c in opening if not isinstance(c, Submit)]
            await self._execute(opening)
            while not self.launcher.finished:
                item = await self._inbox.get()
                await self._handle(item)
                if self.observe is not None:
                    await self.observe(item, self.result)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            await tasks.cancelled(*(t for t in [pump, outs, *self._timers] if t is not None))
            if outs is not None and self.on_output is not None:  # what came with the last exit is shown too
                q = self.s.all_output()
                while not q.empty():
                    self.on_output(q.get_nowait())
            if cancelled and self.detach_on_cancel:
                await self.s.detach()  # the process that ran it stops: the next one takes the session up
            else:
                await self.s.close()
        self.result.ended = self.result.ended or self.clock()
        if self.command_ends_work and self.result.end_reason and self.result.exit_code == 0:
            # the RMS ended the work (its node failed...) before its processes said how they ended -- or before
            # any ran: the job did not complete, whatever was heard of its processes (as coorm submit says)
            self.result.exit_code = 124 if self.result.end_reason == "walltime" else 1
        self.result.notifications = self.s.stats.notifications
        self.result.notification_bytes = self.s.stats.notification_bytes
        return self.result

    # -- inputs, one at a time ------------------------------------------------------------------------
    async def _pump(self) -> None:
        async for ev in self.s.events():
            self._inbox.put_nowait(ev)

    async def _outputs(self) -> None:
        q: asyncio.Queue = self.s.all_output()
        assert self.on_output is not None  # (run() starts this only with a consumer)
        while True:
            self.on_output(await q.get())

    @property
    def adapts(self) -> bool:
        """The launcher follows its preemptive view or runs for as long as there is room (malleable work: a
        PSA...): the RMS takes its nodes back by design, and it keeps account of its own work (a PSA runs a
        killed task again). So what a shrink races with is not a failure of its job: a launch on a node that
        went back before the launch reached it (``not_owner``), a process killed because its node went to
        another request before the release's own kill came (``reassigned``), a request related to one that
        ended meanwhile (``ended``). Work whose command is the job fails on each."""
        return self.launcher.wants_preemptive or self.launcher.background

    async def _handle(self, item) -> None:
        now = self.clock()
        lz = self.launcher
        if isinstance(item, Exited) and item.killed and item.reason == "reassigned" and self.adapts:
            self._running_procs -= 1
            self.result.reassigned += 1
            return
        if isinstance(item, ViewsChanged):
            await self._execute(lz.on_views(item.views))
        elif isinstance(item, Started):
            if self.result.started is None and item.nodes:
                self.result.started = now
            lz.placed[item.request] = item.cluster
            await self._execute(lz.on_start(now, item.request, item.nodes))
            if self.command and not lz.finished and item.request in lz.running:
                # (a request the launcher no longer wants -- cancelled, but started meanwhile -- runs nothing)
                await self._launch(item)
        elif isinstance(item, Killed):
            if item.reason not in ("done", "next", "cancelled"):
                self.result.end_reason = item.reason
            await self._execute(lz.on_end(now, item.request, item.reason))
        elif isinstance(item, Exited):
            self._running_procs -= 1
            code = process_exit_code(item)
            if code != 0 and self.result.exit_code == 0:
                self.result.exit_code = code
                if item.killed and item.reason not in RELEASE_KILL_REASONS:
                    self.result.end_reason = self.result.end_reason or item.reason
            if self.command_ends_work and self._running_procs <= 0 and self._launched_any:
                await self._execute(self._work_done())
        elif isinstance(item, OfferReceived):
            await self._execute(lz.on_offer(now, offer_seen(item.offer)))
        elif isinstance(item, Closed):
            if item.error is not None:
                raise item.error  # CooRM is gone: what became of the work is unknown, so no exit code
            self.launcher.finished = True
        elif isinstance(item, tuple) and item[0] == "timer":
            await self._execute(lz.on_timer(now, item[1]))

    def _work_done(self) -> list[Command]:
        """Every process ended: the application's work is over."""
        lz = self.launcher
        self.result.ended = self.clock()
        out: list[Command] = [lz.finish(r) for r in list(lz.running)]
        out += [lz.cancel(r) for r in list(lz.waiting)]
        return out + lz.close()

    async def _launch(self, st: Started) -> None:
        command = self.command
        assert command is not None  # (launched only for a command)
        nodes = [node for node in (st.nodes[:1] if self.first_node_only else st.nodes)
                 if node not in st.kept and not (self.resumed is not None and node in self.resumed.nodes_launched)]

        async def on(node: str) -> list[int] | Exception:
            try:
                # the launch's id names the request and the node: a launcher taken up after a crash that sends
                # it again gets the pids of the first, not a second process
                return await self.s.launch(st.request, node, command, env=self.env, cwd=self.cwd,
                                           launch_id=f"{st.request}@{node}", **self.launch_options)
            except (bus.WireError, NatsError) as e:  # refused, or no agent answers for the node
                return e

        # every node at once: one after the other, a 64-node job waited for 64 round trips and process starts
        for node, got in zip(nodes, await asyncio.gather(*(on(node) for node in nodes)), strict=True):
            if isinstance(got, bus.WireError) and got.code is ErrorCode.NOT_OWNER and self.adapts:
                self.result.overtaken += 1  # (the launcher learns from its views what it holds)
                continue
            if isinstance(got, Exception):
                e = got
                log.warning("launch refused", node=node, request=st.request, error=str(e))
                code = e.code if isinstance(e, bus.WireError) else None
                self.result.refused.append(f"launch on {node}: {e.message if isinstance(e, bus.WireError) else e!r}")
                if self.result.exit_code == 0:
                    self.result.exit_code = CANNOT_RUN.get(code, 1) if code else 1
                continue
            pids = got
            self._running_procs += len(pids)
            self.result.processes += len(pids)
            self.result.launched += [(node, pid) for pid in pids]
            self._launched_any = True
        if self.command_ends_work and self.result.refused and self._running_procs <= 0 and not self.launcher.finished:
            # not one process runs and none will (refused, or a program a shell could not run either): the job
            # failed, as its exit code says; its nodes go back now rather than at its walltime
            await self._execute(self._work_done())

    # -- outputs --------------------------------------------------------------------------------------
    async def _execute(self, commands: list[Command]) -> None:
        for c in commands:
            if isinstance(c, Submit):
                try:
                    await self.s.request(*c.requests, replaces=c.replaces)
                except ReplaceRefused as e:
                    # what it replaces had started (or ended) before the replace reached the RMS: nothing
                    # changed, the launcher keeps what started (a race the protocol resolves, not a failure)
                    log.info("replace refused", replaces=c.replaces, error=str(e))
                    self.result.replace_refused.append(e.code.value)
                    await self._execute(self.launcher.on_replace_answered(self.clock(), c, e.code.value))
                    continue
                except bus.WireError as e:
                    if e.code is ErrorCode.ENDED and self.adapts:
                        # an adaptive application's request related to one the RMS ended meanwhile (a
                        # race, not a refusal of its plan): it learns those requests ended, and adapts
                        log.warning("request refused: its relation ended", error=str(e))
                        for spec in c.requests:
                            await self._execute(self.launcher.on_end(self.clock(), spec.id, "cancelled"))
                        continue
                    # the RMS refused: the application cannot go on as it planned
                    log.error("request refused", error=str(e))
                    self.result.refused.append(str(e))
                    self.result.exit_code = self.result.exit_code or 2
                    self.launcher.finished = True
                    return
                if c.replaces:
                    await self._execute(self.launcher.on_replace_answered(self.clock(), c, None))
            elif isinstance(c, Done):
                try:
                    await self.s.done(c.request, c.released)
                except bus.WireError as e:
                    if e.code is not ErrorCode.ENDED:  # it ended on its own meanwhile: nothing to do
                        log.warning("done refused", request=c.request, error=str(e))
                        self.result.refused.append(str(e))
            elif isinstance(c, Close):
                self.result.ended = self.result.ended or self.clock()
                await self.s.close()
            elif isinstance(c, Timer):
                self._arm(c)
            elif isinstance(c, Negotiate):
                try:
                    offer = await self.s.negotiate(c.terms)
                except bus.WireError as e:
                    seen = OfferSeen(c.terms.negotiation, refused=e.code.value)
                    await self._execute(self.launcher.on_offer(self.clock(), seen))
                    continue
                await self._execute(self.launcher.on_offer(self.clock(), offer_seen(offer)))
            elif isinstance(c, Respond):
                negotiation = c.offer.rsplit(".o", 1)[0]  # (an offer is named <negotiation>.o<round>)
                try:
                    reply = await self.s.respond(c.offer, c.answer, c.nodes)
                except bus.WireError as e:
                    lapsed = e.code is ErrorCode.OFFER_LAPSED
                    seen = OfferSeen(negotiation, c.offer, lapsed=lapsed, refused=None if lapsed else e.code.value)
                    await self._execute(self.launcher.on_offer(self.clock(), seen))
                    continue
                if reply.request is not None:
                    await self._execute(self.launcher.on_accepted(self.clock(), negotiation, reply.request))
                elif reply.offer is not None:
                    await self._execute(self.launcher.on_offer(self.clock(), offer_seen(reply.offer)))

    def _arm(self, timer: Timer) -> None:
        async def fire() -> None:
            delay = timer.at - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)  # the launcher asked to be called back at this time
            self._inbox.put_nowait(("timer", timer.key))

        task = asyncio.create_task(fire())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)
