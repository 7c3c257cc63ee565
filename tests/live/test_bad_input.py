"""Bad input on every subject gets an error reply with a code and a readable reason, and changes nothing."""

from __future__ import annotations

import json

import pytest

from coorm.launchers.sdk import Session
from coorm.services.stack import LocalStack
from coorm.shared import bus, subjects
from coorm.shared.protocol import StatusQuery, StatusReply
from coorm.shared.requests import RequestSpec
from coorm.shared.settings import Settings
from tests.live.prober import Prober


@pytest.fixture
async def system(servers, redis_url):
    settings = Settings(nats_url=servers.nats_url, redis_url=servers.redis_url, reschedule_interval=0.0,
                        fair_start=0.0, kill_grace=0.3, launcher_heartbeat=0.5, session_timeout=30.0)
    async with LocalStack(settings, {"c0": 4}, with_batch=True) as stack:
        a = await Session.open(settings, kind="rigid", name="a")
        b = await Session.open(settings, kind="rigid", name="b")
        await a.request(RequestSpec(id="ra", cluster="c0", nodes=2, duration=600))
        await a.wait_start("ra", 10)
        await b.request(RequestSpec(id="rb", cluster="c0", nodes=4, duration=600))  # waits behind ra
        nc = await Prober(settings).connect()
        yield stack, a, b, nc
        await nc.close()
        await a.close()
        await b.close()


async def _state(nc: Prober) -> str:
    st = await bus.call(nc.user, subjects.QUERY_STATUS, StatusQuery(), StatusReply)
    return json.dumps({"apps": sorted(x.app for x in st.apps),
                       "requests": sorted((r.request, r.state, r.nodes, tuple(r.node_ids)) for r in st.requests),
                       "clusters": [c.model_dump() for c in st.clusters]})


async def _raw(nc, subject: str, payload) -> dict:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    msg = await nc.request(subject, data, timeout=5)
    return json.loads(msg.data)


