"""``coorm usage``: usage per user and per application, from the roll-ups (or, with ``since``, computed from
the per-request records that ended since then, with the same arithmetic)."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from coorm.services.accounting.core import TYPES, Totals, Usage, rollup
from coorm.services.accounting.store import read_records, read_totals
from coorm.shared.valkey import sync_client


def _hours(seconds: float) -> float:
    return seconds / 3600.0


def _row(scope: str, user: str, app: str | None, app_kind: str | None, u: Usage) -> dict:
    return {
        "scope": scope,
        "user": user,
        "app": app,
        "app_kind": app_kind,
        "node_hours": {t: _hours(u.node_seconds.get(t, 0.0)) for t in TYPES},
        "requests": u.requests,
        "started": u.started,
        "mean_wait_s": u.mean_wait,
        "preemptions": u.preemptions,
        "walltime_kills": u.walltime_kills,
        "violations": u.violations,
        "node_failures": u.node_failures,
        "waste_node_hours": _hours(u.waste_node_seconds),
    }


def rows_of(totals: Totals, user: str | None = None) -> list[dict]:
    """One row per user, each followed by one row per application of that user (``scope`` says which)."""
    rows: list[dict] = []
    for u in sorted(totals.users):
        if user is not None and u != user:
            continue
        rows.append(_row("user", u, None, None, totals.users[u]))
        for a in sorted(a for a, owner in totals.app_owner.items() if owner == u and a in totals.apps):
            rows.append(_row("app", u, a, totals.app_kind.get(a, ""), totals.apps[a]))
    return rows


def usage_report(redis_url: str, user: str | None = None, since: float | None = None, *,
                 connect_timeout: float | None = None) -> list[dict]:
    """Usage rows (see :func:`rows_of`): all time from the roll-ups, or since ``since`` (epoch seconds,
    by request end time; preemptions by when they were announced) from the per-request records."""
    r = sync_client(redis_url, decode_responses=True, socket_connect_timeout=connect_timeout)
    try:
        if since is None:
            totals = read_totals(r)
        else:
            totals = rollup(*read_records(r, since))
    finally:
        r.close()
    return rows_of(totals, user)


def _fmt(x: float) -> str:
    return f"{x:,.2f}"


def _wait(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def print_usage(rows: list[dict], json_output: bool = False, console: Console | None = None) -> None:
    """Print the rows as JSON (a list of objects, on stdout) or as a table."""
    if json_output:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    console = console or Console()
    if not rows:
        console.print("no usage recorded")
        return
    table = Table(title="usage (node-hours)", title_justify="left")
    table.add_column("user")
    table.add_column("application")
    for t in TYPES:
        table.add_column(t, justify="right")
    for name in ("requests", "mean wait", "preempted", "walltime", "violations", "node failures", "waste"):
        table.add_column(name, justify="right")
    for row in rows:
        is_user = row["scope"] == "user"
        app = "" if is_user else f"{row['app']}" + (f" ({row['app_kind']})" if row["app_kind"] else "")
        table.add_row(
            row["user"] if is_user else "", app, *(_fmt(row["node_hours"][t]) for t in TYPES),
            str(row["requests"]), _wait(row["mean_wait_s"]), str(row["preemptions"]), str(row["walltime_kills"]),
            str(row["violations"]), str(row["node_failures"]), _fmt(row["waste_node_hours"]),
            style="bold" if is_user else None,
        )
    console.print(table)
