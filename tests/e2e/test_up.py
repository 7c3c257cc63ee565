"""``coorm up`` in one terminal, ``coorm submit`` and friends in another: subprocesses, as a user runs them."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.processes import interrupt, wait_for

COORM = [sys.executable, "-m", "coorm.cli.main"]
# the ``coorm`` script's own path: ``coorm submit`` as an attached batch job, on a plain socket
FAST = [sys.executable, "-m", "coorm.cli.fast"]


@pytest.fixture(params=["full", "fast"])
def entry(request):
    """Each ``coorm submit`` test runs through both ways in: the full command line (an SDK session of its
    own) and the ``coorm`` script's fast path (a batch job attached to the command)."""
    return COORM if request.param == "full" else FAST


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    conn = tmp / "connection.json"
    env = dict(os.environ, COORM_CONNECTION_FILE=str(conn), COORM_RESCHEDULE_INTERVAL="0.05",
               COORM_FAIR_START="0", COORM_KILL_GRACE="0.5")
    env.pop("COORM_NATS_URL", None)
    env.pop("COORM_REDIS_URL", None)
    log = tmp / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*COORM, "up", "--clusters", "c0=4,c1=2", "--workdir", str(tmp / "work")],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: conn.exists() or proc.poll() is not None, 90, "coorm up to write its connection file")
        if proc.poll() is not None:
            pytest.fail(f"coorm up exited: {log.read_text()}")
        user_env = dict(os.environ, COORM_CONNECTION_FILE=str(conn))  # as another terminal of the same user
        user_env.pop("COORM_NATS_URL", None)
        user_env.pop("COORM_REDIS_URL", None)
        yield proc, user_env, tmp, conn
    finally:
        interrupt(proc)


