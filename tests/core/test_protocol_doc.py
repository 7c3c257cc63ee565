"""The protocol specification and the endpoint table it is rendered from: ``docs/protocol.md`` is what the
table renders, byte for byte; every subject of ``subjects.py`` has an entry and every entry's subject is
built by ``subjects.py``; every example is a valid message of its model; every error code a handler can
answer is in its entry."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from coorm.node_agent import runas
from coorm.node_agent.agent import Agent
from coorm.node_agent.state import NodeBook
from coorm.services.coupled import CoupledCores
from coorm.services.node_allocator.service import NodeAllocatorService
from coorm.services.policy_engine.core import PolicyCore
from coorm.services.policy_engine.service import PolicyEngine, session_subjects
from coorm.shared import endpoints, protocol, requests, subjects
from coorm.shared.endpoints import APP, ENDPOINTS, ERROR_MEANINGS, NODE, REQUEST, STREAM, USER, Endpoint, Kind
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import AllocatorDecisions, ErrorReply, RequestMsg
from coorm.shared.protocol_doc import COMMAND, ERROR_EXAMPLE, FIELD_NOTES, render

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
# what subjects.py defines besides subjects: parsers, application ids, and the inbox prefixes (the
# permissions' business: endpoints.permissions)
NOT_SUBJECTS = {"PREFIX", "app_of", "verb_of", "user_of", "owner", "app_id", "app_id_prefix", "INBOX_SERVICE",
                "INBOX_AGENT", "inbox_user"}
# a subject function's parameter -> token
PLACEHOLDER_FOR = {"app": APP, "node": NODE, "request": REQUEST, "stream": STREAM, "user": USER}
BY_SUBJECT = {e.subject: e for e in ENDPOINTS}


def _by_short(short: str) -> Endpoint:
    return next(e for e in ENDPOINTS if e.short == short)


# ================================================================================================
# the document
# ================================================================================================
def test_the_document_in_the_repository_is_what_the_table_renders():
    assert DOC.exists(), f"docs/protocol.md is missing: write it with `{COMMAND}`"
    assert DOC.read_bytes() == render().encode(), (
        f"docs/protocol.md is not what the endpoint table renders: regenerate it with `{COMMAND}`")


def test_the_rendering_follows_the_table():
    """The comparison above can fail: an entry changed in the table changes the document."""
    session = BY_SUBJECT[subjects.session_open(USER)]
    changed = dataclasses.replace(session, description="Open a session, differently.")
    table = tuple(changed if e is session else e for e in ENDPOINTS)
    text = render(table)
    assert text != render()
    assert "Open a session, differently." in text


def test_the_document_names_every_subject_of_the_table():
    text = DOC.read_text()
    for e in ENDPOINTS:
        assert f"| subject | `{e.subject}` |" in text, e.subject
        if e.paper:
            assert f"`{e.short}` (`{e.paper}`)" in text, e.paper
    # one section per entry, in the table's order
    titles = re.findall(r"^### \d+\.\d+ `([^`]+)`", text, flags=re.M)
    assert titles == [e.short for e in ENDPOINTS]


def test_the_document_lists_every_error_code_with_its_meaning():
    text = DOC.read_text()
    assert set(ERROR_MEANINGS) == set(ErrorCode)
    for code in ErrorCode:
        assert re.search(rf"^\| `{code.value}` \| ", text, flags=re.M), code


def test_every_field_note_names_a_real_field():
    """A note keyed by a renamed or removed field would never show: it must fail here instead."""
    models = {name: obj for module in (protocol, requests) for name, obj in vars(module).items()
              if inspect.isclass(obj) and issubclass(obj, BaseModel)}
    for key in FIELD_NOTES:
        model, field = key.split(".")
        assert model in models, key
        assert field in models[model].model_fields, key


def test_the_command_line_prints_and_writes_the_document(tmp_path):
    from coorm.cli.main import app

    runner = CliRunner()
    printed = runner.invoke(app, ["protocol", "doc"])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout == render()
    out = tmp_path / "protocol.md"
    wrote = runner.invoke(app, ["protocol", "doc", "--out", str(out)])
    assert wrote.exit_code == 0, wrote.output
    assert out.read_bytes() == render().encode()


# ================================================================================================
# the table and subjects.py
# ================================================================================================
def _subject_names() -> set[str]:
    """Every subject (pattern, function, stream name) subjects.py defines."""
    names = set()
    for name, obj in vars(subjects).items():
        if name.startswith("_") or name in NOT_SUBJECTS:
            continue
        if inspect.isfunction(obj) and obj.__module__ == subjects.__name__ or isinstance(obj, str):
            names.add(name)
    return names


def _unlisted(table: tuple[Endpoint, ...]) -> set[str]:
    return _subject_names() - {n for e in table for n in e.names}


def test_every_subject_of_subjects_py_has_an_entry():
    assert _unlisted(ENDPOINTS) == set()


def test_a_subject_without_an_entry_is_caught():
    exited = BY_SUBJECT[subjects.app_exited(APP)]
    assert _unlisted(tuple(e for e in ENDPOINTS if e is not exited)) == {"app_exited"}


def _built(name: str) -> str:
    """What subjects.py's ``name`` gives, with placeholders for its parameters."""
    obj = getattr(subjects, name)
    if isinstance(obj, str):
        return obj
    assert callable(obj)
    params = inspect.signature(obj).parameters
    return obj(*(PLACEHOLDER_FOR[p] for p in params))


