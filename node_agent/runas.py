"""Under which Unix identity, with which environment and in which directory a launch starts -- or why it
may not. The user is the application's (the one NATS authenticated); node agents on every host share the
users' names, as batch systems do.

An agent running as root starts the process as the user: uid, gid and supplementary groups, set by the
child itself just before ``exec`` (:meth:`RunAs.dropper`). An agent
that is not root cannot change identity: it starts processes only for its own user. The environment is
never the agent's (it holds the agent's credentials): a clean one with the user's ``HOME``, ``USER``,
``LOGNAME``, ``SHELL`` and a default ``PATH``, then what the user exported, then the agent's ``COORM_*``.

Output files (a batch job's ``-o``/``-e``) are opened with the user's rights only, so that the agent's never
reach a file: not ``/etc/passwd``, not another user's file, not through a symbolic link -- by the spawner
with the user's file-system ids and groups for the ``open`` (``node_agent/spawner.py``), or by the child
itself after it dropped to the user (:class:`OutputFiles`, without a spawner). Why an open failed comes back
to the agent.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import pwd
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from coorm.shared.events import ErrorCode

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class LaunchRefused(Exception):
    """A launch the agent must refuse: ``code`` for the protocol, ``message`` in words a user can act on."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class RunAs:
    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups
    home: str
    shell: str
    agent_uid: int  # who the agent runs as: it changes identity only from root

    def identity(self) -> tuple[int, int, list[int]] | None:
        """(uid, gid, supplementary groups) the child takes, or None when the agent already is this user."""
        if self.agent_uid == self.uid:
            return None
        return self.uid, self.gid, list(self.groups)

    def dropper(self) -> Callable[[], None] | None:
        """A ``preexec_fn`` step that makes the child this identity (supplementary groups, then gid, then
        uid: each needs the privilege the next one gives up), or None when the agent already is it. It is the
        child's last step before ``exec``: joining its cgroup before it needs root's rights. (``subprocess``'s
        own ``user=`` would drop them before any ``preexec_fn`` runs.)"""
        ident = self.identity()
        if ident is None:
            return None
        uid, gid, groups = ident

        def drop() -> None:
            os.setgroups(groups)
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)

        return drop


