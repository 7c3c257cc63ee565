"""The wire models: schemas export, round trips, and clear refusals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from coorm.shared import bus, subjects
from coorm.shared.protocol import (
    WIRE_MODELS,
    ChangeNotify,
    DoneMsg,
    HeartbeatMsg,
    RequestMsg,
    heartbeat_token,
    json_schemas,
)
from coorm.shared.stepfn import StepFunction


def test_every_wire_model_has_a_json_schema():
    schemas = json_schemas()
    assert set(schemas) == {m.__name__ for m in WIRE_MODELS}
    assert schemas["RequestMsg"]["properties"]["requests"]["maxItems"] == 1000
    json.dumps(schemas)  # serialisable as is


def test_change_notify_carries_a_view_as_steps():
    view = StepFunction.from_steps([(10.0, 4), (100.0, 16)])
    msg = ChangeNotify(app="a1", epoch=3, now=10.0, changes=[{"cluster": "c0", "type": "non_preemptive",
                                                               "cap": view.to_wire()}])
    back = ChangeNotify.model_validate_json(msg.model_dump_json())
    assert StepFunction.from_wire(back.changes[0].cap) == view


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        '{"token": "t", "requests": []}',
        '{"token": "t", "requests": [{"id": "r", "cluster": "c0", "nodes": "2"}]}',
        '{"requests": [{"id": "r", "cluster": "c0", "nodes": 2, "duration": 5}]}',
    ],
)
def test_malformed_request_messages_are_refused(raw):
    with pytest.raises(ValidationError):
        RequestMsg.model_validate_json(raw)


def test_done_message():
    msg = DoneMsg.model_validate_json('{"token": "t", "request": "r1", "released": ["n1"]}')
    assert msg.released == ["n1"]


def test_subjects_are_versioned_and_per_application():
    assert subjects.app_request("a7") == "coorm.v1.app.a7.request"
    assert subjects.notify_change("a7").startswith("coorm.v1.app.a7.")


_TOKENISH = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=260),
    st.text(max_size=20),
    st.just("t" * 256), st.just("t" * 257), st.just(""),
)


@given(token=_TOKENISH, head=st.sampled_from([b'{"token":"', b'{"token": "', b'{"tok":"', b'']),
       tail=st.sampled_from([b'"}', b'" }', b'","x":1}', b'"']))
def test_a_heartbeat_read_without_parsing_is_one_the_model_accepts_with_that_token(token, head, tail):
    """The policy engine reads a compact heartbeat's token without parsing it (``heartbeat_token``): whatever
    it reads so must be a heartbeat :class:`HeartbeatMsg` accepts, with the same token; what it does not read
    goes to the model, which judges it as before."""
    data = head + token.encode("utf-8", "surrogatepass") + tail
    read = heartbeat_token(data)
    try:
        parsed = bus.decode(data, HeartbeatMsg).token.encode()
    except (bus.WireError, UnicodeEncodeError):
        parsed = None
    if read is not None:
        assert parsed == read
    if head == b'{"token":"' and tail == b'"}' and parsed is not None and '"' not in token and "\\" not in token:
        assert read == parsed  # a client's own form, valid: read without parsing