@pytest.mark.parametrize("entry", ENDPOINTS, ids=lambda e: e.short)
def test_each_entry_is_built_by_the_names_it_lists(entry):
    """A name of an entry gives its subject, its wildcard form, its subscription or its stream -- so the
    table's subjects are subjects.py's, not copies."""
    assert entry.subject.startswith(subjects.PREFIX + ".")
    assert entry.subject in {_built(n) for n in entry.names}, "no listed name builds the subject itself"
    for name in entry.names:
        assert _built(name) in {entry.subject, entry.pattern, entry.subscribe_as, entry.stream}, name


def test_the_subjects_are_unique():
    assert len({e.subject for e in ENDPOINTS}) == len(ENDPOINTS)
    assert len({e.pattern for e in ENDPOINTS}) == len(ENDPOINTS)


@pytest.mark.parametrize("entry", ENDPOINTS, ids=lambda e: e.short)
def test_the_entry_is_coherent(entry):
    if entry.kind is Kind.REQUEST:
        assert entry.reply is not None and entry.reply_example is not None
        # bus.serve and the agent turn an undecodable message and a failed handler into these
        assert {ErrorCode.BAD_MESSAGE, ErrorCode.UNAVAILABLE} <= set(entry.errors)
    if entry.kind in (Kind.NOTIFICATION, Kind.STREAM) or entry.reply is None:
        assert entry.errors == () and entry.reply_example is None
    assert (entry.kind is Kind.STREAM) == bool(entry.stream) == bool(entry.consumer)
    assert len(set(entry.errors)) == len(entry.errors)
    assert entry.description and entry.sent_by and entry.served_by


# ================================================================================================
# the examples
# ================================================================================================
def _valid(model: type[BaseModel] | None, example: object) -> None:
    """The example as it would go on the wire, parsed by its model (raises if it is not one)."""
    if model is None:
        assert example == {}, "a body that is not read is {}"
        return
    model.model_validate_json(json.dumps(example))


EXAMPLES = [(e.short, e.request, e.example) for e in ENDPOINTS] + [
    (f"{e.short} reply", e.reply, e.reply_example) for e in ENDPOINTS if e.reply_example is not None
] + [("error reply", ErrorReply, ERROR_EXAMPLE)]


@pytest.mark.parametrize(("what", "model", "example"), EXAMPLES, ids=[x[0] for x in EXAMPLES])
def test_every_example_is_a_valid_message(what, model, example):
    _valid(model, example)


@pytest.mark.parametrize("breakage", ["missing key", "unknown key", "wrong type"])
def test_a_broken_example_is_refused(breakage):
    """The check above can fail."""
    good = dict(_by_short("app.<user>.<app>.request").example)
    _valid(RequestMsg, good)
    bad = dict(good)
    if breakage == "missing key":
        del bad["token"]
    elif breakage == "unknown key":
        bad["priority"] = 1
    else:
        bad["requests"] = "a7.run"
    with pytest.raises(ValidationError):
        _valid(RequestMsg, bad)


