"""Every client command fails fast when CooRM cannot be reached: within the connect timeout, with one line
that names the URL, where it came from and ``coorm up``, and exit code 3 -- never a hang, a traceback or 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from coorm.shared.servers import free_port

COORM = [sys.executable, "-m", "coorm.cli.main"]
NATS_COMMANDS = {
    "status": ["status"],
    "apps": ["apps"],
    "requests": ["requests"],
    "estimate": ["estimate", "-c", "c0", "-N", "1", "-t", "1m"],
    "submit": ["submit", "-c", "c0", "-N", "1", "-t", "1m", "--", "true"],
    "submit --no-wait": ["submit", "--no-wait", "-c", "c0", "-N", "1", "-t", "1m", "--", "true"],
    "launch": ["launch", "--set", "task_duration=5", "psa", "--", "true"],
}
REDIS_COMMANDS = {"nodes": ["nodes"], "usage": ["usage"]}
# given up within the connect timeout (3 s by default) and a Python start: bounded generously, for a machine
# loaded by other tests (the full command line's imports took 5-8 s there: 5 s and then 10 s were exceeded);
# what this guards against is a hang of minutes
GIVE_UP = 30.0
# what the coorm script's light path runs itself (a plain socket, no nats-py): the same failure, the same line
FAST = [sys.executable, "-m", "coorm.cli.fast"]
FAST_COMMANDS = {"submit": NATS_COMMANDS["submit"], "submit --no-wait": NATS_COMMANDS["submit --no-wait"],
                 "batch": ["batch", "-N", "1", "--wrap", "true"], "queue": ["queue"], "cancel": ["cancel", "12"],
                 "release": ["release", "-n", "x"]}


def _closed_port() -> int:
    """A port nothing listens on (free_port's socket is closed again before it returns)."""
    return free_port()


def _run(args: list[str], env: dict[str, str], tmp_path, entry=COORM) -> tuple[subprocess.CompletedProcess, float]:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("COORM_")},
            "COORM_CONNECTION_FILE": str(tmp_path / "connection.json"), **env}
    t0 = time.monotonic()
    run = subprocess.run([*entry, *args], env=full, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return run, time.monotonic() - t0


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got: {stderr!r}"
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("args", NATS_COMMANDS.values(), ids=NATS_COMMANDS.keys())
def test_a_command_gives_up_on_an_unreachable_nats_with_exit_code_3(args, tmp_path):
    url = f"nats://127.0.0.1:{_closed_port()}"
    run, took = _run(args, {"COORM_NATS_URL": url}, tmp_path)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    line = _one_line(run.stderr)
    assert url in line and "COORM_NATS_URL" in line and "coorm up" in line, line
    assert took < GIVE_UP, f"took {took:.1f} s"


def test_the_message_names_the_connection_file_and_hides_its_password(tmp_path):
    url = f"nats://launcher:s3cret@127.0.0.1:{_closed_port()}"
    (tmp_path / "connection.json").write_text(json.dumps({"nats_url": url, "redis_url": "redis://127.0.0.1:1/0"}))
    run, took = _run(["status"], {"COORM_CONNECT_TIMEOUT": "1"}, tmp_path)
    assert run.returncode == 3
    line = _one_line(run.stderr)
    assert str(tmp_path / "connection.json") in line and "within 1 s" in line, line
    assert "s3cret" not in line and "launcher:***@127.0.0.1" in line, line
    assert took < GIVE_UP


def test_the_connect_timeout_bounds_a_server_that_never_answers(tmp_path):
    """A listener that accepts and says nothing (a hung server, a firewall's black hole) is given up on
    after COORM_CONNECT_TIMEOUT, not after the operating system's minutes."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        run, took = _run(["apps"], {"COORM_NATS_URL": f"nats://127.0.0.1:{port}", "COORM_CONNECT_TIMEOUT": "1.5"},
                         tmp_path)
    assert run.returncode == 3, run.stderr
    assert "within 1.5 s" in _one_line(run.stderr)
    assert 1.5 <= took < GIVE_UP, f"took {took:.1f} s"


@pytest.mark.parametrize("args", FAST_COMMANDS.values(), ids=FAST_COMMANDS.keys())
def test_the_light_path_gives_up_on_an_unreachable_nats_with_exit_code_3(args, tmp_path):
    url = f"nats://127.0.0.1:{_closed_port()}"
    run, took = _run(args, {"COORM_NATS_URL": url}, tmp_path, entry=FAST)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    line = _one_line(run.stderr)
    assert url in line and "COORM_NATS_URL" in line and "coorm up" in line, line
    assert took < GIVE_UP, f"took {took:.1f} s"


@pytest.mark.parametrize("args", REDIS_COMMANDS.values(), ids=REDIS_COMMANDS.keys())
def test_a_command_reading_redis_gives_up_with_exit_code_3(args, tmp_path):
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    run, took = _run(args, {"COORM_REDIS_URL": url}, tmp_path)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    line = _one_line(run.stderr)
    assert url in line and "COORM_REDIS_URL" in line and "coorm up" in line, line
    assert took < GIVE_UP
