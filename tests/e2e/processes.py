"""What the end-to-end tests do with the processes a user would start: wait for what they produce, and
stop them as Ctrl-C does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


def wait_for(predicate, timeout: float, what: str, *, errors: tuple[type[BaseException], ...] = ()):
    """Poll something another process produces (a file, a command's answer), with a deadline. Exceptions of
    the types in ``errors`` count as 'not yet'."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except errors as e:
            value, last = None, e
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what if last is None else f"{what} (last error: {last})")


def interrupt(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGINT to the process group (Ctrl-C), then SIGKILL if it is still there after ``timeout``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
