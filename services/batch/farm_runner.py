"""The shell of a task farm (:mod:`coorm.services.batch.farm`): one session for an array, or for a user's
separate jobs of one shape (cluster, nodes, walltime: see :meth:`BatchService._shape_farm`), its slots'
requests, its tasks' processes, and the tasks' records through the batch service. Each task is launched with
its own submission (command, environment, directory, files), as the job it is.

Inputs come one at a time through an inbox (tasks added or withdrawn by the queue, the session's starts,
ends and exits, launches done, wake-ups); after each batch of inputs the core decides, and its decisions
are carried out: slots asked (all of one decision in one request), tasks started (launched in the
background: a slot's launch does not wait for another's), slots released.

Written down, so that a batch service killed and started again takes the farm up: the session (``keys.
BATCH_FARMS``: the farm's id -- an array's own id, or ``shape.<user>.<n>`` -- -> its session, the requests it
has asked, before it asks them, and a shape farm's shape), and each task's record as a job's (its farm, started,
the processes launched and exited). A slot that started while no
instance ran is adopted when the session's recovery tells of it; one still waiting goes with the session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import TYPE_CHECKING

import structlog

from coorm.launchers.live import CANNOT_RUN, RunResult, process_exit_code
from coorm.launchers.sdk import Closed, Exited, Killed, Session, SessionReaped, Started
from coorm.services.batch.core import ENDED, JobState
from coorm.services.batch.farm import Ask, FarmCore, Release, Run, Wake
from coorm.shared import bus, keys
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import RELEASE_KILL_REASONS, BatchSubmit, SessionOpenReply
from coorm.shared.requests import RequestSpec
from coorm.shared.tasks import cancelled

if TYPE_CHECKING:
    from coorm.services.batch.service import BatchService, Record

log = structlog.get_logger("coorm.batch.farm")


class _Task:
    """A running task's processes: how many are still to exit, and what their ends say so far."""

    def __init__(self, request: str) -> None:
        self.request = request
        self.launching = True
        self.left = 0
        self.result = RunResult(app="", exit_code=0, started=0.0)

    def exited(self, ev: Exited) -> None:
        self.left -= 1
        code = process_exit_code(ev)
        if code and not self.result.exit_code:
            self.result.exit_code = code
            if ev.killed and ev.reason not in RELEASE_KILL_REASONS:
                self.result.end_reason = ev.reason

    @property
    def over(self) -> bool:
        return not self.launching and self.left <= 0


# seconds an idle slot of separate jobs waits for the next like job before it goes back: a stream of jobs
# submitted one after the other (a client's round trip, a script's loop) comes within tens of milliseconds;
# more would hold nodes idle that others could use (the bound is per slot, and never past the slot's request)
LINGER = 0.4


