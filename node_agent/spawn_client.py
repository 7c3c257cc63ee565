"""The agent's side of its spawner (:mod:`coorm.node_agent.spawner`): start it, ask it for launches, hear
their exits.

A launch is one datagram out and one back (with the pipes' read ends); an exit comes as a datagram of its
own. If the spawner dies (SIGKILL, out of memory), its children are re-parented to the agent -- the agent
is a child subreaper -- so the agent waits for those itself (through pidfds): their exit codes are still
known. The next launch starts a new spawner. If the agent dies, the spawner does not: it writes its
launches' ends to the ledger (see :mod:`~coorm.node_agent.spawner`) for the agent's successor."""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import socket
import subprocess
import sys
from pathlib import Path

from coorm.node_agent import spawner as _spawner

MAX_FDS = 2  # a launch's pipes: stdout and stderr at most
START_TIMEOUT = 10.0  # the spawner's first answer


class SpawnFailed(Exception):
    """The child could not exec: ``stage`` (cwd, cgroup, identity, files, exec, fork), ``errno``, ``text``
    (for ``files``, the path)."""

    def __init__(self, stage: str, number: int, text: str) -> None:
        super().__init__(f"{stage}: [{number}] {text}")
        self.stage, self.errno, self.text = stage, number, text


class SpawnerGone(Exception):
    """The spawner died while a launch was being asked: whether it started is not known."""


