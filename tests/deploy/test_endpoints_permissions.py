"""``deploy/nats/nats.conf`` grants each role what the endpoint table (:mod:`coorm.shared.endpoints`) says it
needs, and nothing else: read from the file, every allowed pattern must be one the table derives for the
role (or a grant the table records as knowingly broader, issue 12), and every pattern the table derives must
be allowed and not denied; replies go through ``allow_responses`` exactly where the role answers requests.
Then the real nats-server, running the file, is asked: each role may publish and subscribe to each subject
of the table exactly when the table grants it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from coorm.shared.endpoints import APP, BROADER_THAN_NEEDED, ENDPOINTS, NODE, REQUEST, STREAM, Role, permissions
from tests.deploy.test_nats_permissions import CONF, NatsWithUsers, _violation, client

ACTIONS = ("publish", "subscribe")


# ================================================================================================
# reading nats.conf
# ================================================================================================
_TOKEN = re.compile(r"""\s+|\#[^\n]*|//[^\n]*"""  # blanks and comments
                    r"""|(?P<p>[{}\[\],;=:])|"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<w>[^\s{}\[\],;=:#"']+)""")


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"cannot read nats.conf at {text[pos:pos + 40]!r}"
        pos = m.end()
        if m["p"]:
            out.append(("p", m["p"]))
        elif m["dq"] is not None or m["sq"] is not None:
            out.append(("s", m["dq"] if m["dq"] is not None else m["sq"]))
        elif m["w"]:
            out.append(("s", m["w"]))
    return out


class _Parser:
    """The part of the NATS configuration syntax the file uses: ``key = value`` / ``key: value`` /
    ``key { ... }``, maps, lists, quoted and bare strings, comments."""

    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def entries(self, end: str | None) -> dict[str, object]:
        out: dict[str, object] = {}
        while (tok := self.peek()) is not None and tok != ("p", end):
            if tok in (("p", ","), ("p", ";")):
                self.take()
                continue
            kind, key = self.take()
            assert kind == "s", f"a key expected, not {key!r}"
            if self.peek() in (("p", "="), ("p", ":")):
                self.take()
            out[key] = self.value()
        if end is not None:
            self.take()
        return out

    def value(self) -> object:
        kind, v = self.take()
        if (kind, v) == ("p", "{"):
            return self.entries("}")
        if (kind, v) == ("p", "["):
            items = []
            while self.peek() != ("p", "]"):
                if self.peek() == ("p", ","):
                    self.take()
                    continue
                items.append(self.value())
            self.take()
            return items
        assert kind == "s", f"a value expected, not {v!r}"
        return v


@dataclass(frozen=True)
class Granted:
    allow: dict[str, list[str]]  # action -> allowed patterns
    deny: dict[str, list[str]]
    responses: bool


def granted(text: str) -> dict[Role, Granted]:
    """Each role's permissions in the configuration text (``permissions: $VAR`` resolved)."""
    conf = _Parser(text).entries(None)
    auth = conf["authorization"]
    assert isinstance(auth, dict)
    out = {}
    for user in auth["users"]:
        perms = user["permissions"]
        if isinstance(perms, str) and perms.startswith("$"):
            perms = auth[perms[1:]]
        allow, deny = {}, {}
        for action in ACTIONS:
            spec = perms.get(action, [])
            spec = {"allow": spec} if isinstance(spec, list) else spec
            allow[action] = list(spec.get("allow", []))
            deny[action] = list(spec.get("deny", []))
        responses = perms.get("allow_responses", "false")
        out[Role(user["user"])] = Granted(allow, deny, responses not in ("false", False))
    return out


# ================================================================================================
# subject patterns
# ================================================================================================
def covers(q: str, p: str) -> bool:
    """Whether pattern ``q`` matches every subject pattern ``p`` matches."""
    qt, pt = q.split("."), p.split(".")
    for i, t in enumerate(qt):
        if t == ">":
            return len(pt) > i
        if i >= len(pt) or pt[i] == ">" or (t != "*" and (pt[i] == "*" or pt[i] != t)):
            return False
    return len(pt) == len(qt)


def overlaps(a: str, b: str) -> bool:
    """Whether some subject matches both patterns."""
    at, bt = a.split("."), b.split(".")
    for i in range(max(len(at), len(bt))):
        if i >= len(at) or i >= len(bt):
            return False
        x, y = at[i], bt[i]
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return True


def test_the_pattern_algebra():
    assert covers("coorm.v1.app.*.notify.>", "coorm.v1.app.*.notify.change")
    assert not covers("coorm.v1.app.*.notify.change", "coorm.v1.app.*.notify.>")
    assert covers("coorm.v1.>", "coorm.v1.app.a1.request") and not covers("coorm.v1.>", "coorm.v1")
    assert not covers("coorm.v1.node.c0n0.*", "coorm.v1.node.*.launch")
    assert overlaps("coorm.v1.node.*.kill", "coorm.v1.node.c0n0.*")
    assert not overlaps("coorm.v1.node.*.kill", "coorm.v1.node.*.launch")


# ================================================================================================
# the file against the table
# ================================================================================================
def problems(conf: dict[Role, Granted]) -> list[str]:
    """Every way the configuration and the table disagree."""
    out = []
    if set(conf) != set(Role):
        out.append(f"nats.conf has the users {sorted(conf)}, the table the roles {sorted(Role)}")
    for role, g in conf.items():
        need = permissions(role)
        broad = {(b.action, b.pattern) for b in BROADER_THAN_NEEDED if b.role is role}
        for action, needed in (("publish", need.publish), ("subscribe", need.subscribe)):
            for p in g.allow[action]:
                if not any(covers(n, p) for n in needed) and (action, p) not in broad:
                    out.append(f"{role}: nats.conf allows {action} on {p}, which the endpoint table does not grant")
            for n in needed:
                if not any(covers(p, n) for p in g.allow[action]):
                    out.append(f"{role}: the endpoint table grants {action} on {n}, which nats.conf does not allow")
                for d in g.deny[action]:
                    if overlaps(d, n):
                        out.append(f"{role}: nats.conf denies {action} on {d}, which the table grants ({n})")
        for action, pattern in broad:
            if pattern not in g.allow[action]:
                out.append(f"{role}: the table records a broad {action} grant on {pattern} that nats.conf lacks")
        if need.responses != g.responses:
            out.append(f"{role}: allow_responses is {g.responses} in nats.conf, the table says {need.responses}")
    return out


