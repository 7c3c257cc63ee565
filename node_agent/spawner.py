"""The agent's spawner: a small process that forks the launches, so that the agent does not fork itself.

A fork copies the forking process's page tables and, until the child execs, every page either of them
writes: for the agent (some 70 MB of Python, with a ``preexec_fn`` that runs Python in the child to join
the cgroup, change identity and open the output files) that cost about 5.5 ms of the agent's CPU per
launch, most of the agent's time on a stream of short jobs, against 0.2 ms for a ``vfork``. This process
is a fresh interpreter without ``site`` (a few MB): its forks are cheap, and the child does exactly what
the agent's ``preexec_fn`` did, in the same order -- new session, working directory, cgroup (while still
root), identity (groups, gid, uid), output files (opened as the user), then ``exec`` -- so the agent's
guarantees are the same.

Protocol, over a ``SOCK_SEQPACKET`` socket pair with the agent (one message per datagram, ``marshal``):

* agent -> spawner: ``{"id", "argv", "env", "cwd", "cgroup", "drop": [uid, gid, [groups]] | None,
  "files": [stdout, stderr, append] | None, "piped": [1, 2]}``;
* spawner -> agent: ``{"id", "pid"}`` with the read ends of the piped fds (``SCM_RIGHTS``, in the order of
  ``piped``), or ``{"id", "error": [stage, errno, text]}`` (stage ``files``: an output file the user cannot
  write; ``exec``: the program; ``cwd``, ``cgroup``, ``identity``);
* spawner -> agent: ``{"exit": pid, "code": returncode}`` when a launched process ends (``-N``: signal N).

The spawner is its children's subreaper (what a launch leaves behind comes back to it and is reaped). An
agent SIGKILLed does not take the spawner with it: it goes on reaping its launches, and writes their ends
to the agent's *ledger* of exits (a file, one line ``pid start code`` each, the start in clock ticks as
``/proc/<pid>/stat`` has it) -- those that come after the agent's death, and the last ``RECENT`` before it,
which the agent may not have read. The successor kills what still runs, waits for the spawner to leave
(once its last launch has ended), then reads from the ledger how each one ended: the exit code of one that
ended while no agent watched is known. Standard library only: it runs with ``python -S``."""

from __future__ import annotations

import collections
import ctypes
import errno
import marshal
import os
import selectors
import signal
import socket
import sys
import warnings  # noqa: F401 - os.execvpe imports it; the child, no longer root, may not read the stdlib

RECENT = 4096  # exits kept for the ledger while the agent lives: more than it can have left unread
MAX_MESSAGE = 1 << 20  # a launch's argv and environment fit (NATS caps a message at 1 MB too)
_PR_SET_CHILD_SUBREAPER = 36


def child_steps(cwd: str | None, cgroup: str | None, drop, files, report: int) -> None:
    """In the child, before exec, in this order: working directory, cgroup (needs root), identity, output
    files (as the user). A failure writes ``stage\\0errno\\0text`` on ``report`` and raises."""
    stage = "cwd"
    try:
        if cwd is not None:
            os.chdir(cwd)
        stage = "cgroup"
        if cgroup is not None:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write("0")
        stage = "identity"
        if drop is not None:
            uid, gid, groups = drop
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        stage = "files"
        if files is not None:
            out, err, append = files
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
            opened: dict[str, int] = {}
            for fd, path in ((1, out), (2, err if err is not None or out is None else out)):
                if path is None:
                    continue
                if path not in opened:
                    opened[path] = os.open(path, flags, 0o644)
                os.dup2(opened[path], fd)
            for opened_fd in opened.values():
                os.close(opened_fd)
    except OSError as e:
        text = os.fsencode(e.filename) if stage == "files" and e.filename is not None else \
            (e.strerror or str(e)).encode()
        os.write(report, b"%s\0%d\0%s" % (stage.encode(), e.errno or 0, text))
        raise


def _fork(req: dict) -> tuple[int, int, list[int]]:
    """Fork one launch: (pid, the read end of its report pipe, the read ends of its output pipes). Whether it
    exec'd is read from the report pipe -- EOF (the pipe is close-on-exec), or why it could not -- in the
    loop, so that the next launch is forked while this one's child gets going (on a busy host the child may
    wait tens of milliseconds for a CPU before it execs)."""
    piped = list(req.get("piped", ()))
    pipes = {fd: os.pipe() for fd in piped}
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    devnull = os.open(os.devnull, os.O_RDWR)
    pid = os.fork()
    if pid == 0:  # the child: nothing here returns, whatever happens
        try:
            os.setsid()
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.dup2(devnull, 0)
            for fd in (1, 2):
                os.dup2(pipes[fd][1] if fd in pipes else devnull, fd)
            child_steps(req.get("cwd"), req.get("cgroup"), req.get("drop"), req.get("files"), report_w)
            os.closerange(3, report_w)
            os.closerange(report_w + 1, 1 << 16)
            argv, env = req["argv"], req["env"]
            try:
                os.execvpe(argv[0], argv, env)
            except OSError as e:
                os.write(report_w, b"exec\0%d\0%s" % (e.errno or 0, (e.strerror or str(e)).encode()))
        except OSError:
            pass  # (reported on the pipe)
        except BaseException as e:  # noqa: BLE001 - reported on the pipe: the child goes
            try:
                os.write(report_w, b"spawn\0%d\0%s" % (errno.EINVAL, type(e).__name__.encode()))
            except BaseException:  # noqa: BLE001, S110 - nothing more can be said
                pass
        finally:
            os._exit(127)
    os.close(report_w)
    os.close(devnull)
    for _r, w in pipes.values():
        os.close(w)
    return pid, report_r, [pipes[fd][0] for fd in piped]


