"""What ``coorm up`` does when one of its children dies: restart it after a back-off, or give up.

:class:`Backoff` is the decision, pure (times passed in): the first restart after ``first`` seconds, each
next one twice as late up to ``cap``; a child that stayed up ``stable`` seconds starts again from ``first``;
more than ``limit`` deaths within ``window`` seconds and the child is beyond repair (``coorm up`` then stops
everything and exits non-zero). :class:`Child` is a supervised process: how to start it again, its pid,
when it started and how often it died.
"""

from __future__ import annotations

import os
import subprocess
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Backoff:
    first: float = 0.5
    cap: float = 10.0
    stable: float = 30.0
    limit: int = 5
    window: float = 60.0

    def delay(self, deaths: deque[float], started: float, now: float, previous: float | None) -> float | None:
        """How long to wait before starting the child again (it just died at ``now``, having started at
        ``started``; ``deaths`` holds when it died before, ``previous`` the last delay); None: give up."""
        recent = [t for t in deaths if now - t <= self.window]
        if len(recent) >= self.limit:
            return None
        if previous is None or now - started >= self.stable:
            return self.first
        return min(previous * 2, self.cap)


@dataclass(eq=False)
class Child:
    """One supervised process. ``start`` makes a new one (the same command, log and environment)."""

    name: str
    start: Callable[[], subprocess.Popen]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    deaths: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    last_delay: float | None = None
    due: float | None = None  # when it is to be started again (it is dead until then)
    restarts: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def spawn(argv: list[str], *, env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """A child in its own process group (``coorm up`` ends it and all it started by group), its output
    appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=cwd)


def describe(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
