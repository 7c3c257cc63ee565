"""``coorm trace``: the job traces of the Parallel Workloads Archive that the simulator and the paper
experiments replay (see :mod:`coorm.simulator.traces`). Exit codes: 0 done, 1 the trace could not be
had (unknown name, download failed, checksum mismatch)."""

from __future__ import annotations

import sys

import typer

app = typer.Typer(help="Job traces (Parallel Workloads Archive): list them, fetch one into the cache.",
                  no_args_is_help=True)


@app.command("list")
def list_traces() -> None:
    """The traces CooRM knows, their size, and where each is found."""
    from rich.console import Console
    from rich.table import Table

    from coorm.simulator.traces import CATALOGUE, SAMPLE, TraceError, locate

    t = Table(title="traces")
    for col in ("name", "MB", "where"):
        t.add_column(col)
    t.add_row("sample", f"{SAMPLE.stat().st_size / 1e6:.2f}", str(SAMPLE))
    for name, trace in sorted(CATALOGUE.items()):
        try:
            where = str(locate(name))
        except TraceError:
            where = f"(not here: coorm trace fetch {name})"
        t.add_row(name, f"{trace.size / 1e6:.1f}", where)
    Console().print(t)


@app.command()
def fetch(
    name: str = typer.Argument(..., help="the archive's name of the log, e.g. LLNL-Atlas-2006-2.1-cln"),
    mirror: str | None = typer.Option(None, help="base URL holding the same file names "
                                      "(default: COORM_TRACE_MIRROR, else the archive)"),
) -> None:
    """Download a trace into the cache (once: a verified copy is kept), checking its checksum."""
    from coorm.simulator.traces import TraceError
    from coorm.simulator.traces import fetch as fetch_trace

    try:
        path = fetch_trace(name, mirror=mirror)
    except TraceError as e:
        sys.stderr.write(f"coorm: {e}\n")
        raise typer.Exit(1) from None
    print(path)