class _Starting:
    """A launch forked, its exec not yet confirmed."""

    def __init__(self, request: int, pid: int, fds: list[int]) -> None:
        self.request, self.pid, self.fds = request, pid, fds
        self.report = b""  # why it could not exec, as the child wrote it
        self.start = _start_time(pid)


def _start_time(pid: int) -> int:
    """The process's start (clock ticks since boot): with the pid, what a reused pid does not share."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[-1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def _reap(pid: int) -> None:
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def serve(sock: socket.socket, ledger: int | None = None) -> None:
    launched: dict[int, int] = {}  # exec'd: their exits are told -> their start
    starting: dict[int, _Starting] = {}  # report pipe -> launch
    early: dict[int, int] = {}  # pid -> return code of a launch reaped before its exec was confirmed
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (the wakeup fd tells the loop)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "agent")
    sel.register(wake_r, selectors.EVENT_READ, "child")

    agent = True  # (until its end of the socket closes)
    recent: collections.deque[bytes] = collections.deque(maxlen=RECENT)

    def write_down(lines) -> None:
        if ledger is not None:
            try:
                os.write(ledger, b"".join(lines))
            except OSError:
                pass  # (a full disk: the successor reports the codes unknown)

    def send(msg: dict, fds: list[int] | None = None) -> None:
        if not agent:
            return
        data = marshal.dumps(msg)
        try:
            if fds:
                socket.send_fds(sock, [data], fds)
            else:
                sock.send(data)
        except OSError:
            pass  # the agent died: its successor reads the ledger

    def ended(pid: int, start: int, code: int) -> None:
        line = b"%d %d %d\n" % (pid, start, code)
        if agent:
            recent.append(line)  # (told, but the agent may die before it reads it)
            send({"exit": pid, "code": code})
        else:
            write_down([line])

    def reap_all() -> None:
        pids = {s.pid for s in starting.values()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in launched:
                ended(pid, launched.pop(pid), os.waitstatus_to_exitcode(status))
            elif pid in pids:  # (told once its exec is: the agent must have the pid before its exit)
                early[pid] = os.waitstatus_to_exitcode(status)

    def reported(fd: int) -> None:
        """The child's report pipe: more of why it failed, or EOF -- it exec'd, or it failed and said why."""
        launch = starting[fd]
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            return
        if chunk:
            launch.report += chunk
            return
        sel.unregister(fd)
        os.close(fd)
        del starting[fd]
        if launch.report:
            for r in launch.fds:
                os.close(r)
            if early.pop(launch.pid, None) is None:
                _reap(launch.pid)  # (it exits at once after saying why)
            stage, number, text = (launch.report.split(b"\0", 2) + [b"", b""])[:3]
            send({"id": launch.request, "error": [stage.decode(), int(number or 0), os.fsdecode(text)]})
            return
        send({"id": launch.request, "pid": launch.pid}, launch.fds)
        for r in launch.fds:
            os.close(r)
        code = early.pop(launch.pid, None)
        if code is None:
            launched[launch.pid] = launch.start
        else:
            ended(launch.pid, launch.start, code)

    while agent or launched or starting:
        for key, _ in sel.select():
            if key.data == "child":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                reap_all()
                continue
            if key.data == "report":
                reported(key.fd)
                continue
            try:
                data = sock.recv(MAX_MESSAGE)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not data:  # the agent is gone: its launches go on, and their ends go to the ledger
                agent = False
                sel.unregister(sock)
                write_down(recent)
                continue
            req = marshal.loads(data)
            try:
                pid, report, fds = _fork(req)
            except OSError as e:  # (fork or pipe: out of resources)
                send({"id": req["id"], "error": ["fork", e.errno or errno.EAGAIN, e.strerror or str(e)]})
                continue
            starting[report] = _Starting(req["id"], pid, fds)
            sel.register(report, selectors.EVENT_READ, "report")
        reap_all()  # (a SIGCHLD that came while a launch was being answered)


def main() -> None:
    fd = int(sys.argv[1])
    ledger = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600) \
        if len(sys.argv) > 2 else None
    for sig in (signal.SIGINT, signal.SIGTERM):  # (sent to the agent's group: the agent stops, then this goes)
        signal.signal(sig, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    with socket.socket(fileno=fd) as sock:
        serve(sock, ledger)


if __name__ == "__main__":
    main()
