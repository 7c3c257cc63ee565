"""Jobs from a Standard Workload Format trace (the Parallel Workloads Archive's ``.swf.gz`` files).

A job's node count is its processor count divided by the machine's cores per node (from the header's
MaxProcs / MaxNodes), rounded up; its walltime is the user's requested time (its run time when unknown)
and its run time never exceeds it (the batch system killed it there). ``submit`` is the log's own submit
time (seconds since its header's start time), ``user`` its user number (-1: unknown).
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: int
    submit: float
    runtime: float
    walltime: float
    nodes: int
    user: int = -1


def _header(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        if ":" in line:
            key, _, value = line.lstrip("; ").partition(":")
            out[key.strip()] = value.strip()
    return out


def read_swf(path: str | Path, *, skip: int = 0, count: int | None = None) -> tuple[list[TraceJob], int]:
    """Usable jobs (processors and run time known), the ``skip``-th on; and the cores per node."""
    comments: list[str] = []
    jobs: list[TraceJob] = []
    with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as f:
        for line in f:
            if line.startswith(";"):
                comments.append(line)
                continue
            fields = line.split()
            if len(fields) < 9:
                continue
            runtime = float(fields[3])
            procs = int(fields[4]) if int(fields[4]) > 0 else int(fields[7])
            if runtime <= 0 or procs <= 0:
                continue
            requested = float(fields[8])
            walltime = requested if requested > 0 else runtime
            user = int(fields[11]) if len(fields) > 11 else -1
            jobs.append(TraceJob(int(fields[0]), float(fields[1]), min(runtime, walltime), walltime, procs, user))
    head = _header(comments)
    try:
        cores = max(1, int(head["MaxProcs"]) // int(head["MaxNodes"]))
    except (KeyError, ValueError, ZeroDivisionError):
        cores = 1
    picked = jobs[skip : None if count is None else skip + count]
    return [TraceJob(j.id, j.submit, j.runtime, j.walltime, math.ceil(j.nodes / cores), j.user) for j in picked], cores