def _cases(a: Session, b: Session, node_a: str) -> list[tuple[str, str, object, str]]:
    """(what, subject, payload, expected error code)."""
    ta, tb = a.token, b.token
    me = a.user
    session_open = subjects.session_open(me)
    req = subjects.app_request(a.app)
    done = subjects.app_done(a.app)
    return [
        ("session.open: not JSON", session_open, b"{oops", "bad_message"),
        ("session.open: wrong type", session_open, {"name": 5}, "bad_message"),
        ("session.open: unknown field", session_open, {"colour": "red"}, "bad_message"),
        # the user is the one NATS authenticated: a message cannot claim another
        ("session.open: claiming a user", session_open, {"user": "alice"}, "bad_message"),
        ("clusters.info: not JSON", subjects.CLUSTERS_INFO, b"\xff\xfe", "bad_message"),
        ("clusters.interinfo: argument", subjects.CLUSTERS_INTERINFO, {"x": 1}, "bad_message"),
        ("request: not JSON", req, b"[1, 2", "bad_message"),
        ("request: no token", req, {"requests": [{"id": "x", "cluster": "c0", "nodes": 1, "duration": 5}]},
         "bad_message"),
        ("request: wrong token", req, {"token": tb, "requests": [{"id": "x", "cluster": "c0", "nodes": 1,
                                                                   "duration": 5}]}, "bad_token"),
        ("request: negative nodes", req, {"token": ta, "requests": [{"id": "x", "cluster": "c0", "nodes": -1,
                                                                      "duration": 5}]}, "bad_message"),
        ("request: nodes as text", req, {"token": ta, "requests": [{"id": "x", "cluster": "c0", "nodes": "many",
                                                                     "duration": 5}]}, "bad_message"),
        ("request: unknown cluster", req, {"token": ta, "requests": [{"id": "x", "cluster": "c9", "nodes": 1,
                                                                       "duration": 5}]}, "unknown_cluster"),
        ("request: duplicate id", req, {"token": ta, "requests": [{"id": "ra", "cluster": "c0", "nodes": 1,
                                                                    "duration": 5}]}, "duplicate"),
        ("request: NEXT of another app's request", req,
         {"token": ta, "requests": [{"id": "x", "cluster": "c0", "nodes": 1, "duration": 5, "related_to": "rb",
                                     "related_how": "NEXT"}]}, "not_yours"),
        ("request: relation cycle", req,
         {"token": ta, "requests": [{"id": "x", "cluster": "c0", "nodes": 1, "duration": 5, "related_to": "y",
                                     "related_how": "NEXT"},
                                    {"id": "y", "cluster": "c0", "nodes": 1, "duration": 5, "related_to": "x",
                                     "related_how": "NEXT"}]}, "bad_request"),
        ("request: unknown app", subjects.app_request(f"{me}.nobody"),
         {"token": ta, "requests": [{"id": "x", "cluster": "c0", "nodes": 1, "duration": 5}]}, "unknown_app"),
        ("done: unknown request", done, {"token": ta, "request": "nope"}, "unknown_request"),
        ("done: another app's request", done, {"token": ta, "request": "rb"}, "not_yours"),
        ("done: a node it does not hold", done, {"token": ta, "request": "ra", "released": ["c0n99"]},
         "bad_release"),
        ("done: wrong token", done, {"token": "forged", "request": "ra"}, "bad_token"),
        ("done: released as text", done, {"token": ta, "request": "ra", "released": "c0n0"}, "bad_message"),
        ("close: wrong token", subjects.app_close(a.app), {"token": tb}, "bad_token"),
        ("heartbeat: unknown app", subjects.app_heartbeat(f"{me}.ghost"), {"token": ta}, "unknown_app"),
        ("launch: not the owner", subjects.node_launch(node_a, me),
         {"token": tb, "app": b.app, "request": "rb", "argv": ["true"]}, "not_owner"),
        ("launch: forged token", subjects.node_launch(node_a, me),
         {"token": "forged", "app": a.app, "request": "ra", "argv": ["true"]}, "bad_token"),
        ("launch: empty argv", subjects.node_launch(node_a, me),
         {"token": ta, "app": a.app, "request": "ra", "argv": []}, "bad_message"),
        ("kill: not JSON", subjects.node_kill(node_a), b"kill!", "bad_message"),
        ("agent.register: no nodes", subjects.AGENT_REGISTER, {"agent": "x", "cluster": "c0", "nodes": []},
         "bad_message"),
        ("agent.register: a node of another cluster", subjects.AGENT_REGISTER,
         {"agent": "x", "cluster": "c5", "nodes": [{"id": node_a, "cores": 1, "memory_mb": 1}]}, "bad_request"),
        ("internal.nodes: unknown kind", subjects.NODES_EVENT, {"kind": "explode", "cluster": "c0",
                                                                 "nodes": ["c0n0"]}, "bad_message"),
        ("query.status: argument", subjects.QUERY_STATUS, {"all": True}, "bad_message"),
        # hostile input that was answered with an internal error (or not at all) before: refused at the root
        ("deep JSON: a list", req, b"[" * 100_000 + b"]" * 100_000, "bad_message"),  # was a RecursionError
        ("deep JSON: an object", session_open, b'{"a":' * 5_000 + b"1" + b"}" * 5_000, "bad_message"),
        ("deep JSON inside a field", done, b'{"token": "' + ta.encode() + b'", "request": ' + b"[" * 3_000
         + b"]" * 3_000 + b"}", "bad_message"),
        ("kill: NaN grace", subjects.node_kill(node_a), b'{"request": "zz", "grace": NaN}', "bad_message"),
        ("kill: Infinity grace", subjects.node_kill(node_a), b'{"request": "zz", "grace": Infinity}', "bad_message"),
        ("kill: a grace beyond a float", subjects.node_kill(node_a), b'{"request": "zz", "grace": 1e999}',
         "bad_message"),
        ("request: a non-ASCII token", req, {"token": "t\u00e9", "requests": [{"id": "x", "cluster": "c0",
                                                                             "nodes": 1, "duration": 5}]},
         "bad_message"),  # was a TypeError (compare_digest takes ASCII only)
        ("heartbeat: a token of emoji", subjects.app_heartbeat(a.app), {"token": "\U0001f642"}, "bad_message"),
        ("heartbeat: a token as a number", subjects.app_heartbeat(a.app), {"token": 12345}, "bad_message"),
        ("views: '>' for an app", subjects.app_views(f"{me}.>"), {}, "bad_request"),  # was a ValidationError
        ("views: '*' for an app", subjects.app_views(f"{me}.*"), {}, "bad_request"),
        ("views: a non-ASCII app", subjects.app_views(f"{me}.\u00e9"), {}, "bad_request"),
        ("views: an app id too long", subjects.app_views(f"{me}." + "x" * 129), {}, "bad_request"),
        ("heartbeat: '>' for an app", subjects.app_heartbeat(f"{me}.>"), {"token": ta}, "bad_request"),
        # the engine reads a heartbeat in a client's own compact form without parsing it: the same refusals
        ("heartbeat, compact: another session's token", subjects.app_heartbeat(a.app),
         b'{"token":"' + tb.encode() + b'"}', "bad_token"),
        ("heartbeat, compact: unknown app", subjects.app_heartbeat(f"{me}.ghost"), b'{"token":"' + ta.encode() + b'"}',
         "unknown_app"),
        ("heartbeat, compact: '*' for an app", subjects.app_heartbeat(f"{me}.*"), b'{"token":"' + ta.encode() + b'"}',
         "bad_request"),
        ("heartbeat, compact: a token of emoji", subjects.app_heartbeat(a.app), '{"token":"\U0001f642"}'.encode(),
         "bad_message"),
        ("heartbeat, compact: an escaped quote", subjects.app_heartbeat(a.app), b'{"token":"' + ta.encode() + b'\\""}',
         "bad_token"),
        ("heartbeat, compact: an empty token", subjects.app_heartbeat(a.app), b'{"token":""}', "bad_message"),
    ]


