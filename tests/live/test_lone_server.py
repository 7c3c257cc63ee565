"""Clients whose URL list's first server answers but reaches none of CooRM -- a NATS server cut from its
cluster, alive, its services gone to the others (the partition tests make one; a lone server, outside the
cluster and letting in the same users, is the same to a client). "No responders" there means nothing was taken:
the light path's commands (``coorm.cli.fast``: ``coorm batch``, ``queue``...) ask through the next server of
their list rather than failing with exit 3, and a session opening there looks for the RMS through the other
servers and moves before it opens."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import nats
import pytest

from coorm.launchers.sdk import Session
from coorm.services.stack import LocalStack
from coorm.shared import bus
from coorm.shared.credentials import CredentialStore
from coorm.shared.endpoints import Role
from coorm.shared.servers import _wait_port, free_port, nats_binary, nats_config
from tests.live.test_batch import ended
from tests.live.test_system import _settings, rq

FAST = [sys.executable, "-m", "coorm.cli.fast"]
FULL = [sys.executable, "-m", "coorm.cli.main"]


@pytest.fixture
def lone_server(servers, tmp_path):
    """A nats-server of its own, letting in the same users as the cluster's, in no cluster: its URL."""
    work = tmp_path / "lone"
    work.mkdir()
    port = free_port()
    proc = subprocess.Popen([nats_binary(), "-c", str(nats_config(work, CredentialStore(servers.credentials))),
                             "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, "nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _fast(args: list[str], nats_url: str, servers, tmp_path, entry=FAST) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COORM_")},
           "COORM_CONNECTION_FILE": str(tmp_path / "none.json"), "COORM_NATS_URL": nats_url,
           "COORM_CREDENTIALS_DIR": str(servers.credentials)}
    return subprocess.run([*entry, *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


async def test_a_command_told_no_responders_asks_through_the_next_server(servers, redis_url, lone_server, tmp_path):
    settings = _settings(servers)
    async with LocalStack(settings, {"c0": 2}, with_batch=True):
        nc = await bus.connect(servers.nats_url, "test-user", settings.identity(Role.LAUNCHER))
        urls = f"{lone_server},{servers.nats_url}"
        run = await asyncio.to_thread(_fast, ["batch", "-N", "1", "-t", "1m", "--wrap", "exit 0"], urls, servers,
                                      tmp_path)
        assert run.returncode == 0, run.stderr
        job = run.stdout.split()[-1]
        assert run.stdout.startswith("Submitted batch job "), run.stdout
        (rec,) = await ended(nc, job)
        assert (rec.state, rec.exit_code) == ("completed", 0), rec
        run = await asyncio.to_thread(_fast, ["history", "--json"], urls, servers, tmp_path)
        assert run.returncode == 0, run.stderr
        assert [j["id"] for j in json.loads(run.stdout)] == [job]
        # the lone server alone: no one answers there, for the whole retry -- exit 3, "is it running?"
        run = await asyncio.to_thread(_fast, ["queue"], lone_server, servers, tmp_path)
        assert run.returncode == 3 and "answers but the batch service does not" in run.stderr, run.stderr
        await bus.shutdown(nc)


async def test_a_session_opening_where_nobody_serves_it_moves_to_a_server_that_does(servers, redis_url,
                                                                                   lone_server):
    """The batch service's way (a connection it shares with its jobs' sessions, which may move it): connected
    to the lone server first, a session's opening is answered "no responders"; the engine answers a status
    query through the second server of the list, so the connection moves there and the session opens, gets
    nodes and hears its process's exit code."""
    settings = _settings(servers, nats_url=f"{lone_server},{servers.nats_url}")
    async with LocalStack(_settings(servers), {"c0": 2}):
        me = settings.identity(Role.LAUNCHER)
        nc = await nats.connect([lone_server, servers.nats_url], dont_randomize=True, nkeys_seed_str=me.seed,
                                inbox_prefix=me.inbox_prefix)
        try:
            assert nc.connected_url.port == int(lone_server.rsplit(":", 1)[1])
            async with await Session.open(settings, kind="rigid", nc=nc, moves_connection=True) as app:
                assert nc.connected_url.port == int(servers.nats_url.rsplit(":", 1)[1])
                (rid,) = await app.request(rq("opened", "c0", 1, 60))
                start = await app.wait_start(rid, 20)
                (pid,) = await app.launch(rid, start.nodes[0], ["sh", "-c", "exit 5"])
                (ev,) = await app.wait_exits(rid, 1, 20)
                assert (ev.pid, ev.code, ev.killed) == (pid, 5, False)
        finally:
            await nc.close()


async def test_the_full_command_lines_queries_ask_through_the_server_that_reaches_the_rms(servers, redis_url,
                                                                                        lone_server, tmp_path):
    """``coorm status`` and ``coorm apps`` (the full command line: nats-py, which picks a server of the list at
    random) answered "no responders" by the lone server move to the second and are answered there; run 6
    times each, so that the lone server is met (each run has even odds). The lone server alone: exit 3 after
    the retry, with its message."""
    settings = _settings(servers)
    async with LocalStack(settings, {"c0": 2}):
        urls = f"{lone_server},{servers.nats_url}"
        for _ in range(6):
            run = await asyncio.to_thread(_fast, ["status", "--json"], urls, servers, tmp_path, FULL)
            assert run.returncode == 0, run.stderr
            assert {c["cluster"]: c["up"] for c in json.loads(run.stdout)["clusters"]} == {"c0": 2}, run.stdout
            run = await asyncio.to_thread(_fast, ["apps"], urls, servers, tmp_path, FULL)
            assert run.returncode == 0, run.stderr
        run = await asyncio.to_thread(_fast, ["status"], lone_server, servers, tmp_path, FULL)
        assert run.returncode == 3 and "answers but no CooRM service does" in run.stderr, run.stderr
