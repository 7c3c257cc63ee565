"""What agents' heartbeats cost the system, on the embedded default (``coorm up``'s servers and services as
separate processes): A emulated agents of one node each (an HPC node is a host: one agent per node, as
docs/scale.md's model has it), registered with the node allocator, each beating once a second, for a window
of W seconds -- as requests the allocator answers (``Ack``: an agent's sign that its NATS server reaches the
allocator, docs/ha.md §5), then as plain publishes (an agent older than the answer), on the same system in
the same run. Printed: the CPU microseconds each process spent per heartbeat in each form, and their ratio.

    python benchmarks/bench_agents.py                  # 1,000 agents, 10 s windows, 2 rounds
    python benchmarks/bench_agents.py --agents 2000 --window 20

The emulated agents live in this process (one NATS connection for all: the allocator's cost per heartbeat
does not depend on the connection it came through); its own CPU is printed too, not counted in the system's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_live import cpu_by_process  # noqa: E402

from coorm.cli.up import Up  # noqa: E402
from coorm.shared import bus, subjects  # noqa: E402
from coorm.shared.endpoints import Role  # noqa: E402
from coorm.shared.protocol import Ack, AgentHeartbeat, AgentRegister, AgentRegistered, NodeInfo  # noqa: E402

TICKS = 20  # sending rounds a second: each agent beats in one of them
CLUSTER = "hb"


async def register(nc, agents: list[str]) -> None:
    async def one(agent: str) -> None:
        msg = AgentRegister(agent=agent, cluster=CLUSTER, nodes=[NodeInfo(id=f"{agent}n0", cores=1, memory_mb=1024)])
        await bus.call(nc, subjects.AGENT_REGISTER, msg, AgentRegistered, timeout=30)

    for k in range(0, len(agents), 100):  # (a hundred at a time: the allocator brings each one's node up)
        await asyncio.gather(*(one(a) for a in agents[k:k + 100]))


async def beat(nc, agents: list[str], window: float, answered: bool) -> tuple[int, int]:
    """Every agent once a second for ``window`` seconds: (heartbeats sent, heartbeats unanswered)."""
    beats = [bus.encode(AgentHeartbeat(agent=a, nodes=[f"{a}n0"], processes=0)) for a in agents]
    per_tick = [beats[i::TICKS] for i in range(TICKS)]
    sent = lost = 0
    pending: set[asyncio.Task] = set()
    t0 = time.monotonic()
    tick = 0
    while (now := time.monotonic()) < t0 + window:
        for data in per_tick[tick % TICKS]:
            if answered:
                pending.add(asyncio.create_task(nc.request(subjects.AGENT_HEARTBEAT, data, timeout=5)))
            else:
                await nc.publish(subjects.AGENT_HEARTBEAT, data)
            sent += 1
        tick += 1
        await asyncio.sleep(max(0.0, t0 + tick / TICKS - now))  # the beats' schedule, not a synchronisation
        done = {t for t in pending if t.done()}
        pending -= done
        lost += sum(1 for t in done if t.exception() is not None or not _is_ack(t.result().data))
    if pending:
        await asyncio.wait(pending)
        lost += sum(1 for t in pending if t.exception() is not None or not _is_ack(t.result().data))
    await nc.flush()
    return sent, lost


def _is_ack(data: bytes) -> bool:
    try:
        bus.decode(data, Ack)
    except bus.WireError:
        return False
    return True


async def run(agents: int, window: float, rounds: int) -> None:
    env = {"COORM_LOG_LEVEL": "WARNING", "COORM_AGENT_TIMEOUT": "30"}
    up = Up({"c0": 1}, env=env, write_connection=False, accounting=False)
    _started.append(up)
    settings = await asyncio.to_thread(up.start, 120)
    nc = await bus.connect(settings.nats_url, "bench-agents", settings.identity(Role.AGENT))
    try:
        names = [f"hb{i:05d}" for i in range(agents)]
        await register(nc, names)
        print(f"embedded system; {agents} emulated agents of one node each, a heartbeat each a second, "
              f"{window:g} s windows")
        for r in range(1, rounds + 1):  # (the two forms in turn, each round: a drift shows as rounds that differ)
            rows = {}
            for form, answered in (("request", True), ("publish", False)):
                before = cpu_by_process(up)
                sent, lost = await beat(nc, names, window, answered)
                after = cpu_by_process(up)
                rows[form] = (sent, lost, {k: after[k] - before.get(k, 0.0) for k in after})
            procs = sorted({k for _, _, cpu in rows.values() for k in cpu})
            print(f"\nround {r}: CPU µs per heartbeat (a clock tick is {1e6 / (rows['request'][0] * 100):.1f} µs)")
            print(f"{'process':<24} {'request':>9} {'publish':>9} {'ratio':>6}")
            for p in procs:
                per = {f: rows[f][2].get(p, 0.0) / max(rows[f][0], 1) * 1e6 for f in rows}
                ratio = f"{per['request'] / per['publish']:.2f}" if per["publish"] > 0 else "-"
                print(f"{p:<24} {per['request']:>9.1f} {per['publish']:>9.1f} {ratio:>6}")
            for f, (sent, lost, _) in rows.items():
                print(f"{f}: {sent} heartbeats ({sent / window:.0f}/s), {lost} unanswered")
    finally:
        await bus.shutdown(nc)


_started: list[Up] = []  # the system started: a SIGTERM stops it


def _sigterm(_sig, _frame):
    for up in _started:
        up.stop()
    os._exit(143)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=1000, help="emulated agents (one node each)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of heartbeats in each form")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the two forms in turn")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        asyncio.run(run(args.agents, args.window, args.rounds))
    finally:
        for up in _started:  # (outside the event loop: it tells the applications, with a loop of its own)
            up.stop()


if __name__ == "__main__":
    main()