class Spawner:
    def __init__(self, sock: socket.socket, proc: subprocess.Popen, ledger: str | None = None) -> None:
        self.sock = sock
        self.proc = proc
        self.ledger = ledger  # where it writes its launches' ends
        self.loop = asyncio.get_running_loop()
        self._n = 0
        self._asked: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}  # launches whose exit is to come
        self._handed: dict[int, asyncio.Future[int | None]] = {}  # spawn() -> exited(): its launch's exit
        self._room: list[asyncio.Future[None]] = []  # launches waiting for room in the socket to be asked
        self.dead = False
        # never a blocking send: the spawner may itself be blocked telling answers and exits the agent has not
        # read -- a blocking send here deadlocked both, the agent's loop stopped, under 1,000 quick launches
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    def start(cls, ledger: str | None = None) -> Spawner:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.set_inheritable(True)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-E", "-s", str(Path(_spawner.__file__)), str(theirs.fileno()),
                 *([ledger] if ledger is not None else [])], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        return cls(ours, proc, ledger)

    async def spawn(self, *, argv: list[str], env: dict[str, str], cwd: str | None, cgroup: str | None,
                    drop: tuple[int, int, list[int]] | None, files: tuple[str | None, str | None, bool] | None,
                    piped: list[int]) -> tuple[int, dict[int, int], int]:
        """(pid, {1|2: read end of its pipe}, its start in clock ticks since boot, -1 if not known); raises
        :class:`SpawnFailed` or :class:`SpawnerGone`. (The start is read by the spawner before the exec is
        confirmed: a launch that exits at once has one all the same.)"""
        if self.dead:
            raise SpawnerGone("the spawner is gone")
        self._n += 1
        n, fut = self._n, self.loop.create_future()
        self._asked[n] = fut
        try:
            await self._send(marshal.dumps({"id": n, "argv": list(argv), "env": dict(env), "cwd": cwd,
                                            "cgroup": cgroup, "drop": list(drop) if drop else None,
                                            "files": list(files) if files else None, "piped": list(piped)}))
        except BaseException:
            self._asked.pop(n, None)  # (never asked: no answer to wait for; the caller hears why here)
            if fut.done():
                fut.exception()
            else:
                fut.cancel()
            raise
        msg, fds, exit_ = await fut
        if "error" in msg:
            stage, number, text = msg["error"]
            raise SpawnFailed(stage, number, text)
        pid = msg["pid"]
        self._handed[pid] = exit_
        return pid, dict(zip(piped, fds, strict=True)), msg.get("start", -1)

    async def _send(self, data: bytes) -> None:
        """One datagram to the spawner, once its socket has room (a datagram goes whole or not at all)."""
        while True:
            if self.dead:
                raise SpawnerGone("the spawner is gone")
            try:
                self.sock.send(data)
                return
            except BlockingIOError:
                pass
            room = self.loop.create_future()
            if not self._room:
                self.loop.add_writer(self.sock.fileno(), self._writable)
            self._room.append(room)
            await room

    def _writable(self) -> None:
        self.loop.remove_writer(self.sock.fileno())
        self._wake_senders()

    def _wake_senders(self) -> None:
        """Each launch waiting for room tries again (or, the spawner gone, says so)."""
        waiting, self._room = self._room, []
        for room in waiting:
            if not room.done():
                room.set_result(None)

    def exited(self, pid: int) -> asyncio.Future[int | None]:
        """The launch's return code (``-N``: killed by signal N; None: not known)."""
        handed = self._handed.pop(pid, None)
        return handed if handed is not None else self._exits.setdefault(pid, self.loop.create_future())

    def _readable(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, _spawner.MAX_MESSAGE, MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self._gone()
            return
        msg = marshal.loads(data)
        if "exit" in msg:
            fut = self._exits.pop(msg["exit"], None)
            if fut is not None and not fut.done():
                fut.set_result(msg["code"])
            return
        # the exit's future now, not when spawn() resumes: the launch's exit may be the next message (the
        # spawner tells a launch that exited before its exec was confirmed at once after its pid)
        exit_ = self._exits.setdefault(msg["pid"], self.loop.create_future()) if "pid" in msg else None
        asked = self._asked.pop(msg["id"], None)
        if asked is not None and not asked.done():
            asked.set_result((msg, fds, exit_))
        else:
            for fd in fds:
                os.close(fd)

    def _gone(self) -> None:
        """The spawner died: what was being asked is unknown; its children are ours now (we are their
        subreaper): we wait for them ourselves."""
        if self.dead:
            return
        self._hang_up()
        for fut in self._asked.values():
            if not fut.done():
                fut.set_exception(SpawnerGone("the spawner died during the launch"))
        self._asked.clear()
        for pid, fut in list(self._exits.items()):
            if not fut.done():
                _wait_child(self.loop, pid, fut)
        reaped: asyncio.Future[int | None] = self.loop.create_future()
        _wait_child(self.loop, self.proc.pid, reaped)

    def _hang_up(self) -> None:
        """Nothing more to or from the spawner: the socket closed, launches waiting for room told so."""
        self.dead = True
        self.loop.remove_reader(self.sock.fileno())
        self.loop.remove_writer(self.sock.fileno())
        self.sock.close()
        self._wake_senders()

    def close(self) -> None:
        """The agent stops: the spawner goes once its launches have ended (the agent kills them first)."""
        if not self.dead:
            self._hang_up()  # (it exits on end of file, or once its last launch has)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)


def _wait_child(loop: asyncio.AbstractEventLoop, pid: int, fut: asyncio.Future, tries: int = 100) -> None:
    """Wait for a launch of the dead spawner, now a child of ours, without a thread: its pidfd, polled by the
    loop. (The spawner's socket closes before the kernel re-parents its children: a child not yet ours is
    looked at again shortly.)"""
    def collect() -> bool:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            if tries > 0 and os.path.exists(f"/proc/{pid}"):  # not re-parented yet
                loop.call_later(0.01, _wait_child, loop, pid, fut, tries - 1)
            elif not fut.done():  # it ended and was reaped by the spawner, unheard: its code is not known
                fut.set_result(None)
            return True
        if got == 0:
            return False
        if not fut.done():
            fut.set_result(os.waitstatus_to_exitcode(status))
        return True

    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # gone, and reaped by the spawner before it died
        if not fut.done():
            fut.set_result(None)
        return

    def ready() -> None:
        if collect():
            loop.remove_reader(pidfd)
            os.close(pidfd)

    loop.add_reader(pidfd, ready)  # (readable once it exits: then it is ours to wait for)
