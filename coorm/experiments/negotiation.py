"""The adaptive-RMS paper's negotiation, live: its cases over ``coorm up``, and the negotiation round trip.

The paper (§6) ran its C prototype on 8 processors: an evolving application on 2 asked for 2 more (granted:
4) and then for 14 more (offered the 6 free, it accepted: 8); a malleable application on 4, whose total
must stay a power of two, was offered the 4 processors a short rigid job freed and grew to 8; §3 adds the
evolving application on 8 that asks for 24 while 15 are free and takes 8 (a counter-offer). Table 1 gives
the time of 1 to 5 negotiation rounds: 0.03, 0.04, 0.12, 0.20, 0.28 ms.

Here, each case runs on the live system (nats-server, valkey, every service, one node agent per cluster
starting real processes): two clusters, ``c0`` of 8 nodes (the paper's machine) and ``c1`` of 32 (§3's
numbers), the applications through the SDK (the evolving ones) and the shipped launchers with
:class:`~coorm.launchers.live.LiveRunner` (the malleable one and the rigid jobs). The malleable case is run
twice: the paper's (a rigid job of 4 ends), and one that shows "only what it can use" -- two rigid jobs of
3 and 1 end one after the other: 3 idle nodes are no growth a power-of-two application can use, so no
offer is made until the fourth frees up.

The round trip: ``k`` rounds are the negotiation and ``k - 1`` counter-offers, each answered by an offer
(a reject, not timed, then ends it), timed by the application from sending the first message to reading
the last offer -- over NATS, through the policy engine, which logs every event in Redis before it applies
it and answers. Next to it, the same rounds through the policy core alone (in this process, no I/O), and a
heartbeat (a request/reply the engine answers without logging): where the time goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from pathlib import Path

from coorm.experiments import common

NAME = "negotiation"
PAPER_MS = {1: 0.03, 2: 0.04, 3: 0.12, 4: 0.20, 5: 0.28}
CLUSTERS = {"c0": 8, "c1": 32}
ENV = {"COORM_RESCHEDULE_INTERVAL": "0.05", "COORM_FAIR_START": "1", "COORM_PREEMPT_GRACE": "3",
       "COORM_KILL_GRACE": "1", "COORM_LOG_LEVEL": "WARNING", "COORM_SESSION_TIMEOUT": "60"}
LONG = ["sleep", "3600"]  # an application's process on each of its nodes (killed when the node goes back)


def run(out: Path, quick: bool = False) -> list[dict]:
    from coorm.cli.up import Up

    repeats = 20 if quick else 200
    up = Up(CLUSTERS, env=ENV, write_connection=False, accounting=False)
    try:
        settings = up.start(180)
        rows = asyncio.run(_live(settings, repeats))
    finally:
        up.stop()
    rows += core_rounds(repeats)
    common.write_csv(out / f"{NAME}.csv", rows)
    return rows


# ==================================================================================================
# the cases
# ==================================================================================================
async def _live(settings, repeats: int) -> list[dict]:
    rows = [await _evolving(settings, "c0", 2, 2, None, None, "asks 2 more, 6 free", "granted 2: on 4"),
            await _evolving(settings, "c0", 2, 14, None, None, "asks 14 more, 6 free", "offered 6, accepts: on 8"),
            await _evolving(settings, "c1", 8, 24, 9, 8, "on 8, asks 24 more, 15 free: counters 8",
                            "offered 15, counters 8: on 16"),
            await _evolving(settings, "c1", 8, 24, 9, "pow2", "the same, telling its sizes (powers of two)",
                            "(the paper's RMS offered 15)"),
            await _malleable(settings, [4], "malleable on 4 (powers of two), a rigid job of 4 ends",
                             "offered 4, accepts: on 8"),
            await _malleable(settings, [3, 1], "the same, two rigid jobs of 3 and 1 end one after the other",
                             "(not in the paper)")]
    rows += await _round_trips(settings, repeats)
    return rows


async def _evolving(settings, cluster: str, held: int, more: int, busy: int | None, answer: int | str | None,
                    case: str, paper: str) -> dict:
    """An evolving application on ``held`` nodes (and another on ``busy``) asks for ``more``; it counters
    with ``answer`` nodes (an int), or tells its sizes (``"pow2"``), or accepts what it is offered."""
    from coorm.launchers.sdk import Session
    from coorm.shared.negotiation import NegotiationTerms, pow2_sizes
    from coorm.shared.requests import RequestSpec

    async with await Session.open(settings, kind="evolving", name="evolving") as app, \
            await Session.open(settings, kind="rigid", name="busy") as other:
        if busy:
            (b,) = await other.request(RequestSpec(id=other.rid("busy"), cluster=cluster, nodes=busy, duration=600))
            await other.wait_start(b, 30)
        (base,) = await app.request(RequestSpec(id=app.rid("base"), cluster=cluster, nodes=held, duration=600))
        st = await app.wait_start(base, 30)
        for node in st.nodes:
            await app.launch(base, node, LONG)
        idle = CLUSTERS[cluster] - held - (busy or 0)
        sizes = pow2_sizes(held, held + more) if answer == "pow2" else ()
        t0 = time.perf_counter()
        offer = await app.negotiate(NegotiationTerms(negotiation=app.rid("grow"), cluster=cluster,
                                                     min_nodes=sizes[0] if sizes else 1, max_nodes=more,
                                                     sizes=sizes, duration=600.0))
        offers = [offer.nodes]
        if isinstance(answer, int) and offer.offer is not None and offer.nodes != answer:
            reply = await app.respond(offer.offer, "counter", answer)
            assert reply.offer is not None
            offer = reply.offer
            offers.append(offer.nodes)
        grown = await app.accept(offer)
        negotiated = time.perf_counter() - t0
        st2 = await app.wait_start(grown, 30)
        for node in st2.nodes:
            await app.launch(grown, node, LONG)
        started = time.perf_counter() - t0
        ran = len(st.nodes) + len(st2.nodes)
    return {"row": "case", "case": case, "paper": paper, "idle": idle, "asked": more,
            "offers": " then ".join(str(n) for n in offers), "rounds": len(offers), "accepted": offer.nodes,
            "nodes_after": ran, "negotiated_ms": round(negotiated * 1000, 1), "started_ms": round(started * 1000, 1)}


async def _malleable(settings, rigid_sizes: list[int], case: str, paper: str) -> dict:
    """The shipped malleable launcher (minimum 4, at most 8, powers of two) next to rigid jobs that end one
    after the other (2 s apart); what it was offered, when, and what it held."""
    from coorm.launchers.live import LiveRunner
    from coorm.launchers.malleable import MalleableLauncher
    from coorm.launchers.rigid import RigidLauncher
    from coorm.launchers.sdk import OfferReceived, Session
    from coorm.services.stack import wait_until

    rigid_runs, rigids = [], []
    for i, n in enumerate(rigid_sizes):
        s = await Session.open(settings, kind="rigid", name=f"rigid{i}", preemptive_views=False, views=False)
        lz = RigidLauncher(s.app, "c0", n, 600.0)
        rigids.append(lz)
        runner = LiveRunner(s, lz, command=["sleep", str(2 + 2 * i)], command_ends_work=True)
        rigid_runs.append(asyncio.create_task(runner.run()))
    await wait_until(lambda: all(r.running for r in rigids), 30, "the rigid jobs' starts")
    s = await Session.open(settings, kind="malleable", name="malleable")
    mal = MalleableLauncher(s.app, "c0", 4, 8, sizes="pow2", duration=600.0)
    heard: list[int] = []  # the sizes it was offered, in order

    async def observe(item, result) -> None:
        if isinstance(item, OfferReceived) and not item.offer.lapsed:
            heard.append(item.offer.nodes)

    run = asyncio.create_task(LiveRunner(s, mal, command=LONG, observe=observe).run())
    for r in rigid_runs:
        if (await r).exit_code != 0:
            raise RuntimeError("a rigid job failed")
    await wait_until(lambda: mal.held() == 8, 30, "the malleable application at 8")
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    return {"row": "case", "case": case, "paper": paper, "idle": 0, "asked": "4 (standing)",
            "offers": " then ".join(str(n) for n in heard) or "none", "rounds": len(heard),
            "accepted": 4 * mal.accepted, "nodes_after": mal.held()}


# ==================================================================================================
# the round trip
# ==================================================================================================
async def _round_trips(settings, repeats: int) -> list[dict]:
    from coorm.launchers.sdk import Session
    from coorm.shared import bus
    from coorm.shared.negotiation import NegotiationTerms
    from coorm.shared.protocol import HeartbeatAck, HeartbeatMsg

    rows = []
    async with await Session.open(settings, kind="evolving", name="rtt") as app:
        beats = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await bus.call(app.nc, app.reply.subjects.heartbeat, HeartbeatMsg(token=app.token), HeartbeatAck)
            beats.append(time.perf_counter() - t0)
        n = 0
        times: dict[int, list[float]] = {k: [] for k in PAPER_MS}
        for _ in range(repeats):
            for k in PAPER_MS:  # interleaved: the machine's load falls on every row alike
                n += 1
                terms = NegotiationTerms(negotiation=app.rid(f"n{n}"), cluster="c0", max_nodes=8, duration=60.0)
                t0 = time.perf_counter()
                offer = await app.negotiate(terms)
                for i in range(k - 1):
                    assert offer.offer is not None
                    reply = await app.respond(offer.offer, "counter", 7 - i)
                    assert reply.offer is not None and reply.offer.nodes == 7 - i
                    offer = reply.offer
                times[k].append(time.perf_counter() - t0)
                assert offer.offer is not None
                await app.respond(offer.offer, "reject")
        rows += [{"row": "rtt", "rounds": k, "paper_ms": PAPER_MS[k], **_ms("live", times[k])} for k in PAPER_MS]
        rows.append({"row": "heartbeat", **_ms("live", beats)})
    return rows


def core_rounds(repeats: int) -> list[dict]:
    """The same rounds through the policy core alone: the cores of a system like the live one (its
    settings: a pass may follow each event), in this process, no I/O."""
    from coorm.services.coupled import CoupledCores
    from coorm.services.policy_engine.core import PolicySettings
    from coorm.shared.events import Negotiate, Offered, OpenSession, Respond
    from coorm.shared.negotiation import NegotiationTerms

    cores = CoupledCores(PolicySettings(reschedule_interval=0.05, pass_burst=16))
    for c, size in CLUSTERS.items():
        cores.register(0.0, c, [f"{c}n{i}" for i in range(size)])
    cores.handle(OpenSession(at=0.0, app="a"))
    n, now = 0, 1.0
    times: dict[int, list[float]] = {k: [] for k in PAPER_MS}
    for _ in range(repeats):
        for k in PAPER_MS:
            n += 1
            now += 1.0
            t0 = time.perf_counter()
            first = cores.handle(Negotiate(at=now, app="a", terms=NegotiationTerms(
                negotiation=f"a.n{n}", cluster="c0", max_nodes=8, duration=60.0)))[0]
            assert isinstance(first, Offered)
            offer = first.offer
            for i in range(k - 1):
                answer = cores.handle(Respond(at=now, app="a", offer=offer, answer="counter", nodes=7 - i))[0]
                assert isinstance(answer, Offered) and answer.nodes == 7 - i
                offer = answer.offer
            times[k].append(time.perf_counter() - t0)
            cores.handle(Respond(at=now, app="a", offer=offer, answer="reject"))
    return [{"row": "core", "rounds": k, **_ms("core", times[k])} for k in PAPER_MS]


def _ms(prefix: str, seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {f"{prefix}_median_ms": round(statistics.median(ms), 3),
            f"{prefix}_p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 3), "samples": len(ms)}


# ==================================================================================================
# EXPERIMENTS.md
# ==================================================================================================
def markdown(rows: list[dict]) -> dict[str, str]:
    cases = [r for r in rows if r["row"] == "case"]
    rtt = {r["rounds"]: r for r in rows if r["row"] == "rtt"}
    core = {r["rounds"]: r for r in rows if r["row"] == "core"}
    beat = next(r for r in rows if r["row"] == "heartbeat")
    t1 = common.md_table(
        ["case (c0: 8 nodes, c1: 32)", "paper", "idle", "offers", "accepted", "nodes after", "asked → accepted (ms)"],
        [[r["case"], r["paper"], r["idle"], r["offers"], r["accepted"], r["nodes_after"],
          r.get("negotiated_ms", "—")] for r in cases])
    t2 = common.md_table(
        ["rounds", "paper (C prototype)", "ours live: median [p95]", "policy core alone: median"],
        [[k, f"{rtt[k]['paper_ms']:.2f} ms", f"{rtt[k]['live_median_ms']:.2f} [{rtt[k]['live_p95_ms']:.2f}] ms",
          f"{core[k]['core_median_ms']:.3f} ms"] for k in sorted(rtt)])
    note = (f"A heartbeat's round trip (answered without logging): median {beat['live_median_ms']:.2f} ms, "
            f"p95 {beat['live_p95_ms']:.2f} ms; {rtt[1]['samples']} samples per row.")
    return {NAME: t1 + "\n\n" + t2 + "\n\n" + note}