def test_the_session_reply_example_names_the_session_s_subjects():
    reply = BY_SUBJECT[subjects.session_open(USER)].reply_example
    assert reply is not None
    assert reply["subjects"] == session_subjects(str(reply["app"])).model_dump()


# ================================================================================================
# the error codes, from the handlers
# ================================================================================================
def _codes(*functions: Callable[..., object]) -> set[ErrorCode]:
    """The error codes the functions' source names."""
    found = set()
    for f in functions:
        found |= {ErrorCode[m] for m in re.findall(r"ErrorCode\.([A-Z_]+)", inspect.getsource(f))}
    return found


HANDLERS: list[tuple[str, list[Callable[..., object]]]] = [
    (subjects.session_open(USER), [PolicyEngine._on_open, PolicyEngine._answer, PolicyCore._open]),
    (subjects.app_request(APP), [PolicyEngine._on_request, PolicyEngine._check, PolicyEngine._answer,
                                 PolicyCore._app, PolicyCore._submit, PolicyCore._check_relation,
                                 PolicyCore._check_replaced, CoupledCores._too_large]),
    (subjects.app_done(APP), [PolicyEngine._on_done, PolicyEngine._check, PolicyEngine._answer, PolicyCore._app,
                              PolicyCore._done, CoupledCores.handle]),
    (subjects.app_close(APP), [PolicyEngine._on_close, PolicyEngine._check, PolicyEngine._answer,
                               PolicyCore._app, PolicyCore._close]),
    (subjects.app_heartbeat(APP), [PolicyEngine._on_heartbeat, PolicyEngine._check]),
    (subjects.AGENT_REGISTER, [NodeAllocatorService._on_register]),
    (subjects.AGENT_HEARTBEAT, [NodeAllocatorService._on_heartbeat]),
    (subjects.node_launch(NODE, USER), [Agent._on_launch, NodeBook.check_launch, runas.resolve, runas.launch_env,
                                        runas.check_cwd]),
    (subjects.node_exits(NODE, USER), [Agent._on_exits]),
    # (Agent._serve_node refuses what the services did not sign)
    (subjects.node_assign(NODE), [Agent._on_assign, NodeBook.assign, Agent._serve_node]),
    (subjects.node_kill(NODE), [Agent._on_kill, NodeBook.kill, Agent._serve_node]),
]


@pytest.mark.parametrize(("subject", "handlers"), HANDLERS, ids=[h[0] for h in HANDLERS])
def test_the_entry_lists_every_code_its_handler_can_answer(subject, handlers):
    answered = _codes(*handlers)
    listed = set(BY_SUBJECT[subject].errors)
    assert answered <= listed, f"{subject}: the handler can answer {sorted(answered - listed)}"


def test_the_code_check_reads_the_handlers():
    """The check above can fail: the launch handler's refusals are seen."""
    assert {ErrorCode.NOT_OWNER, ErrorCode.BAD_TOKEN} <= _codes(NodeBook.check_launch)
    assert ErrorCode.NOT_OWNER not in set(BY_SUBJECT[subjects.node_kill(NODE)].errors)


def test_the_table_is_a_pure_data_module():
    source = Path(endpoints.__file__).read_text()
    assert not re.search(r"^\s*(import|from)\s+(nats|redis|asyncio)\b", source, flags=re.M)


def test_a_union_member_without_its_tag_is_refused():
    """The document marks a discriminated union's tag REQUIRED although the model gives it a default."""
    text = DOC.read_text()
    assert re.search(r"^\| `kind` \| `\"capacity\"` \| REQUIRED \|", text, flags=re.M)
    decisions = _by_short("internal.decisions").example["decisions"]
    assert isinstance(decisions, list)
    _valid(AllocatorDecisions, {"decisions": decisions})
    untagged = [{k: v for k, v in d.items() if k != "kind"} for d in decisions]
    with pytest.raises(ValidationError):
        _valid(AllocatorDecisions, {"decisions": untagged})
