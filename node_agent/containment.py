"""Containing a launch's processes so that nothing it starts escapes its kill: a cgroup v2 per launch where the
host lets the agent create one, else its process group (which ``setsid`` or a double fork can leave).

A launch's cgroup is ``<agent's cgroup dir>/<name>`` (cgroup directories cannot be renamed: the agent's state
file says which launch a name belongs to): the child joins it between fork and exec (so even its first
instruction is inside), everything it forks is born inside, and ``cgroup.kill`` (Linux 5.14) or a SIGKILL to
every member ends them all. The directory of an agent's cgroups outlives a SIGKILLed agent, so a restarted
agent finds what its predecessor left running there (:meth:`Cgroups.leftovers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
from pathlib import Path

from coorm.node_agent import spawner
from coorm.node_agent.spawner import own_cgroup


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a
    hybrid host), or None."""
    mount = spawner.cgroup2_mount(mounts)
    return Path(mount) if mount is not None else None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100] or "_"


class Cgroups:
    """The cgroups of one agent's launches. ``Cgroups.create(agent_id)`` returns None (with the reason in
    :data:`Cgroups.why_not`) where the host does not let this process create cgroups."""

    why_not: str = ""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._seq = 0

    @classmethod
    def create(cls, agent_id: str, scope: str = "") -> Cgroups | None:
        """``scope``: what else tells this agent from another of the same id on the host (its state file):
        a successor finds the cgroups of its own predecessor, never those of a stranger."""
        mount = cgroup2_mount()
        if mount is None:
            cls.why_not = "no cgroup v2 hierarchy is mounted"
            return None
        own = own_cgroup()
        if own is None:
            cls.why_not = "this process is in no cgroup v2"
            return None
        tag = hashlib.sha256(scope.encode()).hexdigest()[:8]
        base = mount / own.lstrip("/") / f"coorm-agent-{_safe(agent_id)}-{tag}"
        try:
            base.mkdir(exist_ok=True)
            probe = base / "probe"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as e:
            cls.why_not = f"cannot create cgroups under {base.parent}: {e.strerror or e}"
            return None
        return cls(base)

    def prepare(self) -> Path:
        """A fresh cgroup for the next launch."""
        while True:
            self._seq += 1
            p = self.base / f"l{os.getpid()}-{self._seq}"
            try:
                p.mkdir()
                return p
            except FileExistsError:
                continue

    @staticmethod
    def joiner(cg: Path):
        """A ``preexec_fn``: the child moves itself into ``cg`` before it execs (nothing it runs starts
        outside)."""
        procs = str(cg / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as f:
                f.write("0")

        return join

    @staticmethod
    def members(cg: Path) -> list[int]:
        try:
            return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    @staticmethod
    def populated(cg: Path) -> bool:
        """Whether anything (zombies excepted) still runs in the cgroup."""
        try:
            for line in (cg / "cgroup.events").read_text().splitlines():
                if line.startswith("populated "):
                    return line.split()[1] == "1"
        except OSError:
            return False
        return False

    def signal(self, cg: Path, sig: int) -> None:
        """``sig`` to every member (SIGKILL through ``cgroup.kill`` where the kernel has it: no member can
        fork away meanwhile)."""
        if sig == signal.SIGKILL:
            try:
                (cg / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for pid in self.members(cg):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    @staticmethod
    def remove(cg: Path) -> bool:
        try:
            cg.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def leftovers(self) -> list[Path]:
        """Every launch cgroup there is (after a restart: those a predecessor left)."""
        try:
            return sorted(p for p in self.base.iterdir() if p.is_dir())
        except OSError:
            return []
