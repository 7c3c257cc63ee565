"""Process-group helpers for the agent: signal a launch's group, tell whether anything in it still runs,
reap what it left behind.

Each launch runs in its own session, so its process group ID is its pid. Members of a killed group whose
parent died are re-parented to the nearest *subreaper*: with :func:`set_child_subreaper` the agent is that
subreaper and :func:`reap_group` collects them, so the group disappears at once; without it they linger
as zombies until init reaps them. Zombies run nothing: :func:`group_alive` does not count them.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Container

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def set_child_subreaper(on: bool = True) -> bool:
    """Make this process (not) the subreaper of its descendants (Linux). False if not supported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def is_child_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return False
        return bool(flag.value)
    except (OSError, AttributeError):
        return False


_holders = 0
_previous = False


def acquire_subreaper() -> bool:
    """Be the subreaper while at least one agent in this process wants it (see :func:`release_subreaper`).
    False if not supported."""
    global _holders, _previous
    if _holders == 0:
        _previous = is_child_subreaper()
        if not _previous and not set_child_subreaper(True):
            return False
    _holders += 1
    return True


def release_subreaper() -> None:
    """The last agent that acquired it stopped: back to what the process was before."""
    global _holders
    if _holders == 0:
        return
    _holders -= 1
    if _holders == 0 and not _previous:
        set_child_subreaper(False)


def use_pidfd_child_watcher() -> bool:
    """Wait for launched processes through pidfds polled by the running event loop. Python 3.11's default
    watcher starts a thread per child to block in ``waitpid``: a third of the agent's CPU per short job.
    (3.12 and later use pidfds by default.) False when not applied. Call from the running loop."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # pragma: no cover - a kernel older than 5.3, or a sandbox without pidfd_open
        return False
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.get_event_loop_policy().set_child_watcher(watcher)
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a group member that changed its credentials
        return True
    return True


def reap_group(pgid: int, keep: Container[int] = ()) -> int:
    """Collect the exit status of every exited child of ours in the group (orphans re-parented to us as
    subreaper), except the pids in ``keep``: launched leaders whose status asyncio's child watcher must
    collect (a leader's pid is its group's id, and a reused pid names a new leader's group). Reaping one of
    those here would make the watcher report a made-up status. Returns how many were reaped."""
    members = _members(pgid)
    if members is None:  # pragma: no cover - no /proc: reap by group, unless the group is a kept leader's
        return 0 if pgid in keep else _reap_by_group(pgid)
    me, n = os.getpid(), 0
    for pid, state, ppid in members:
        if state in ("Z", "X") and ppid == me and pid not in keep:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    n += 1
            except ChildProcessError:
                pass
    return n


def reap_orphans(keep: Container[int] = ()) -> int:
    """Collect every exited child of ours that is not in ``keep``, whatever its group: what left its launch's
    group (``setsid``) and was killed with its cgroup comes back to us, the subreaper, as a zombie."""
    return reap_group(-1, keep)


def _reap_by_group(pgid: int) -> int:  # pragma: no cover - hosts without /proc
    n = 0
    while True:
        try:
            res = os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG)
        except OSError:
            return n
        if res is None:
            return n
        n += 1


def _members(pgid: int) -> list[tuple[int, str, int]] | None:
    """(pid, state letter, parent pid) of every process in the group (-1: of every group), from /proc; None
    without /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    out = []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) >= 3 and (pgid == -1 or int(fields[2]) == pgid):
            out.append((int(name), fields[0].decode(), int(fields[1])))
    return out


def group_alive(pgid: int, keep: Container[int] = ()) -> bool:
    """Whether any process of the group still runs (zombies do not count; ours are reaped first, except
    ``keep``: see :func:`reap_group`)."""
    try:  # a group with no member, not even a zombie, is gone: the common case needs no scan of /proc
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        pass
    reap_group(pgid, keep)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    members = _members(pgid)
    if members is None:  # pragma: no cover - no /proc: trust kill(0)
        return True
    if any(state not in ("Z", "X") for _, state, _ in members):
        return True
    reap_group(pgid, keep)  # only zombies left: collect those that are ours
    return False


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, an
    identity that a reused pid does not share. None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


SIGTERM = signal.SIGTERM
SIGKILL = signal.SIGKILL
