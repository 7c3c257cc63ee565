"""Another user cannot touch an application's offers, with the real NATS users and permissions: the victim's
subjects are closed to the attacker (NATS drops the message), and the attacker's own session naming the
victim's offer is refused by the policy core -- the offer still stands for its owner."""

from __future__ import annotations

import pytest

from coorm.launchers.sdk import Session
from coorm.shared import bus, subjects
from coorm.shared.events import ErrorCode
from coorm.shared.negotiation import NegotiationTerms
from coorm.shared.protocol import RespondMsg
from tests.live.test_security import MALLORY, VICTIM, WAIT, Hostile, as_user, store, system  # noqa: F401


async def test_a_user_cannot_answer_another_users_offer(system, store, servers):  # noqa: F811
    victim = await Session.open(as_user(system, store, VICTIM), kind="evolving")
    attacker = await Session.open(as_user(system, store, MALLORY), kind="evolving")
    mallory = await Hostile.connect(servers.nats_url, store.user(MALLORY))
    try:
        offer = await victim.negotiate(NegotiationTerms(negotiation=victim.rid("g"), cluster="c0", max_nodes=4,
                                                        duration=60.0, respond_within=60.0))
        assert offer.nodes == 4 and offer.offer is not None
        # on the victim's own subject, even with the victim's token: NATS drops it
        subject = subjects.app_respond(victim.app)
        await mallory.nc.publish(subject, bus.encode(RespondMsg(token=victim.token, offer=offer.offer,
                                                                answer="reject")))
        await mallory.refused("publish", subject)
        # on the attacker's own session: the offer is not its
        for answer in ("accept", "reject"):
            with pytest.raises(bus.WireError) as e:
                await attacker.respond(offer.offer, answer)
            assert e.value.code is ErrorCode.NOT_YOURS
        # the offer stands: its owner takes it
        grown = await victim.accept(offer)
        assert len((await victim.wait_start(grown, WAIT)).nodes) == 4
    finally:
        await mallory.close()
        await attacker.close()
        await victim.close()
