"""Failover on replicated servers: ``coorm up --ha`` (a 3-server NATS cluster with the streams at 3
replicas, a Valkey primary with two replicas under three sentinels) runs a mixed live workload -- the chaos
run's applications (``benchmarks/chaos.py``: SDK rigid jobs, ``coorm submit`` jobs, batch jobs, one
parameter-sweep application per cluster) -- while the NATS server that leads the decision stream is
SIGKILLed, then the Valkey primary. Neither comes back during the run: the system must carry on with the
survivors and the promoted replica.

Then, from the RMS's records and the applications' own observations (the chaos run's checks):

* accepted requests lost: requests the RMS accepted that neither started nor were told ended;
* applications hung or untold; nodes held by two started requests (status sampled every 0.25 s);
  wrong exit codes;
* per kill, the recovery: from the SIGKILL until a new one-node job ran to its end, and for the Valkey
  primary also until the sentinels named a new primary (the failover).

    python benchmarks/bench_ha.py            # 300 applications on c0=32,c1=32
    python benchmarks/bench_ha.py --quick    # 40 applications on c0=8,c1=8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos  # noqa: E402  # (the chaos run's applications and checks)

from coorm.cli.up import Up, parse_clusters  # noqa: E402
from coorm.services.runtime import await_chain  # noqa: E402
from coorm.shared.servers import ReplicatedServers  # noqa: E402
from coorm.shared.settings import Settings  # noqa: E402

# the worst case of each: the NATS server that leads the decision stream (the stream elects a new leader, and
# until then the policy engine's decisions are refused) and the Valkey primary (the sentinels promote a replica)
STREAM_LEADER = "NATS server leading the decision stream"
PRIMARY = "Valkey primary"
VICTIMS = (STREAM_LEADER, PRIMARY)


async def _quiet(e: Exception) -> None:
    """nats-py's default prints every failed attempt: the killed server is still in the list."""


async def stream_leader(settings: Settings) -> str:
    """The NATS server (``nats-<i>``) that leads the decision stream now."""
    import nats

    from coorm.shared import subjects
    from coorm.shared.endpoints import Role

    me = settings.identity(Role.SERVICE)
    assert me is not None
    nc = await nats.connect(settings.nats_url.split(","), nkeys_seed_str=me.seed, inbox_prefix=me.inbox_prefix,
                            error_cb=_quiet)
    try:
        info = await nc.jetstream().stream_info(subjects.DECISIONS_STREAM)
    finally:
        await nc.close()
    assert info.cluster is not None and info.cluster.leader and info.config.num_replicas == 3, info
    return "nats-" + info.cluster.leader.rsplit("-", 1)[1]  # (server_name coorm-nats-<i>)


async def decision_stream_state(settings: Settings) -> str:
    """Where the decision stream and the node allocator's consumer of it stand (said when applications hung:
    were the decisions stored, delivered, acknowledged?)."""
    import nats

    from coorm.shared import subjects
    from coorm.shared.endpoints import Role

    me = settings.identity(Role.SERVICE)
    assert me is not None
    try:
        nc = await nats.connect(settings.nats_url.split(","), nkeys_seed_str=me.seed, inbox_prefix=me.inbox_prefix,
                                connect_timeout=2, allow_reconnect=False, error_cb=_quiet)
    except Exception as e:  # noqa: BLE001 - a diagnosis, not a check
        return f"cannot connect: {e!r}"
    try:
        js = nc.jetstream()
        stream = await js.stream_info(subjects.DECISIONS_STREAM)
        out = [f"stream last seq {stream.state.last_seq}, leader {stream.cluster.leader if stream.cluster else None}"]
        for c in await js.consumers_info(subjects.DECISIONS_STREAM):
            delivered = c.delivered.stream_seq if c.delivered else None
            floor = c.ack_floor.stream_seq if c.ack_floor else None
            out.append(f"consumer {c.name}: delivered {delivered}, ack floor {floor}, "
                       f"ack pending {c.num_ack_pending}, pending {c.num_pending}, redelivered {c.num_redelivered}, "
                       f"leader {c.cluster.leader if c.cluster else None}")
        return "; ".join(out)
    except Exception as e:  # noqa: BLE001
        return f"cannot read: {e!r}"
    finally:
        await nc.close()


async def _victim(up: Up, settings: Settings, victim: str) -> str:
    if victim == STREAM_LEADER:
        return await stream_leader(settings)
    servers = up.servers
    assert isinstance(servers, ReplicatedServers)
    return f"valkey-{servers.valkey_ports.index(servers.primary_port())}"