def _run(env, *args, cwd=None, timeout=60, entry=COORM) -> subprocess.CompletedProcess:
    return subprocess.run([*entry, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_submit_streams_output_and_exits_with_the_jobs_code(up, entry):
    proc, env, tmp, conn = up
    r = _run(env, "submit", "-c", "c0", "-N", "2", "-t", "1m", "-l", "--", "sh", "-c",
             'echo "hello from $COORM_NODE"; exit 3', entry=entry)
    assert r.returncode == 3, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert len(lines) == 2 and all(line.endswith(f"hello from {line.split(':')[0]}") for line in lines)
    ok = _run(env, "submit", "-c", "c1", "-N", "1", "-t", "30s", "--", "true", entry=entry)
    assert ok.returncode == 0, ok.stderr


def test_a_job_past_its_walltime_is_killed(up, entry):
    proc, env, tmp, conn = up
    r = _run(env, "submit", "-c", "c1", "-N", "1", "-t", "1s", "--", "sleep", "60", entry=entry)
    assert r.returncode == 124 and "walltime" in r.stderr


def test_a_command_that_does_not_exist_fails_at_once_with_127(up, entry):
    """Like a shell (``sh -c nonexistent_cmd`` exits 127), at once: the job frees its nodes rather than
    holding them until its walltime (10 minutes here; the command's own timeout is 60 s)."""
    proc, env, tmp, conn = up
    r = _run(env, "submit", "-c", "c0", "-N", "2", "-t", "10m", "--", "nonexistent_cmd", entry=entry)
    assert r.returncode == 127 and "nonexistent_cmd: command not found" in r.stderr, r.stderr
    ok = _run(env, "submit", "-c", "c0", "-N", "4", "-t", "30s", "--", "true", entry=entry)  # every node is free again
    assert ok.returncode == 0, ok.stderr


def _history(env, job: str) -> list[dict]:
    return [x for x in json.loads(_run(env, "history", "--json").stdout) if x["id"] == job]


def _running_job(env, command: str) -> str:
    """The id of the running job whose command is ``command`` (as ``coorm queue`` shows it)."""
    def running():
        rows = [x for x in json.loads(_run(env, "queue", "--json").stdout)
                if x["state"] == "running" and x.get("command", "").endswith(command)]
        return rows[0]["id"] if rows else None
    return wait_for(running, 30, f"{command!r} to run")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_on_an_attached_submit_cancels_its_job(up, sig, code):
    """As srun: Ctrl-C (or a TERM) on ``coorm submit`` cancels the job, which ends (its processes killed)
    before the command exits, with the shell's code for the signal."""
    proc, env, tmp, conn = up
    job = subprocess.Popen([*FAST, "submit", "-c", "c1", "-N", "1", "-t", "5m", "--", "sleep", "301"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        jid = _running_job(env, "sleep 301")
        job.send_signal(sig)
        _, err = job.communicate(timeout=30)
        assert job.returncode == code, err
        ended = wait_for(lambda: _history(env, jid), 30, "the job in the history")
        assert ended[0]["state"] == "cancelled", ended
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_an_attached_submit_killed_outright_has_its_job_cancelled(up):
    """SIGKILL leaves no time to cancel anything: the batch service sees that nobody listens to the job's
    events any more and cancels it (within its grace), so a killed srun-like command leaks no job."""
    from coorm.services.batch.service import ATTACH_GRACE, ATTACH_PROBE_EVERY

    proc, env, tmp, conn = up
    job = subprocess.Popen([*FAST, "submit", "-c", "c1", "-N", "1", "-t", "5m", "--", "sleep", "302"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        jid = _running_job(env, "sleep 302")
        job.kill()
        job.wait()
        ended = wait_for(lambda: _history(env, jid), ATTACH_GRACE + 3 * ATTACH_PROBE_EVERY + 15,
                         "the job to be cancelled")
        assert (ended[0]["state"], ended[0]["reason"]) == ("cancelled", "its command (coorm submit) went away")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_the_fast_queue_prints_what_the_full_command_line_prints(up):
    """``coorm queue`` on the coorm script's light path (the jobs' JSON, no models) and through the full
    command line: the same table, byte for byte (held jobs: nothing in it changes between the two)."""
    proc, env, tmp, conn = up
    r = _run(env, "batch", "-H", "-J", "same-table", "--array=0-2", "--wrap", "true", entry=FAST)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    try:
        fast, full = _run(env, "queue", entry=FAST), _run(env, "queue")
        assert (fast.returncode, full.returncode) == (0, 0), (fast.stderr, full.stderr)
        assert fast.stdout == full.stdout and f"{job}_2 same-table" in fast.stdout, (fast.stdout, full.stdout)
        mine = _run(env, "queue", "-u", "nobody-at-all", entry=FAST)
        assert mine.stdout.split() == full.stdout.splitlines()[0].split()  # the header only
    finally:
        _run(env, "cancel", job)


def test_cancel_hold_and_release_on_the_light_path_say_what_the_full_one_says(up):
    """scancel and scontrol hold/release are run by the thousand too: the coorm script's light path sends
    them (job ids, --name), with the full command line's words and exit codes; what it does not read
    (--state) goes to the full one."""
    proc, env, tmp, conn = up
    first = _run(env, "batch", "-H", "-J", "light-a", "--wrap", "true", entry=FAST).stdout.split()[-1]
    then = _run(env, "batch", "-J", "light-b", "-d", f"afterok:{first}", "--wrap", "true",
                entry=FAST).stdout.split()[-1]
    try:
        light, full = _run(env, "hold", first, entry=FAST), _run(env, "hold", first)  # already held
        assert (light.returncode, light.stdout, light.stderr) == (full.returncode, full.stdout, full.stderr)
        assert (light.returncode, light.stderr) == (1, f"coorm: not held (not in a state for it): {first}\n")
        r = _run(env, "hold", "-n", "light-b", entry=FAST)
        assert (r.returncode, r.stdout) == (0, f"held 1 job: {then}\n"), r.stderr
        r = _run(env, "release", then, entry=FAST)
        assert (r.returncode, r.stdout) == (0, f"released 1 job: {then}\n"), r.stderr
        light, full = _run(env, "cancel", "999999999", entry=FAST), _run(env, "cancel", "999999999")
        assert (light.returncode, light.stdout, light.stderr) == (full.returncode, full.stdout, full.stderr)
        assert (light.returncode, light.stderr) == (2, "coorm: refused: no job 999999999\n")
        r = _run(env, "cancel", then, "--name=light-b", entry=FAST)
        assert (r.returncode, r.stdout) == (0, f"cancelled 1 job: {then}\n"), r.stderr
        r = _run(env, "cancel", "--state", "held", entry=FAST)  # (the full command line's option)
        assert (r.returncode, r.stdout) == (0, f"cancelled 1 job: {first}\n"), r.stderr
        r = _run(env, "cancel", "12x", entry=FAST)  # not an id: the full command line says so
        assert r.returncode == 2 and "12x" in r.stderr, r.stderr
    finally:
        _run(env, "cancel", first, then)


def test_queue_and_history_on_the_light_path_print_what_the_full_one_prints(up):
    """squeue and sacct are polled by scripts: ``coorm queue --json`` and ``coorm history`` (table or
    ``--json``, ``--since``, ``--user``) go the light path, printing what the full command line prints."""
    proc, env, tmp, conn = up
    done = [_run(env, "batch", "-J", f"hist-{k}", "-o", "/dev/null", "--wrap", f"exit {k}",
                 entry=FAST).stdout.split()[-1] for k in (0, 3)]
    held = _run(env, "batch", "-H", "-J", "hist-held", "--wrap", "true", entry=FAST).stdout.split()[-1]
    try:
        wait_for(lambda: all(j in _run(env, "history", "--json", entry=FAST).stdout for j in done), 30,
                 "the jobs to end")
        since = str(int(time.time()) - 600)
        user = getpass.getuser()
        for args in (["queue", "--json"], ["queue", "-u", user, "--json"], ["history"], ["history", "--json"],
                     ["history", "--since", since, "--json"], ["history", f"--user={user}", "-S", "1d"]):
            light, full = _run(env, *args, entry=FAST), _run(env, *args)
            assert (light.returncode, light.stdout, light.stderr) == (full.returncode, full.stdout, full.stderr), args
        for args in (["queue", "--json"], ["history", "--since", since, "--json"], ["history"]):  # (the light path:
            # neither pydantic nor typer is imported)
            r = _run(env, *args, entry=[sys.executable, "-X", "importtime", "-m", "coorm.cli.fast"])
            assert r.returncode == 0 and "pydantic" not in r.stderr and "typer" not in r.stderr, args
        rows = json.loads(_run(env, "history", "--json", entry=FAST).stdout)
        assert {(r["id"], r["exit_code"]) for r in rows if r["id"] in done} == {(done[0], 0), (done[1], 3)}
        assert [r["id"] for r in json.loads(_run(env, "queue", "--json", entry=FAST).stdout)] == [held]
        r = _run(env, "history", "--since", "yesterday-ish", entry=FAST)  # not a time: the full command line says so
        assert r.returncode == 2 and "cannot read 'yesterday-ish' as a time" in r.stderr, r.stderr
    finally:
        _run(env, "cancel", held)


def test_bad_submissions_are_refused_clearly(up, entry):
    proc, env, tmp, conn = up
    r = _run(env, "submit", "-c", "nowhere", "-N", "1", "-t", "1m", "--", "true", entry=entry)
    assert r.returncode == 2 and "unknown cluster nowhere" in r.stderr
    r = _run(env, "submit", "-c", "c0", "-N", "1", "-t", "ten minutes", "--", "true", entry=entry)
    assert r.returncode == 2 and "cannot read the walltime" in r.stderr


def test_status_nodes_estimate_and_no_wait(up):
    proc, env, tmp, conn = up
    st = json.loads(_run(env, "status", "--json").stdout)
    assert {c["cluster"]: c["up"] for c in st["clusters"]} == {"c0": 4, "c1": 2}
    nodes = json.loads(_run(env, "nodes", "--json").stdout)
    assert sorted(nodes) == [f"c0n{i}" for i in range(4)] + ["c1n0", "c1n1"]
    gate = tmp / "gate-estimate"  # (the job runs until the checks below are made, however slow the machine)
    r = _run(env, "submit", "--no-wait", "-c", "c0", "-N", "4", "-t", "2m", "--", "sh", "-c",
             f"echo done on $COORM_NODE; while [ ! -e {gate} ]; do sleep 0.05; done", cwd=tmp)
    assert r.returncode == 0 and r.stdout.startswith("Submitted batch job "), r.stderr
    job = r.stdout.split()[-1]
    running = wait_for(lambda: [x for x in json.loads(_run(env, "queue", "--json").stdout)
                                 if x["id"] == job and x["state"] == "running"], 30, "the job to start")
    assert running[0]["nodes"] == 4 and len(running[0]["node_ids"]) == 4
    req = [x for x in json.loads(_run(env, "requests", "--json").stdout) if x["app"] == running[0]["app"]]
    assert req[0]["state"] == "started"  # the batch service's session for it, as its user's
    est = json.loads(_run(env, "estimate", "-c", "c0", "-N", "4", "-t", "1h", "--json").stdout)
    assert est["start"] is not None and est["wait"] > 0  # behind the job that holds all of c0
    gate.touch()
    out = tmp / f"coorm-{job}.out"
    text = wait_for(lambda: out.exists() and out.read_text().count("done on") == 4 and out.read_text(), 60,
                     "the job's output file")
    assert sorted(text.split()) == sorted(("done on c0n0 done on c0n1 done on c0n2 done on c0n3").split())
    ended = wait_for(lambda: [x for x in json.loads(_run(env, "history", "--json").stdout) if x["id"] == job], 30,
                     "the job in the history")
    assert (ended[0]["state"], ended[0]["exit_code"]) == ("completed", 0)
    usage = wait_for(lambda: json.loads(_run(env, "usage", "--json").stdout), 30, "accounting")
    assert any(row["node_hours"]["non-preemptible"] > 0 for row in usage)


def test_nothing_answers_without_credentials_and_an_added_user_gets_in(up):
    """The embedded default on a multi-user login node: a local user without an identity reaches the ports
    but neither server lets them in; one the operator adds (``coorm user add``) submits as themselves."""
    import stat
    from urllib.parse import urlparse

    import redis

    proc, env, tmp, conn = up
    data = json.loads(conn.read_text())
    assert stat.S_IMODE(conn.stat().st_mode) == 0o600 and "credentials_dir" in data
    # the servers' files (valkey's holds every session's token) and the credential store: the operator's only
    for private in (tmp / "work" / "servers", Path(data["credentials_dir"])):
        assert stat.S_IMODE(private.stat().st_mode) == 0o700, private
    stranger = dict(env, COORM_CONNECTION_FILE=str(tmp / "nothing.json"), COORM_NATS_URL=data["nats_url"])
    r = _run(stranger, "status")
    assert r.returncode == 2 and "wants credentials" in r.stderr, (r.returncode, r.stderr)
    valkey = urlparse(data["redis_url"])
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        redis.Redis(host=valkey.hostname, port=valkey.port, socket_timeout=5).get("coorm:policy:leader")
    # the operator lets nobody in; nobody's programs run as nobody
    identity = tmp / "nobody.json"
    added = _run(env, "user", "add", "nobody", "--out", str(identity), "--no-install")
    assert added.returncode == 0, added.stderr
    as_nobody = dict(stranger, COORM_NATS_CREDENTIALS=str(identity))

    def submitted():
        job = _run(as_nobody, "submit", "-c", "c1", "-N", "1", "-t", "30s", "--", "id", "-un", cwd="/")
        return job if job.returncode != 2 else None  # 2: refused, until nats-server read its users again

    job = wait_for(submitted, 30, "nats-server to admit the new user")
    if os.geteuid() == 0:  # the agents run as root here: they drop to the user
        assert (job.returncode, job.stdout.strip()) == (0, "nobody"), job.stderr
    else:  # an agent that is not root runs its own user only
        assert job.returncode != 0 and "not root" in job.stderr, job.stderr


def test_a_job_runs_where_it_was_submitted_with_the_submitter_s_environment(up, entry):
    proc, env, tmp, conn = up
    r = _run(dict(env, MY_SETTING="forty-two"), "submit", "-c", "c1", "-N", "1", "-t", "30s", "--", "sh", "-c",
             'pwd; echo "$MY_SETTING"', cwd=tmp, entry=entry)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp), "forty-two"]


def test_a_job_script_with_sbatch_directives_an_array_and_a_dependency(up):
    """coorm batch as a Slurm user writes it: directives at the top, arguments after the script, an array
    whose tasks read their index, a job that waits for the array; then queue, cancel and history."""
    proc, env, tmp, conn = up
    work = tmp / "scripted"
    work.mkdir()
    script = work / "sweep.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 1 -t 2 -J sweep\n#SBATCH --array=0-3%2 -o sweep-%A_%a.out\n"
                      "#SBATCH --mem=4G\n"  # not CooRM's: ignored with a warning
                      'echo "task $SLURM_ARRAY_TASK_ID of $COORM_ARRAY_JOB_ID: $1"\n')
    # through the script's fast path (coorm.cli.fast: what the `coorm` script runs), and through the full one
    r = subprocess.run([sys.executable, "-m", "coorm.cli.fast", "batch", "sweep.sh", "hello"], env=env,
                       capture_output=True, text=True, timeout=60, cwd=work)
    assert r.returncode == 0 and r.stdout.startswith("Submitted batch job "), r.stderr
    assert "--mem" in r.stderr  # the warning
    array = r.stdout.split()[-1]
    r = subprocess.run([sys.executable, "-m", "coorm.cli.fast", "batch", "-d", f"afterok:{array}", "--wrap",
                        "cat sweep-*.out | wc -l", "-o", "count.out"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=work)
    assert r.returncode == 0, r.stderr
    after = r.stdout.split()[-1]
    held = _run(env, "batch", "-H", "--wrap", "true", cwd=work).stdout.split()[-1]
    queue = _run(env, "queue").stdout
    assert f"{held} " in queue.replace("  ", " ") or held in queue
    assert all(len(line) <= 80 for line in queue.splitlines()), queue
    r = _run(env, "cancel", held)
    assert r.returncode == 0 and held in r.stdout
    done = wait_for(lambda: [x for x in json.loads(_run(env, "history", "--json").stdout) if x["id"] == after], 60,
                    "the dependent job to end")
    assert (done[0]["state"], done[0]["exit_code"]) == ("completed", 0)
    assert (work / "count.out").read_text().strip() == "4"
    for t in range(4):
        assert (work / f"sweep-{array}_{t}.out").read_text() == f"task {t} of {array}: hello\n"
    hist = _run(env, "history").stdout
    assert f"{array}_3" in hist and "COMPLETED" in hist and "CANCELLED" in hist
    # a job larger than its cluster is refused at once, with exit 2
    r = _run(env, "batch", "-N", "9", "-c", "c0", "--wrap", "true", cwd=work)
    assert r.returncode == 2 and "c0 has 4" in r.stderr, r.stderr


def test_ctrl_c_stops_everything_and_removes_the_connection_file(up):
    proc, env, tmp, conn = up
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(60)
    assert proc.returncode == 0
    assert not conn.exists()
    left = subprocess.run(["pgrep", "-f", str(tmp / "work")], capture_output=True, text=True).stdout.split()
    assert left == []