async def test_bad_input_on_every_subject_is_refused_with_a_reason_and_changes_nothing(system):
    stack, a, b, nc = system
    node_a = a._started["ra"].nodes[0]
    before = await _state(nc)
    for what, subject, payload, code in _cases(a, b, node_a):
        reply = await _raw(nc, subject, payload)
        assert reply.get("ok") is False, f"{what}: accepted: {reply}"
        assert reply["error"]["code"] == code, f"{what}: {reply['error']}"
        assert len(reply["error"]["message"]) > 10, what  # a readable reason
        assert await _state(nc) == before, f"{what} changed the state"
    # and the system still works: the good versions go through
    (rid,) = await a.request(RequestSpec(id="ok", cluster="c0", nodes=1, duration=5))
    assert rid == "ok"
    assert (await a.launch("ra", node_a, ["true"]))  # the owner may launch


async def test_a_field_name_as_big_as_a_message_is_refused_in_a_reply_that_fits(system):
    """The refusal names the field; it once quoted all of it, and a reply bigger than the server takes never
    went out (the caller waited for nothing)."""
    stack, a, b, nc = system
    for subject in (subjects.session_open(a.user), subjects.app_request(a.app), subjects.QUERY_STATUS):
        payload = json.dumps({"k" * (nc.max_payload - 16): 1}).encode()
        assert len(payload) <= nc.max_payload
        reply = await _raw(nc, subject, payload)
        assert reply["ok"] is False and reply["error"]["code"] == "bad_message", reply["error"]["code"]
        assert 10 < len(reply["error"]["message"]) <= bus.MAX_ERROR_CHARS + 3


async def test_a_session_cannot_act_on_another_sessions_subjects(system):
    stack, a, b, nc = system
    before = await _state(nc)
    # b's token on a's subjects, a's token on b's
    for subject, payload in ((subjects.app_done(a.app), {"token": b.token, "request": "ra"}),
                             (subjects.app_done(b.app), {"token": a.token, "request": "rb"}),
                             (subjects.app_close(a.app), {"token": b.token})):
        reply = await _raw(nc, subject, payload)
        assert reply["ok"] is False and reply["error"]["code"] == "bad_token"
    assert await _state(nc) == before
