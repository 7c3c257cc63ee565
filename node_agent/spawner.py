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
* spawner -> agent: ``{"id", "pid", "start"}`` (its start, clock ticks since boot) with the read ends of the
  piped fds (``SCM_RIGHTS``, in the order of ``piped``), or ``{"id", "error": [stage, errno, text]}`` (stage
  ``files``: an output file the user cannot write; ``exec``: the program; ``cwd``, ``cgroup``, ``identity``);
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

# CPython's C child for subprocess, with the arguments 3.11 to 3.13 give it (another version: the Python child)
try:
    import _posixsubprocess
except ImportError:  # pragma: no cover - not CPython
    _posixsubprocess = None  # type: ignore[assignment]
_FORK_EXEC = getattr(_posixsubprocess, "fork_exec", None) if (3, 11) <= sys.version_info[:2] <= (3, 13) else None
_DEVNULL: list[int] = []  # /dev/null, open for the children's stdin and the outputs nobody reads
_LIBC: ctypes.CDLL | None
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no C library to load
    _LIBC = None
    _FORK_EXEC = None

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


def _fork(req: dict) -> tuple[int, int, list[int], bool]:
    """Fork one launch: (pid, the read end of its report pipe, the read ends of its output pipes, whether the
    child is C's). Whether it exec'd is read from the report pipe -- EOF (the pipe is close-on-exec), or why
    it could not -- in the loop, so that the next launch is forked while this one's child gets going (on a
    busy host the child may wait tens of milliseconds for a CPU before it execs). Raises :class:`_Refused`
    for what is found wrong before the fork."""
    if _FORK_EXEC is not None:
        try:
            return (*_fork_c(req), True)
        except _WouldBlock:
            pass  # (its child waits for the output's reader, not this process)
    return (*_fork_py(req), False)


class _WouldBlock(Exception):
    """An output file whose opening would wait (a FIFO with no reader yet, a device): the launch's own child
    opens it, as a Python child does."""


class _Refused(Exception):
    """A launch that cannot start, found before its fork: (stage, errno, text) as a child reports them."""

    def __init__(self, stage: str, number: int | None, text: str) -> None:
        super().__init__(stage, number, text)
        self.stage, self.number, self.text = stage, number or errno.EINVAL, text


def _fork_c(req: dict) -> tuple[int, int, list[int]]:
    """The launch forked by CPython's own C child (``_posixsubprocess``, subprocess's): no Python runs in the
    child, whose copy-on-write faults on the interpreter's pages and page-table teardown cost 2 ms of a
    CPU per launch (measured: a Python child exec'ing ``sh -c true`` 2.3 ms, the C child 1.1 ms). What the
    C child cannot do is done here, with the same rights: the output files are opened before the fork as the
    user (file-system uid and gid, and the user's groups, while root: the checks and the new files' owner are
    the user's), relative to the working directory; the child is born in its cgroup because this process
    steps into the cgroup for the fork and out again. The child: its session, the working directory (still
    root), signals at their defaults, groups, gid, uid, every other descriptor closed, exec."""
    argv, env = req["argv"], req["env"]
    cwd, cgroup, drop, files = req.get("cwd"), req.get("cgroup"), req.get("drop"), req.get("files")
    piped = list(req.get("piped", ()))
    mine: list[int] = []  # this side's descriptors, closed on the way out
    try:
        where = None
        if cwd is not None:
            try:
                where = os.open(cwd, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as e:
                raise _Refused("cwd", e.errno, e.strerror or str(e)) from None
            mine.append(where)
        std = {1: _DEVNULL[0], 2: _DEVNULL[0]}
        out: list[int] = []
        for fd in piped:
            r, w = os.pipe()
            out.append(r)
            mine.append(w)
            std[fd] = w
        if files is not None:
            opened = _open_as(drop, files, where)
            mine.extend(set(opened.values()))
            std.update(opened)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        mine.append(report_w)
        exe = os.fsencode(argv[0])
        executables = (exe,) if os.path.dirname(exe) else tuple(
            os.path.join(os.fsencode(d), exe) for d in os.get_exec_path(env))
        env_list = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
        uid, gid, groups = drop if drop is not None else (None, None, None)
        _enter(cgroup)
        try:
            pid = _FORK_EXEC(  # type: ignore[misc]
                argv, executables, True, (report_w,), cwd, env_list, _DEVNULL[0], -1, -1, std[1], -1, std[2],
                report_r, report_w, True, True, -1, gid, list(groups) if groups is not None else None, uid, -1,
                None, True)
        except BaseException:
            os.close(report_r)
            for r in out:
                os.close(r)
            raise
        finally:
            _leave(cgroup)
        return pid, report_r, out
    finally:
        for fd in mine:
            os.close(fd)


def _open_as(drop, files, where: int | None) -> dict[int, int]:
    """The launch's output files, opened as the user would open them: {1: fd, 2: fd} (one descriptor for both
    when they are one file). The file-system ids and the groups are the user's for the ``open`` only. Opened
    without waiting (:class:`_WouldBlock`): a FIFO must not hold the launches behind it. (A file system that
    hangs holds this process, as it holds the agent, which checks the working directory before it asks.)"""
    out, err, append = files
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_APPEND if append else os.O_TRUNC)
    saved = os.getgroups() if drop is not None else None
    libc = _LIBC
    assert libc is not None  # (no fast path without it)
    opened: dict[str, int] = {}
    got: dict[int, int] = {}
    try:
        if drop is not None:
            uid, gid, groups = drop
            os.setgroups(list(groups))
            libc.setfsgid(gid)
            libc.setfsuid(uid)
            if libc.setfsuid(uid) != uid or libc.setfsgid(gid) != gid:  # (each returns the one in force)
                raise _Refused("identity", errno.EPERM, "cannot take the user's file-system identity")
        for fd, path in ((1, out), (2, err if err is not None or out is None else out)):
            if path is None:
                continue
            if path not in opened:
                try:
                    opened[path] = fd_ = os.open(path, flags, 0o644, dir_fd=where)
                except OSError as e:
                    if e.errno in (errno.ENXIO, errno.EAGAIN):
                        raise _WouldBlock from None
                    raise _Refused("files", e.errno, path) from None
                os.set_blocking(fd_, True)  # (opened so as not to wait; the program writes as to any file)
            got[fd] = opened[path]
    except BaseException:
        for fd in opened.values():
            os.close(fd)
        raise
    finally:
        if drop is not None:
            libc.setfsuid(os.geteuid())
            libc.setfsgid(os.getegid())
            os.setgroups(saved or [])
    return got