def chain(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    """One ``preexec_fn`` running ``steps`` (the Nones left out) in order."""
    todo = [s for s in steps if s is not None]
    if not todo:
        return None

    def run() -> None:
        for step in todo:
            step()

    return run


def resolve(user: str, *, agent_uid: int | None = None) -> RunAs:
    agent_uid = os.geteuid() if agent_uid is None else agent_uid
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise LaunchRefused(ErrorCode.UNKNOWN_USER, f"no user {user!r} on this node") from None
    if agent_uid != 0 and pw.pw_uid != agent_uid:
        try:
            mine = pwd.getpwuid(agent_uid).pw_name
        except KeyError:
            mine = str(agent_uid)
        raise LaunchRefused(ErrorCode.FORBIDDEN, f"this agent runs as {mine} (not root): it starts processes only "
                                                 f"for {mine}, not {user}")
    groups = tuple(g for g in os.getgrouplist(user, pw.pw_gid))
    return RunAs(user=user, uid=pw.pw_uid, gid=pw.pw_gid, groups=groups, home=pw.pw_dir,
                 shell=pw.pw_shell or "/bin/sh", agent_uid=agent_uid)


def _valid_name(name: str) -> bool:
    return bool(name) and "=" not in name and "\x00" not in name


def launch_env(run: RunAs, requested: Mapping[str, str], *, deny: Sequence[str],
               coorm: Mapping[str, str]) -> dict[str, str]:
    """The process's environment: the user's basics, then ``requested``, then ``coorm`` (which the user may
    not override); a requested name matching a ``deny`` pattern refuses the launch."""
    denied = _denied(tuple(deny))
    for name, value in requested.items():
        if not _valid_name(name) or "\x00" in value:
            raise LaunchRefused(ErrorCode.BAD_REQUEST, f"not an environment variable: {name[:64]!r}")
        if name not in coorm and denied is not None and denied.match(name):
            raise LaunchRefused(ErrorCode.FORBIDDEN, f"the environment may not set {name} (the operator's "
                                                     "COORM_LAUNCH_ENV_DENY)")
    base = {"HOME": run.home, "USER": run.user, "LOGNAME": run.user, "SHELL": run.shell, "PATH": DEFAULT_PATH}
    return {**base, **requested, **coorm}


@functools.lru_cache(maxsize=16)
def _denied(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """``fnmatch.fnmatchcase`` of any of ``patterns``, as one expression: a batch job carries its submitter's
    whole environment, and a hundred names times each pattern was a tenth of the agent's time per launch."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _may_search(st: os.stat_result, run: RunAs) -> bool:
    """Whether ``run`` may search (enter) a directory with these mode bits (ACLs are not read)."""
    if run.uid == 0:
        return True
    if st.st_uid == run.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == run.gid or st.st_gid in run.groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def check_cwd(run: RunAs, cwd: str | None) -> str:
    """The directory the process starts in: ``cwd``, which must be a directory the user can enter (every
    component from ``/`` down searchable by the user: by owner, group or other bits; ACLs are not read), or
    by default the user's home if the user can enter it, else ``/``. The agent changes to it before dropping
    privileges (CPython's child does ``chdir`` first), so the check is the agent's to make."""
    if cwd is None:
        try:
            return check_cwd(run, run.home)
        except LaunchRefused:
            return "/"
    if not os.path.isabs(cwd):
        raise LaunchRefused(ErrorCode.BAD_REQUEST, f"the working directory must be absolute: {cwd!r}")
    real = os.path.realpath(cwd)
    path = "/"
    for part in ["", *[p for p in real.split("/") if p]]:
        path = os.path.join(path, part) if part else "/"
        try:
            st = os.stat(path)
        except OSError:
            raise LaunchRefused(ErrorCode.BAD_CWD, f"{cwd} does not exist") from None
        if not stat.S_ISDIR(st.st_mode):
            raise LaunchRefused(ErrorCode.BAD_CWD, f"{cwd} is not a directory")
        if not _may_search(st, run):
            raise LaunchRefused(ErrorCode.BAD_CWD, f"{run.user} cannot enter {cwd}: {path} is closed to them")
    return real


class OutputFiles:
    """Where a launch's stdout and stderr go when they go to files (``stdout`` or ``stderr`` set; ``stderr``
    None with ``stdout`` set: the same file). :meth:`opener` is the child's last ``preexec_fn`` step, after
    :meth:`RunAs.dropper`: it opens each file with the user's rights (``O_WRONLY|O_CREAT`` and ``O_APPEND`` or
    ``O_TRUNC``, mode 0644 less the umask) and puts it on fd 1 and 2. When an open fails, the child writes
    the errno and the path on a pipe before failing (``Popen`` only says that the ``preexec_fn`` raised):
    :meth:`refusal` reads it in the agent. Use it as a context manager around the ``Popen`` (it closes the
    pipe)."""

    def __init__(self, stdout: str | None, stderr: str | None, *, append: bool = True) -> None:
        if stdout is None and stderr is None:
            raise ValueError("no output file")
        self.stdout = stdout
        self.stderr = stderr if stderr is not None or stdout is None else stdout
        self.flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
        # close-on-exec at both ends: the child's end is gone by the program's exec (and when it fails, with
        # the child): a read in the agent never waits
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)

    def opener(self) -> Callable[[], None]:
        """The ``preexec_fn`` step (in the child, as the user)."""
        targets = [(fd, path) for fd, path in ((1, self.stdout), (2, self.stderr)) if path is not None]
        flags, report = self.flags, self._write

        def open_files() -> None:
            opened: dict[str, int] = {}
            for fd, path in targets:
                if path not in opened:
                    try:
                        opened[path] = os.open(path, flags, 0o644)
                    except OSError as e:
                        os.write(report, b"%d\0%s" % (e.errno or 0, os.fsencode(path)))
                        raise
                os.dup2(opened[path], fd)
            for f in opened.values():
                os.close(f)

        return open_files

    def refusal(self, user: str) -> str | None:
        """After a ``Popen`` that failed: why (naming the file and the reason), if it was an output file
        the user could not open."""
        self._close_write()
        data = b""
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:  # (a child still holding the other end: not expected, never waited for)
                break
            if not chunk:
                break
            data += chunk
        number, sep, path = data.partition(b"\0")
        if not sep or not number.isdigit():
            return None
        code = int(number)
        reason = os.strerror(code) if code else "cannot be opened"
        return f"{user} cannot write the output to {os.fsdecode(path)}: {reason}"

    def _close_write(self) -> None:
        if self._write >= 0:
            os.close(self._write)
            self._write = -1

    def close(self) -> None:
        self._close_write()
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def __enter__(self) -> OutputFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
