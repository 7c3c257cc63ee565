"""The batch queue's commands: ``coorm batch`` (sbatch), ``submit --no-wait``, ``cancel``, ``hold``,
``release``, ``queue`` (squeue), ``history`` (sacct), ``show job``. Each is one request to the batch service."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer

from coorm.cli.live import _call, _connect, _failure, _fmt_time, _human, _line, _settings, run
from coorm.cli.table import SHORT_STATE, print_history, print_queue
from coorm.shared.jobids import is_job_id

# what squeue users read in the ST column


def _send(subject_of, body: dict) -> dict:
    """One request to the batch service on the user's subject (the fast path's transport: one for every batch
    command), sent again if unanswered (it carries its own id: a copy is answered as the first was); its
    failures as every client command says them (exit 3 or 2)."""
    from coorm.cli import fast

    try:
        return fast.request(subject_of, body, "the batch service", resend=True)
    except fast.Failed as e:
        _line(str(e))
        raise typer.Exit(e.code) from None


# ================================================================================================
# batch / submit --no-wait
# ================================================================================================
def batch(script: Path | None, args: list[str], cli, wrap: str | None, open_mode: str) -> None:
    """``coorm batch``: read the script's directives, let the command line's options override them, queue."""
    from coorm.batch import jobscript

    if (script is None) == (wrap is None):
        _line("give a script (coorm batch job.sh) or --wrap 'COMMAND'")
        raise typer.Exit(2)
    if wrap is not None:
        text = f"#!/bin/sh\n{wrap}\n"
        name = "wrap"
    else:
        assert script is not None
        try:
            text = script.read_text()
        except (OSError, UnicodeDecodeError) as e:
            _line(f"cannot read {script}: {e}")
            raise typer.Exit(2) from None
        name = script.name
    try:
        directives, warnings = jobscript.parse_script(text)
    except jobscript.ScriptError as e:
        _line(f"{script or 'the wrapped command'}: {e}")
        raise typer.Exit(2) from None
    for w in warnings:
        _line(w)
    opts = directives.merged(cli)
    queue(opts, argv=list(args), script=text if wrap is None else None, wrap=wrap, default_name=name,
          open_mode=open_mode)


def queue(opts, *, argv: list[str], script: str | None, default_name: str, open_mode: str = "append",
          wrap: str | None = None) -> None:
    """Send one submission (the same code as the fast path: :func:`coorm.cli.fast.submit_job`)."""
    from coorm.cli import fast

    try:
        fast.submit_job(opts, argv=argv, script=script, default_name=default_name, open_mode=open_mode, wrap=wrap)
    except fast.Failed as e:
        _line(str(e))
        raise typer.Exit(e.code) from None


def _one_line(e: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
    return str(e)


# ================================================================================================
# cancel, hold, release
# ================================================================================================
def control(verb: str, jobs: list[str], name: str | None, states: list[str] | None, user: str | None) -> None:
    from coorm.shared import subjects
    from coorm.shared.connection import Client, CredentialsError
    from coorm.shared.protocol import BatchControl, BatchControlReply

    try:
        me = Client().user
    except CredentialsError as e:
        _line(str(e))
        raise typer.Exit(2) from None
    if user is not None and user != me:
        _line(f"only {me}'s own jobs can be changed from this account (not {user}'s)")
        raise typer.Exit(2)
    if not jobs and name is None and not states and user is None:
        _line(f"coorm {verb} JOBID... (or --name, --state, --user {me} for all of yours)")
        raise typer.Exit(2)
    subject = {"cancel": subjects.batch_cancel, "hold": subjects.batch_hold, "release": subjects.batch_release}[verb]
    bad = [j for j in jobs if not is_job_id(j)]
    if bad:
        _line(f"cannot {verb}: not a job id: {', '.join(map(repr, bad[:5]))} (42, an array's task 42_7, a whole "
              "array 42)")
        raise typer.Exit(2)
    try:
        msg = BatchControl(jobs=jobs, name=name, states=_states(states) if states else None,
                           command=os.urandom(16).hex())
    except ValueError as e:
        _line(f"cannot {verb}: {_one_line(e)}")
        raise typer.Exit(2) from None
    if not jobs and name is None and msg.states is None:
        msg = BatchControl(states=list(SHORT_STATE))  # --user ME: every job of mine
    reply = BatchControlReply.model_validate(_send(subject, msg.model_dump(mode="json")))
    from coorm.cli.fast import report_control

    if report_control(verb, reply.model_dump(), jobs):
        raise typer.Exit(1)


_STATE_NAMES = {"pending": ["held", "blocked", "eligible", "queued"], "pd": ["held", "blocked", "eligible", "queued"],
                "r": ["running"], "cd": ["completed"], "f": ["failed"], "to": ["timeout"], "ca": ["cancelled"],
                "nf": ["node_fail"]}




def _states(states: list[str]) -> list:
    out: list[str] = []
    for s in states:
        for part in s.lower().split(","):
            if part in SHORT_STATE:
                out.append(part)
            elif part in _STATE_NAMES:
                out += _STATE_NAMES[part]
            else:
                raise ValueError(f"unknown state {part!r}: one of {', '.join(SHORT_STATE)} (or PD, R, CD, F, TO, CA)")
    return out


# ================================================================================================
# queue, history, show
# ================================================================================================
def _query(**kw):
    """Every job the query names, a page at a time over one connection."""
    from coorm.shared import bus, subjects
    from coorm.shared.protocol import BatchQuery, BatchQueryReply

    try:
        BatchQuery(**kw)
    except ValueError as e:
        _line(_one_line(e))
        raise typer.Exit(2) from None

    async def pages():
        nc = await _connect(settings)
        try:
            first = await _call(nc, settings, subjects.BATCH_QUERY, BatchQuery(**kw), BatchQueryReply, timeout=10)
            while len(first.jobs) < first.total:
                page = await _call(nc, settings, subjects.BATCH_QUERY, BatchQuery(**kw, offset=len(first.jobs)),
                                   BatchQueryReply, timeout=10)
                if not page.jobs:
                    break  # (fewer than when the first page was read)
                first.jobs += page.jobs
            return first
        finally:
            await bus.shutdown(nc)

    settings = _settings()
    try:
        return run(pages())
    except Exception as e:  # noqa: BLE001 - _failure re-raises what is not about reaching CooRM
        raise _failure(e, settings) from None


def show_queue(user: str | None, states: list[str] | None, as_json: bool) -> None:
    reply = _query(user=user, states=_states(states) if states else None)
    if as_json:
        print(json.dumps([j.model_dump() for j in reply.jobs], indent=2))
        return
    print_queue([j.model_dump() for j in reply.jobs], reply.now)


def show_history(user: str | None, since: str | None, states: list[str] | None, as_json: bool) -> None:
    from coorm.shared.when import parse_since

    try:
        t0 = parse_since(since, time.time()) if since else time.time() - 86400
    except ValueError as e:
        _line(str(e))
        raise typer.Exit(2) from None
    reply = _query(user=user, ended=True, since=t0, states=_states(states) if states else None)
    if as_json:
        print(json.dumps([j.model_dump() for j in reply.jobs], indent=2))
        return
    print_history([j.model_dump() for j in reply.jobs])


def show_job(job: str, as_json: bool) -> None:
    reply = _query(jobs=[job])
    jobs = reply.jobs or _query(jobs=[job], ended=True, since=0.0).jobs
    if not jobs:
        _line(f"no job {job}")
        raise typer.Exit(1)
    for j in jobs:
        if as_json:
            print(json.dumps(j.model_dump(), indent=2))
            continue
        print(f"JobId={j.id} JobName={j.name} UserId={j.user}")
        print(f"   JobState={j.state.upper()} Reason={j.reason or 'None'} ExitCode={j.exit_code}")
        print(f"   Cluster={j.cluster} NumNodes={j.nodes} TimeLimit={_human(j.walltime)} Dependency={j.dependency}")
        print(f"   SubmitTime={_fmt_time(j.submitted)} StartTime={_fmt_time(j.started or j.start_estimate)} "
              f"EndTime={_fmt_time(j.ended)}")
        print(f"   NodeList={','.join(j.node_ids) or '(null)'} Session={j.app or '(none)'}")
        print(f"   Command={j.command}")
        print(f"   WorkDir={j.cwd}")
        print(f"   StdOut={j.output}" + (f" StdErr={j.error}" if j.error else ""))
    sys.stdout.flush()