_HOME: list[int] = []  # this process's own cgroup.procs, open for writing (once a launch had a cgroup)


def _enter(cgroup: str | None) -> None:
    """Step into the launch's cgroup, so that the child is born there (``0``: the writer itself)."""
    if cgroup is None:
        return
    try:
        if not _HOME:
            _HOME.append(os.open(_own_cgroup_procs(), os.O_WRONLY | os.O_CLOEXEC))
        fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    except OSError as e:
        raise _Refused("cgroup", e.errno, e.strerror or str(e)) from None


def _leave(cgroup: str | None) -> None:
    """Back to this process's own cgroup. One that cannot go back (root writing its own cgroup's procs: not
    seen) would die with the launch's kill: it goes now instead, and the agent starts another spawner."""
    if cgroup is not None:
        for _ in range(3):
            try:
                os.write(_HOME[0], b"0")
                return
            except OSError:
                continue
        os._exit(70)


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a
    hybrid host), or None. (Here, standard library only, for this process; the agent's
    :mod:`~coorm.node_agent.containment` reads it through this one.)"""
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        pass
    return None


def own_cgroup(path: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup v2 path (the ``0::`` line), or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _own_cgroup_procs() -> str:
    """``cgroup.procs`` of this process's cgroup v2."""
    mount, rel = cgroup2_mount(), own_cgroup()
    if mount is None or rel is None:
        raise OSError(errno.ENOENT, "no cgroup v2 hierarchy")
    return os.path.join(mount, rel.lstrip("/"), "cgroup.procs")


def _c_report(data: bytes) -> tuple[str, int, str]:
    """What the C child wrote on its pipe (``Name:errno in hex:what``) in the stages of :func:`child_steps`."""
    _name, number, what = (data.split(b":", 2) + [b"", b""])[:3]
    try:
        code = int(number, 16)
    except ValueError:
        code = errno.EINVAL
    text = os.strerror(code) if code else what.decode(errors="replace")
    if what == b"noexec:chdir":
        return "cwd", code, text
    if what.startswith(b"noexec"):
        return "identity", code, text
    return "exec", code, text


def _fork_py(req: dict) -> tuple[int, int, list[int]]:
    """The launch forked with a Python child doing :func:`child_steps` (where ``_posixsubprocess`` is not
    this Python's as :func:`_fork_c` knows it)."""
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

    def __init__(self, request: int, pid: int, fds: list[int], c_child: bool) -> None:
        self.request, self.pid, self.fds, self.c_child = request, pid, fds, c_child
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
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
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
            if launch.c_child:
                send({"id": launch.request, "error": list(_c_report(launch.report))})
                return
            stage, number, text = (launch.report.split(b"\0", 2) + [b"", b""])[:3]
            send({"id": launch.request, "error": [stage.decode(), int(number or 0), os.fsdecode(text)]})
            return
        send({"id": launch.request, "pid": launch.pid, "start": launch.start}, launch.fds)
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
                pid, report, fds, c_child = _fork(req)
            except _Refused as e:
                send({"id": req["id"], "error": [e.stage, e.number, e.text]})
                continue
            except OSError as e:  # (fork or pipe: out of resources)
                send({"id": req["id"], "error": ["fork", e.errno or errno.EAGAIN, e.strerror or str(e)]})
                continue
            starting[report] = _Starting(req["id"], pid, fds, c_child)
            sel.register(report, selectors.EVENT_READ, "report")
        reap_all()  # (a SIGCHLD that came while a launch was being answered)


def main() -> None:
    fd = int(sys.argv[1])
    ledger = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600) \
        if len(sys.argv) > 2 else None
    # (sent to the agent's group: the agent stops, then this goes.) Caught, not ignored: an ignored signal
    # would stay ignored in the C child's exec'd program, a caught one is back at its default there
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    try:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except AttributeError:
        pass
    with socket.socket(fileno=fd) as sock:
        serve(sock, ledger)


if __name__ == "__main__":
    main()
