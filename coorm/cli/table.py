"""The batch queue as squeue prints it, from the jobs' JSON (``BatchJob`` as dicts): the standard library
only, so that the ``coorm`` script's light path (``coorm queue``) and the full command line print the same
table, and ten thousand rows print in well under a second."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

SHORT_STATE = {"held": "PD", "blocked": "PD", "eligible": "PD", "queued": "PD", "running": "R", "completed": "CD",
               "failed": "F", "timeout": "TO", "cancelled": "CA", "node_fail": "NF"}
QUEUE_HEADER = ("JOBID", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)")


def human(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_time(t: float | None, now: float | None = None) -> str:
    if t is None:
        return "never"
    import time

    stamp = time.strftime("%H:%M:%S", time.localtime(t))
    if now is None:
        return stamp
    d = t - now
    if abs(d) < 0.5:
        return f"{stamp} (now)"
    return f"{stamp} ({'in ' if d > 0 else ''}{human(abs(d))}{' ago' if d < 0 else ''})"


def reason(j: Mapping) -> str:
    """Where a job runs, or why it waits (squeue's NODELIST(REASON))."""
    state = j["state"]
    if state == "running":
        nodes = j.get("node_ids") or []
        return ",".join(nodes) if len(nodes) <= 4 else f"{nodes[0]}..(+{len(nodes) - 1})"
    if state == "held":
        return "(held)"
    if state == "blocked":
        return f"({j.get('reason') or 'Dependency'})"
    if state == "eligible":
        return "(entering the RMS)"
    if j.get("start_estimate") is not None:
        return f"(Resources, ~{fmt_time(j['start_estimate'])})"
    return f"({j.get('reason') or 'Resources'})"


def queue_rows(jobs: Sequence[Mapping], now: float) -> list[tuple[str, ...]]:
    return [(j["id"], j["name"][:12], j["user"][:10], SHORT_STATE[j["state"]],
             human(now - j["started"]) if j.get("started") else "0s", str(j["nodes"]), reason(j)) for j in jobs]


def columns(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: set[str], last_free: bool = True) -> None:
    """A plain table, as squeue prints one: fast for ten thousand rows, and grep-able."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    if last_free:
        widths[-1] = 0

    def fmt(cells) -> str:
        return " ".join(c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(cells, widths, header, strict=True))

    sys.stdout.write("\n".join([fmt(header).rstrip()] + [fmt(r).rstrip() for r in rows]) + "\n")


def print_queue(jobs: Sequence[Mapping], now: float) -> None:
    columns(QUEUE_HEADER, queue_rows(jobs, now), {"JOBID", "TIME", "NODES"})


HISTORY_HEADER = ("JobID", "JobName", "User", "State", "ExitCode", "Elapsed", "NodeHours")


def print_history(jobs: Sequence[Mapping]) -> None:
    """``coorm history``'s table (sacct): one row per ended job, from its record as the service sends it."""
    rows = []
    for j in jobs:
        started, ended, code = j.get("started"), j.get("ended"), j.get("exit_code")
        elapsed = (ended - started) if started and ended else 0.0
        rows.append((str(j["id"]), j["name"][:12], j["user"][:10], str(j["state"]).upper(),
                     "-" if code is None else str(code), human(elapsed), f"{elapsed * j['nodes'] / 3600:.2f}"))
    columns(HISTORY_HEADER, rows, {"JobID", "ExitCode", "Elapsed", "NodeHours"}, last_free=False)