class FarmRunner:
    def __init__(self, svc: BatchService, fid: str, sub: BatchSubmit, user: str, per_job: bool = False,
                 opened: float = 0.0) -> None:
        self.svc = svc
        self.sid = fid  # the farm's id: its array's, or a shape farm's
        self.sub = sub  # (the shape: cluster, nodes, walltime; each task is launched with its own submission)
        self.user = user
        self.per_job = per_job
        self.opened = opened  # when its session opened (its priority in the RMS), as the service's clock says
        self.members: set[str] = set()  # a shape farm's jobs, entered or taken up (an array's: its tasks)
        self.adding = 0  # tasks handed to it whose "add" is not handled yet
        self.last_entry = -1  # the service's count of entered jobs when it was handed its last one
        self.keep_until: float | None = None  # a shape farm may be handed jobs until then (its youth)
        self.core = FarmCore(app="", walltime=sub.walltime, width=1, per_job=per_job,
                             linger=LINGER if per_job else 0.0, drained=set(svc.drained))
        self.session: Session | None = None
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.tasks: dict[str, _Task] = {}
        self.by_pid: dict[tuple[str, int], str] = {}
        self.early: dict[tuple[str, int], Exited] = {}  # exits heard before their launch's reply
        # what the inputs of one turn of the loop changed, written down together at its end
        self._ended: list[tuple[str, JobState, int | None, str]] = []
        self._dirty: dict[str, Record] = {}
        self._background: set[asyncio.Task] = set()
        self._unwritten = False  # tasks entered this turn, not yet written down
        self._wake: asyncio.TimerHandle | None = None

    # -- from the batch service -----------------------------------------------------------------------
    def add(self, task: str) -> None:
        self.adding += 1
        self.inbox.put_nowait(("add", task))

    def free(self, now: float) -> int:
        """Slots that could run a job handed to the farm now, beyond those handed to it already."""
        return self.core.free(now) - self.adding

    def shape(self) -> tuple[str, str, int, float]:
        return self.user, self.sub.cluster or "", self.sub.nodes, self.sub.walltime

    def _mine(self) -> list[str]:
        """The jobs this farm runs or may run: an array's tasks, a shape farm's members."""
        if self.per_job:
            return sorted(self.members, key=lambda t: self.svc.core.jobs[t].seq if t in self.svc.core.jobs else 0)
        return list(self.svc.core.arrays.get(self.sid, ()))

    def _sub_of(self, task: str) -> BatchSubmit:
        """The task's own submission (a shape farm's jobs were submitted one by one)."""
        spec = self.svc.specs.get(self.svc.records[task].spec)
        return spec["submit"] if spec is not None else self.sub

    def withdraw(self, task: str) -> None:
        self.inbox.put_nowait(("withdraw", task))

    def drain(self, nodes: list[str], on: bool) -> None:
        self.inbox.put_nowait(("drain", nodes, on))

    # -- life -----------------------------------------------------------------------------------------
    async def run(self, resume: dict | None = None) -> None:
        svc = self.svc
        try:
            if resume is None:
                if self.per_job:
                    name, kind = f"{self.sub.nodes}x{self.sub.walltime:g}s", "batch-farm"
                else:
                    name, kind = svc.core.jobs[svc.core.arrays[self.sid][0]].name, "batch-array"
                # one at a time, in the order the farms were made (the queue's): an application's priority is
                # when its session opened, and farms made together must keep their jobs' order
                async with svc.opening:
                    self.session = await Session.open(svc.settings, user=self.user, name=name, kind=kind,
                                                      preemptive_views=False, views=False, nc=svc.nc,
                                                      moves_connection=True)
                self.core.app = self.session.app
                await self._write_down()
            else:
                if not await self._take_up(resume):
                    return
            pump = asyncio.create_task(self._pump())
            try:
                await self._loop()
            finally:
                await cancelled(pump)
        except asyncio.CancelledError:
            if self.session is not None:
                await self.session.detach()  # the service stops: the next instance takes the farm up
            raise
        finally:
            if self._wake is not None:
                self._wake.cancel()
            for t in list(self._background):
                t.cancel()

    async def _take_up(self, resume: dict) -> bool:
        """Resume the session the last instance wrote down; False if the RMS reaped it meanwhile (its running
        tasks were killed with it: they end ``node_fail``; its queued ones run in a new farm)."""
        svc = self.svc
        reply = SessionOpenReply.model_validate(resume["session"])
        self.core.app, self.core.asked = reply.app, int(resume.get("asked", 0))
        mine = [svc.core.jobs[t] for t in self._mine() if t in svc.core.jobs]
        running = [j for j in mine if j.state is JobState.RUNNING]
        launched: dict[tuple[str, int], str] = {}
        for j in running:
            r = svc.records[j.id]
            for node, pid, request in r.launched:
                if [node, pid] not in r.exited:
                    launched[node, pid] = request
        try:
            self.session = await Session.resume(svc.settings, reply, svc.nc, launched, views=False,
                                                moves_connection=True)
        except bus.WireError as e:
            if e.code not in (ErrorCode.UNKNOWN_APP, ErrorCode.BAD_TOKEN):
                raise
            await svc.farm_lost(self.sid, mine, "its session ended while the batch service was down (its "
                                                "processes were killed)")
            return False
        relaunch = []
        for j in running:
            r = svc.records[j.id]
            left = [(n, p) for n, p, _ in r.launched if [n, p] not in r.exited]
            request = r.slot or (r.launched[0][2] if r.launched else "")
            self.core.running(request, j.id, j.started or svc.clock())
            t = self.tasks[j.id] = _Task(request)
            t.result.exit_code = j.exit_code or 0
            for key in left:
                self.by_pid[key] = j.id
            t.left = len(left)
            if {n for n, _, _ in r.launched} >= set(self._launch_nodes(tuple(r.node_ids), self._sub_of(j.id))):
                t.launching = False
            else:  # killed between its start and its launch's record: launched again, under the same launch
                # ids -- an agent that started it answers with its pids, one that did not starts it now
                relaunch.append(Run(j.id, request, tuple(r.node_ids)))
        for d in relaunch:
            self._spawn(self._launch(d, again=True))
        self.core.add([j.id for j in mine if j.state is JobState.QUEUED], self._expected(), now=svc.clock())
        log.info("farm taken up", farm=self.sid, app=reply.app, running=len(running))
        return True

    async def _pump(self) -> None:
        assert self.session is not None
        async for ev in self.session.events():
            self.inbox.put_nowait(ev)

    async def _loop(self) -> None:
        while True:
            adds: list[str] = []
            await self._handle(await self.inbox.get(), adds)
            # what came meanwhile, decided on together -- with the tasks a task's end lets in (the queue's
            # actions are carried out as it ends, so they are here before the freed slot is judged)
            while True:
                while not self.inbox.empty():
                    await self._handle(self.inbox.get_nowait(), adds)
                if not await self._commit():  # (ended tasks may let others in: handled in this turn too)
                    break
            if adds:
                await self._enter(adds)
            await self._execute(self.core.decide(self.svc.clock()))
            if self.core.idle and self.inbox.empty() and not self.tasks and not self._may_take_more() \
                    and await self._close():
                return

    def _may_take_more(self) -> bool:
        """A shape farm with nothing left stays open (a session, no request: nothing in anyone's schedule)
        while the service may still hand it a job -- it is young and took the last job entered -- so that a
        pause in a stream of jobs costs a slot, not a session; woken to close at the end of its youth."""
        if not self.per_job or self.keep_until is None:
            return False
        now = self.svc.clock()
        if now >= self.keep_until or self.last_entry != self.svc.entries:
            return False
        self._arm(self.keep_until)
        return True

    async def _handle(self, item, adds: list[str]) -> None:
        c = self.core
        if isinstance(item, tuple):
            what = item[0]
            if what == "add":
                self.adding -= 1
                adds.append(item[1])
            elif what == "withdraw":
                c.withdraw(item[1])
            elif what == "drain":
                c.drain(item[1], item[2])
            elif what == "launched":
                await self._launched(*item[1:])
            # ("wake",): only decide again
        elif isinstance(item, Started):
            c.started(item.request, item.nodes, item.end if item.end is not None else math.inf)
        elif isinstance(item, Killed):
            task = c.slot_ended(item.request)
            if task is not None and item.reason not in RELEASE_KILL_REASONS and task in self.tasks:
                self.tasks[task].result.end_reason = item.reason
        elif isinstance(item, Exited):
            key = (item.node, item.pid)
            task = self.by_pid.pop(key, None)
            if task is None:
                self.early[key] = item
                return
            await self._exited(task, item)
        elif isinstance(item, Closed):
            if item.error is not None:
                raise item.error  # CooRM is gone: the next instance takes the farm up

    async def _commit(self) -> bool:
        """Write down what this turn changed: the records of launches and the ends of tasks, in one Redis round
        trip whatever their number. True if tasks ended."""
        dirty, self._dirty = self._dirty, {}
        ending = {e[0] for e in self._ended}  # (their records go to the history now: not written twice)
        launched = [r for t, r in dirty.items() if t not in ending]
        if not self._ended:
            if launched:
                await self.svc.save_many(launched)
            return False
        ended, self._ended = self._ended, []
        await self.svc.end_many(ended, also=launched)
        return True

    async def _enter(self, tasks: list[str]) -> None:
        """Tasks the queue entered: queued in the farm (their 'request' is the farm's). Written down with the
        turn's starts, before any slot is asked for them (:meth:`_execute`)."""
        svc = self.svc
        async with svc._lock:
            took = [t for t in tasks if t in svc.core.jobs and svc.core.jobs[t].state is JobState.ELIGIBLE]
            for t in took:
                svc.core.entered(t)
                svc.records[t].farmed, svc.records[t].farm = True, self.sid
            # (queued ones: a lost farm's, run in this one -- which their records must say before they start)
            moved = [svc.records[t] for t in tasks if t in svc.core.jobs and svc.core.jobs[t].state is JobState.QUEUED
                     and t not in took and svc.records[t].farm != self.sid]
            for r in moved:
                r.farmed, r.farm = True, self.sid
            self._unwritten = self._unwritten or bool(took)
            if moved:
                await svc.save_many(moved)
        queued = [t for t in tasks if t in svc.core.jobs and svc.core.jobs[t].state is JobState.QUEUED]
        if self.per_job:
            self.members.update(queued)
        self.core.add(queued, self._expected(), now=svc.clock())

    def _expected(self) -> int:
        """The array's tasks still to run: a slot asks for its share of them (a shape farm's slots ask one job's
        time each: its pending jobs)."""
        if self.per_job:
            return len(self.core.pending)
        return sum(1 for t in self.svc.core.arrays.get(self.sid, ())
                   if self.svc.core.jobs[t].state in (JobState.BLOCKED, JobState.ELIGIBLE, JobState.QUEUED))

    # -- decisions ------------------------------------------------------------------------------------
    async def _execute(self, decisions) -> None:
        asks = [d for d in decisions if isinstance(d, Ask)]
        runs = [d for d in decisions if isinstance(d, Run)]
        if runs:
            await self._run(runs)  # (the entered tasks are written down with the starts)
        elif self._unwritten:
            async with self.svc._lock:
                await self.svc._flush()
        self._unwritten = False
        for d in decisions:
            if isinstance(d, Release):
                self._spawn(self._release(d.request))
            elif isinstance(d, Wake):
                self._arm(d.at)
        if asks:
            await self._ask(asks)

    async def _ask(self, asks: list[Ask]) -> None:
        assert self.session is not None
        await self._write_down()  # (the ids it asks are never asked again by a next instance)
        specs = [RequestSpec(id=a.request, cluster=self.sub.cluster or "", nodes=self.sub.nodes,
                             duration=a.duration) for a in asks]
        try:
            await self.session.request(*specs)
        except bus.WireError as e:  # the RMS refuses the farm's slots: its tasks cannot run
            if e.code is ErrorCode.UNKNOWN_APP:  # no: the session is gone (its Closed may not have come yet)
                raise SessionReaped(self.session.app, e.message) from None
            log.error("the RMS refused a farm's slots", farm=self.sid, error=e.message)
            for a in asks:
                self.core.slot_ended(a.request)
            while self.core.pending:
                task = self.core.pending.popleft()
                await self.svc._end(task, JobState.FAILED, None, f"the RMS refused its request: {e.message}")

    async def _run(self, runs: list[Run]) -> None:
        """Tasks start: written down (all of them at once), then launched."""
        svc = self.svc
        actions, go = [], []
        async with svc._lock:
            now = svc.clock()
            for d in runs:
                j, r = svc.core.jobs.get(d.task), svc.records.get(d.task)
                if j is None or r is None or j.state is not JobState.QUEUED:
                    self.core.task_ended(d.task)  # (cancelled meanwhile: the slot is free again)
                    continue
                actions += svc.core.started(d.task, now)
                r.node_ids, r.slot = list(d.nodes), d.request
                go.append(d)
            await svc._flush()
        svc._act(actions)
        for d in go:
            self.tasks[d.task] = _Task(d.request)
            self._spawn(self._launch(d))

    @staticmethod
    def _launch_nodes(nodes: tuple[str, ...], sub: BatchSubmit) -> tuple[str, ...]:
        """Where a task's processes run: every node of its slot, or the first for a script."""
        return nodes[:1] if (sub.script is not None or sub.wrap is not None) else nodes

    async def _launch(self, d: Run, again: bool = False) -> None:
        """Start the task's processes on its slot, then hand the outcome to the loop. ``again``: launched
        before a restart, maybe: the pids come back, and the session asks the agents for exits it missed."""
        assert self.session is not None
        svc, sub = self.svc, self._sub_of(d.task)
        j = svc.core.jobs[d.task]
        argv = svc.argv_of(sub)
        out, err = svc._files(j, sub)
        r = svc.records[d.task]
        nodes = tuple(n for n in self._launch_nodes(d.nodes, sub) if not again or n not in {x[0] for x in r.launched})

        async def on(node: str):
            try:
                return await self.session.launch(d.request, node, argv, env=svc._launch_env(j, sub),  # type: ignore[union-attr]
                                                 cwd=sub.cwd, launch_id=f"{d.task}@{node}", stdout=out,
                                                 stderr=err or None, open_mode=sub.open_mode)
            except (bus.WireError, Exception) as e:  # noqa: BLE001 - refused, or no agent answers for it
                return e

        got = await asyncio.gather(*(on(n) for n in nodes))
        self.inbox.put_nowait(("launched", d.task, list(zip(nodes, got, strict=True))))
        if again:
            self.session.reconnected()  # (its exit may have been told while no instance listened)

    async def _launched(self, task: str, results: list) -> None:
        t = self.tasks.get(task)
        if t is None:
            return
        svc = self.svc
        r = svc.records.get(task)
        for node, got in results:
            if isinstance(got, BaseException):
                code = got.code if isinstance(got, bus.WireError) else None
                t.result.refused.append(f"launch on {node}: {got.message if isinstance(got, bus.WireError) else got!r}")
                t.result.exit_code = t.result.exit_code or (CANNOT_RUN.get(code, 1) if code else 1)
                continue
            for pid in got:
                t.left += 1
                self.by_pid[node, pid] = task
                if r is not None:
                    r.launched.append([node, pid, t.request])
                early = self.early.pop((node, pid), None)  # (a quick one's exit came before the reply)
                if early is not None:
                    del self.by_pid[node, pid]
                    self._note_exit(task, t, early)
        t.launching = False
        if r is not None and r.launched:
            self._dirty[task] = r
        if t.over:
            await self._task_over(task)

    async def _exited(self, task: str, ev: Exited) -> None:
        t = self.tasks.get(task)
        if t is None:
            return
        self._note_exit(task, t, ev)
        if t.over:
            await self._task_over(task)

    def _note_exit(self, task: str, t: _Task, ev: Exited) -> None:
        t.exited(ev)
        r = self.svc.records.get(task)
        if r is not None:
            r.exited.append([ev.node, ev.pid])

    async def _task_over(self, task: str) -> None:
        """Every process of the task ended: how it ended goes to the queue (whose next tasks then come in the
        same batch of inputs), and its slot is free."""
        from coorm.services.batch.service import _outcome

        t = self.tasks.pop(task)
        how = self.core.task_ended(task)
        svc = self.svc
        j = svc.core.jobs.get(task)
        if j is None or j.state in ENDED or how == "withdrawn":
            return  # cancelled: the queue knows
        if how == "timeout":
            self._ended.append((task, JobState.TIMEOUT, t.result.exit_code or 124, "its walltime"))
            return
        t.result.started = j.started
        state, code, reason = _outcome(t.result)
        self._ended.append((task, state, code, reason))

    async def _release(self, request: str) -> None:
        assert self.session is not None
        slot = self.core.slots.get(request)
        try:
            await self.session.done(request)
            if slot is not None and not slot.started:  # (a request cancelled before its start ends untold)
                self.inbox.put_nowait(Killed(request, "done", ()))
        except bus.WireError as e:
            if e.code is not ErrorCode.ENDED:
                log.warning("a slot's release was refused", request=request, error=e.message)
            self.inbox.put_nowait(Killed(request, "done", ()))  # (it ended already: its end was told or is lost)

    async def _close(self) -> bool:
        """Nothing left to run: the farm's record goes, then the session. False if tasks came meanwhile (the
        farm goes on). The record goes while this is still the array's farm: a new farm, started once this
        one has said it closes, writes its own, which this one's removal must not follow."""
        with contextlib.suppress(Exception):
            await self.svc.redis.hdel(keys.BATCH_FARMS, self.sid)
        if not self.inbox.empty():
            await self._write_down()
            return False
        self.svc.farm_closing(self.sid, self)
        if self.session is not None:
            await self.session.close()
        log.info("farm done", farm=self.sid, slots=self.core.asked)
        return True

    async def _write_down(self) -> None:
        assert self.session is not None
        rec: dict = {"session": self.session.reply.model_dump(mode="json"), "asked": self.core.asked}
        if self.per_job:
            rec["shape"] = list(self.shape())
        await self.svc.redis.hset(keys.BATCH_FARMS, self.sid, json.dumps(rec))

    # -- plumbing -------------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _arm(self, at: float) -> None:
        if self._wake is not None:
            self._wake.cancel()
        delay = max(0.0, at - self.svc.clock()) + 0.001  # (not a hair early: the core would wait on)
        self._wake = asyncio.get_running_loop().call_later(delay, self.inbox.put_nowait, ("wake",))