async def _failover(up: Up, old_port: int, t0: float, timeout: float = 60.0) -> float:
    """Seconds from ``t0`` until a sentinel names a primary other than ``old_port``."""
    servers = up.servers
    assert isinstance(servers, ReplicatedServers)
    while time.monotonic() - t0 < timeout:
        try:
            if await asyncio.to_thread(servers.primary_port, 1.0) != old_port:
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - a sentinel busy electing
            pass
        await asyncio.sleep(0.05)  # asking the sentinels: nothing to wait on
    return float("inf")


async def guarded(app, name: str, via: str) -> chaos.Outcome:
    """An application's outcome, whatever it raised: a CancelledError out of the SDK (nats-py's close of a
    connection the server reset raises one) is what that application was told, not the end of the run."""
    try:
        return await app
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the run itself is being cancelled
        return chaos.Outcome(name, via, 0, error=f"CancelledError out of the SDK: {e!r}")
    except Exception as e:  # noqa: BLE001 - told an error (a session never opened: no leader for 40 tries)
        return chaos.Outcome(name, via, 0, error=f"{type(e).__name__}: {e}")


async def where_they_wait(at: float) -> dict[str, str]:
    """Just before the applications' deadline: where each application's runner waits (said for those that
    hung), by application id."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))  # (a moment of the run, not a synchronisation)
    out: dict[str, str] = {}
    for t in asyncio.all_tasks():
        coro = t.get_coro()
        frame = getattr(coro, "cr_frame", None)
        if t.done() or frame is None:
            continue
        name = getattr(coro, "__qualname__", "")
        if name == "LiveRunner.run" and getattr(frame.f_locals.get("self"), "s", None) is not None:
            out[frame.f_locals["self"].s.app] = " <- ".join(reversed(await_chain(t)))  # its runner
        elif name == "guarded":
            out[frame.f_locals["name"]] = " <- ".join(reversed(await_chain(t)))  # the application (opening)
    return out


async def kill_in_turn(up: Up, settings: Settings, pause: float, env: dict[str, str], cwd: Path) -> dict:
    """SIGKILL each victim (by pid) after ``pause`` seconds of workload; how long until a job ran again."""
    recovery: dict[str, float] = {}
    failover: dict[str, float] = {}
    killed: dict[str, str] = {}
    for k, victim in enumerate(VICTIMS):
        await asyncio.sleep(pause)  # the workload runs a while between two kills
        name = await _victim(up, settings, victim)
        servers = up.servers
        assert isinstance(servers, ReplicatedServers)
        old_primary = servers.primary_port()
        pid = up.children[name].pid
        assert pid is not None
        killed[victim] = name
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        promoted = asyncio.create_task(_failover(up, old_primary, t0)) if victim == PRIMARY else None
        while not await chaos.probe(settings, k, env, cwd, batch=False):
            if time.monotonic() - t0 > 60:
                recovery[victim] = float("inf")
                break
        else:
            recovery[victim] = time.monotonic() - t0
        if promoted is not None:
            failover[victim] = await promoted
    return {"recovery": recovery, "failover": failover, "killed": killed}


async def run(clusters: dict[str, int], apps: int, seed: int, workdir: Path | None = None,
              cli_share: float = 0.1, batch_share: float = 0.2, pause: float = 5.0) -> dict:
    rng = random.Random(seed)
    up = Up(clusters, workdir, env=chaos.ENV, write_connection=False, ha=True)
    t_start = time.monotonic()
    settings = await asyncio.to_thread(up.start, 180)
    started_in = time.monotonic() - t_start
    env = dict(os.environ, **chaos.ENV, COORM_NATS_URL=settings.nats_url, COORM_REDIS_URL=settings.redis_url,
               COORM_CREDENTIALS_DIR=str(settings.credentials_dir),
               COORM_CONNECTION_FILE=str(up.workdir / "none.json"))
    # no supervision: what is killed stays dead, the survivors must do
    stop_sampling = asyncio.Event()
    doubles: list[str] = []
    sampler = asyncio.create_task(chaos.sample_double_bookings(settings, stop_sampling, doubles))
    try:
        deadline = time.monotonic() + pause * (len(VICTIMS) + 2) + 180
        waits = asyncio.create_task(where_they_wait(deadline - 2.0))
        tasks = [asyncio.create_task(guarded(chaos.psa_app(settings, c, 4 * n, deadline), f"psa-{c}", "psa"))
                 for c, n in clusters.items()]
        killer = None
        jobs_dir = up.workdir / "batch-jobs"
        jobs_dir.mkdir(exist_ok=True)
        for i in range(apps):
            x = rng.random()
            if x < cli_share:
                tasks.append(asyncio.create_task(guarded(chaos.cli_app(env, i, rng, deadline), f"cli{i}", "cli")))
            elif x < cli_share + batch_share:
                job = (rng.choice(["c0", "c1"]), rng.randint(1, 2), rng.uniform(0.5, 4.0), rng.randint(0, 3))
                tasks.append(asyncio.create_task(guarded(
                    chaos.batch_app(settings, env, jobs_dir, f"batch{i}", *job, deadline), f"batch{i}", "batch")))
            else:
                tasks.append(asyncio.create_task(guarded(chaos.sdk_app(settings, i, rng, deadline), f"sdk{i}", "sdk")))
            # arrivals spread over the kills
            await asyncio.sleep(rng.expovariate(apps / (pause * (len(VICTIMS) + 1))))
            if i == apps // 10:
                killer = asyncio.create_task(kill_in_turn(up, settings, pause, env, jobs_dir))
        outcomes: list[chaos.Outcome] = await asyncio.gather(*tasks)
        waiting_at = await waits if waits.done() else {}
        waits.cancel()
        assert killer is not None
        kills = await killer
        stop_sampling.set()
        samples = await sampler
        streams = await decision_stream_state(settings)
    finally:
        await asyncio.to_thread(up.stop)
    hung = [o for o in outcomes if o.error == "hung"]
    untold = [o for o in outcomes if o.error is not None and o.error != "hung"]
    lost = [o for o in outcomes if o.accepted and not o.started and not o.ended_by_rms and o.error is None]
    wrong = [o for o in outcomes if o.wrong_code()]
    return {"apps": len(outcomes), "sdk": sum(o.via == "sdk" for o in outcomes),
            "cli": sum(o.via == "cli" for o in outcomes), "psa": sum(o.via == "psa" for o in outcomes),
            "batch": sum(o.via == "batch" for o in outcomes), "arrays": 0,
            "twice": [t for o in outcomes for t in o.twice],
            "killed_apps": sum(o.killed or bool(o.ended_by_rms) for o in outcomes),
            "lost": [o.name for o in lost], "hung": [f"{o.name} {o.detail}" for o in hung],
            "untold": [f"{o.name}: {o.error}" for o in untold], "wrong": [
                f"{o.name}: expected {o.expected}, got {o.code} ({[(e.code, e.reason) for e in o.exits]})"
                for o in wrong],
            "double_bookings": doubles, "samples": samples, "recovery": kills["recovery"],
            "failover": kills["failover"], "killed": kills["killed"], "started_in": started_in, "streams": streams,
            "gave_up": [f"{o.name}: {o.refused[0]}" for o in outcomes if o.refused and o.via == "psa"],
            "exits": sum(len(o.exits) for o in outcomes),
            "waiting_at": {o.name: waiting_at.get(o.detail.split(":")[0]) or waiting_at.get(o.name, "?")
                           for o in hung if o.detail}}


def report(r: dict) -> str:
    lines = [chaos.report(r).replace("| SIGKILL of | back to running a job (s) |",
                                     "| SIGKILL of (not restarted) | back to running a job (s) |"),
             "", f"coorm up --ha came up in {r['started_in']:.1f} s; killed: "
             + ", ".join(f"{v} = {n}" for v, n in r["killed"].items())]
    lines += [f"{v}: the sentinels named a new primary {t:.1f} s after the kill" for v, t in r["failover"].items()]
    if r["hung"]:
        lines.append(f"decisions at the end: {r['streams']}")
        lines += [f"{name} waited at: {where}" for name, where in r.get("waiting_at", {}).items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apps", type=int, default=None, help="applications (default 300, --quick 40)")
    ap.add_argument("--clusters", default=None, help="CLUSTER=NODES,... (default c0=32,c1=32, --quick c0=8,c1=8)")
    ap.add_argument("--quick", action="store_true", help="a smaller run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None, help="coorm up's directory, kept (logs)")
    args = ap.parse_args()
    apps = args.apps if args.apps is not None else 40 if args.quick else 300
    clusters = parse_clusters(args.clusters or ("c0=8,c1=8" if args.quick else "c0=32,c1=32"))
    r = asyncio.run(run(clusters, apps, args.seed, workdir=args.workdir))
    print(report(r))
    bad = r["lost"] or r["hung"] or r["untold"] or r["wrong"] or r["double_bookings"]
    bad = bad or any(t == float("inf") for t in r["recovery"].values())
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