def test_nats_conf_grants_each_role_what_the_table_says():
    assert problems(granted(CONF.read_text())) == []


def _edit(old: str, new: str) -> str:
    text = CONF.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.mark.parametrize(("old", "new", "complaint"), [
    # a launcher allowed to read the services' internal subjects
    ('"coorm.v1.app.*.exited", "_INBOX.>"]', '"coorm.v1.app.*.exited", "coorm.v1.internal.>", "_INBOX.>"]',
     "launcher: nats.conf allows subscribe on coorm.v1.internal.>"),
    # the broad grant the services had before the table
    ('"coorm.v1.lifecycle", "coorm.v1.query.status", "$JS.>"]', '"coorm.v1.>", "$JS.>"]',
     "service: nats.conf allows publish on coorm.v1.>"),
    # a grant the table needs, taken away
    ('"coorm.v1.node.*.kill", "coorm.v1.agent.hello",', '"coorm.v1.node.*.kill",',
     "service: the endpoint table grants publish on coorm.v1.agent.hello"),
    # a needed grant denied
    ('deny = ["$JS.>", "coorm.v1.internal.>", "coorm.v1.agent.>", "coorm.v1.node.>"]',
     'deny = ["$JS.>", "coorm.v1.internal.>", "coorm.v1.agent.>", "coorm.v1.node.>", "coorm.v1.app.*.exited"]',
     "launcher: nats.conf denies subscribe on coorm.v1.app.*.exited"),
    # replies no longer allowed
    ("allow_responses = true\n  }\n\n  # launchers", "\n  }\n\n  # launchers",
     "agent: allow_responses is False"),
])
def test_the_permission_check_catches_a_disagreement(old, new, complaint):
    found = problems(granted(_edit(old, new)))
    assert any(p.startswith(complaint) for p in found), found


def test_a_broad_grant_the_conf_no_longer_makes_is_reported():
    """A recorded broad grant must be in the file (else the record is stale and must go)."""
    found = problems(granted(_edit('"coorm.v1.app.*.output.>", "coorm.v1.app.*.exited"]',
                                   '"coorm.v1.app.*.exited"]')))
    assert any("records a broad publish grant on coorm.v1.app.*.output.>" in p for p in found), found


# ================================================================================================
# the real server, running the file
# ================================================================================================
IDS = {APP: "a1", NODE: "c0n0", REQUEST: "a1.r.1", STREAM: "COORM_LIFECYCLE"}


def _concrete(subject: str) -> str:
    """A subject as a client uses it: ids for the placeholders (literal wildcards stay)."""
    return ".".join(IDS.get(t, t) for t in subject.split("."))


def _cases() -> list[tuple[Role, str, str, bool]]:
    """For each role and subject of the table: the publish and the subscription a client would make,
    and whether the table grants it."""
    out = []
    for role in Role:
        need = permissions(role)
        for e in ENDPOINTS:
            pub = _concrete(e.subject)
            out.append((role, "publish", pub, any(covers(n, pub) for n in need.publish)))
            sub = _concrete(e.subscribe_as or e.subject)
            out.append((role, "subscribe", sub, any(covers(n, sub) for n in need.subscribe)))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = NatsWithUsers(tmp_path_factory.mktemp("nats"))
    s.start()
    yield s
    s.stop()


async def _disagreements(server: NatsWithUsers) -> list[str]:
    """Each case the server decides otherwise than the table."""
    cases = _cases()
    wrong = []
    for role in Role:
        async with client(server.url(role.value)) as c:
            for _, action, subject, ok in (x for x in cases if x[0] is role):
                if action == "publish":
                    errors = await c.refused(lambda nc, s=subject: nc.publish(s, b"{}"))
                    refused = _violation(errors, "publish", subject)
                else:
                    errors = await c.refused(lambda nc, s=subject: nc.subscribe(s))
                    refused = _violation(errors, "subscription", subject)
                if refused == ok:
                    wrong.append(f"{role} {action} {subject}: the table {'grants' if ok else 'refuses'}, the "
                                 f"server {'refuses' if refused else 'allows'}")
    return wrong


def test_the_cases_ask_both_ways():
    cases = _cases()
    for role in Role:
        for action in ACTIONS:
            oks = {ok for r, a, _, ok in cases if r is role and a == action}
            assert oks == {True, False}, (role, action)


async def test_the_server_grants_each_role_exactly_what_the_table_grants(server):
    assert await _disagreements(server) == []


async def test_the_server_check_catches_a_broader_grant(tmp_path):
    """The check above can fail: a launcher allowed to read every application's requests (and their
    session tokens) is caught."""
    s = NatsWithUsers(tmp_path)
    s.conf.write_text(s.conf.read_text().replace('"coorm.v1.app.*.exited", "_INBOX.>"]',
                                                 '"coorm.v1.app.*.exited", "coorm.v1.app.*.request", "_INBOX.>"]'))
    s.start()
    try:
        wrong = await _disagreements(s)
    finally:
        s.stop()
    assert wrong == ["launcher subscribe coorm.v1.app.a1.request: the table refuses, the server allows"]
