"""The NATS users a credential store generates (``nats-auth.conf``, :func:`coorm.shared.credentials.
nats_authorization`, which ``deploy/nats/nats.conf`` includes) grant each identity what the endpoint table
(:mod:`coorm.shared.endpoints`) says its role needs, and nothing else: read from the generated file, every
allowed pattern must be one the table derives for the identity -- a user's scoped to that user -- and every
pattern the table derives must be allowed and not denied; replies go through ``allow_responses`` exactly
where the role answers requests; and nats.conf itself defines no user. Then the real nats-server, running
the file, is asked: each identity may publish and subscribe to each subject of the table, for its own user
and for another, exactly when the table grants it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from coorm.shared.credentials import CredentialStore
from coorm.shared.endpoints import (
    APP,
    BROADER_THAN_NEEDED,
    ENDPOINTS,
    NODE,
    REQUEST,
    STREAM,
    USER,
    Permissions,
    Role,
    nats_pattern,
    permissions,
)
from tests.deploy.natsserver import CONF, NatsWithStore, client, include_of

ACTIONS = ("publish", "subscribe")
USERS = ("alice", "bob")


# ================================================================================================
# reading NATS configuration files
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


def parse(text: str) -> dict[str, object]:
    return _Parser(text).entries(None)


def who(role: Role, user: str | None) -> str:
    """How an identity is named in the checks' messages: ``service``, ``agent``, ``launcher alice``."""
    return role.value if user is None else f"{role.value} {user}"


def identities(store: CredentialStore) -> dict[str, tuple[Role, str | None]]:
    """Each public key of the store, and whose it is."""
    return {i.public_key: (i.role, i.name if i.role is Role.LAUNCHER else None) for i in store.identities()}


def granted(text: str, keys: dict[str, tuple[Role, str | None]]) -> dict[str, Granted]:
    """Each user's permissions in the authorization text, by :func:`who` (an nkey the store does not have
    comes out as ``unknown <key>``)."""
    auth = parse(text)["authorization"]
    assert isinstance(auth, dict)
    out = {}
    for user in auth["users"]:
        perms = user.get("permissions", {})
        allow, deny = {}, {}
        for action in ACTIONS:
            spec = perms.get(action, [])
            spec = {"allow": spec} if isinstance(spec, list) else spec
            allow[action] = list(spec.get("allow", []))
            deny[action] = list(spec.get("deny", []))
        responses = perms.get("allow_responses", "false")
        key = user.get("nkey") or f"user {user.get('user')}"
        name = who(*keys[key]) if key in keys else f"unknown {key}"
        out[name] = Granted(allow, deny, responses not in ("false", False))
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
# nats.conf defines no user: its users are the store's
# ================================================================================================
def test_nats_conf_has_no_users_of_its_own():
    conf = parse(re.sub(r'(?m)^\s*include\s.*$', "", CONF.read_text()))
    for key in ("authorization", "accounts", "no_auth_user", "users", "operator", "resolver", "leafnodes"):
        assert key not in conf, f"{CONF} sets {key}: its users must be the generated ones only"
    assert include_of(CONF.read_text()).endswith("/" + CredentialStore(CONF.parent).nats_auth_path.name)


# ================================================================================================
# the generated file against the table
# ================================================================================================
def expected(store: CredentialStore) -> dict[str, Permissions]:
    return {who(role, user): permissions(role, user) for role, user in identities(store).values()}


def problems(conf: dict[str, Granted], need_of: dict[str, Permissions]) -> list[str]:
    """Every way the configuration and the table disagree."""
    out = []
    if set(conf) != set(need_of):
        out.append(f"the file has the users {sorted(conf)}, the store the identities {sorted(need_of)}")
    for name, g in conf.items():
        if name not in need_of:
            continue
        need = need_of[name]
        role = Role(name.split()[0])
        broad = {(b.action, b.pattern) for b in BROADER_THAN_NEEDED if b.role is role}
        for action, needed in (("publish", need.publish), ("subscribe", need.subscribe)):
            for p in g.allow[action]:
                if not any(covers(n, p) for n in needed) and (action, p) not in broad:
                    out.append(f"{name}: the file allows {action} on {p}, which the endpoint table does not grant")
            for n in needed:
                if not any(covers(p, n) for p in g.allow[action]):
                    out.append(f"{name}: the endpoint table grants {action} on {n}, which the file does not allow")
                for d in g.deny[action]:
                    if overlaps(d, n):
                        out.append(f"{name}: the file denies {action} on {d}, which the table grants ({n})")
        for action, pattern in broad:
            if pattern not in g.allow[action]:
                out.append(f"{name}: the table records a broad {action} grant on {pattern} that the file lacks")
        if need.responses != g.responses:
            out.append(f"{name}: allow_responses is {g.responses} in the file, the table says {need.responses}")
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> CredentialStore:
    return CredentialStore(tmp_path_factory.mktemp("store") / "credentials").init(users=USERS)


def test_the_generated_users_have_what_the_table_grants(store):
    assert problems(granted(store.nats_auth_path.read_text(), identities(store)), expected(store)) == []


def test_a_user_s_grants_name_the_user_only(store):
    """Every subject a user may publish or read names that user, or is one every user shares (the cluster
    information, the status query, the batch queue's query, the system's stopping)."""
    shared = {"coorm.v1.clusters.info", "coorm.v1.clusters.interinfo", "coorm.v1.query.status",
              "coorm.v1.system.stopping", "coorm.v1.batch.query"}
    for name, g in granted(store.nats_auth_path.read_text(), identities(store)).items():
        if not name.startswith("launcher "):
            continue
        user = name.split()[1]
        for action in ACTIONS:
            for p in g.allow[action]:
                assert p in shared or user in p.split("."), f"{name} may {action} on {p}"
                assert not any(other in p.split(".") for other in USERS if other != user), (name, p)


def _edit(text: str, store: CredentialStore, name: str, change: Callable[[dict], None]) -> str:
    """The file with one identity's entry changed (``change`` edits its JSON)."""
    keys = {who(*v): k for k, v in identities(store).items()}
    lines = text.splitlines()
    (i,) = [i for i, line in enumerate(lines) if f'"{keys[name]}"' in line]
    entry = json.loads(lines[i])
    change(entry)
    lines[i] = "    " + json.dumps(entry)
    return "\n".join(lines) + "\n"


def _allow(action: str, pattern: str):
    return lambda e: e["permissions"][action]["allow"].append(pattern)


def _disallow(action: str, pattern: str):
    return lambda e: e["permissions"][action]["allow"].remove(pattern)


def _deny(action: str, pattern: str):
    return lambda e: e["permissions"][action].setdefault("deny", []).append(pattern)


@pytest.mark.parametrize(("name", "change", "complaint"), [
    # a user allowed to open sessions as another
    ("launcher alice", _allow("publish", "coorm.v1.session.open.bob"),
     "launcher alice: the file allows publish on coorm.v1.session.open.bob"),
    # a user allowed to read every user's notifications
    ("launcher alice", _allow("subscribe", "coorm.v1.app.*.*.notify.change"),
     "launcher alice: the file allows subscribe on coorm.v1.app.*.*.notify.change"),
    # a user allowed to read the services' replies
    ("launcher bob", _allow("subscribe", "_INBOX.service.>"),
     "launcher bob: the file allows subscribe on _INBOX.service.>"),
    # the broad grant the services had before the table
    ("service", _allow("publish", "coorm.v1.>"), "service: the file allows publish on coorm.v1.>"),
    # a grant the table needs, taken away
    ("service", _disallow("publish", "coorm.v1.agent.hello"),
     "service: the endpoint table grants publish on coorm.v1.agent.hello"),
    # a needed grant denied
    ("launcher alice", _deny("subscribe", "coorm.v1.app.*.*.exited"),
     "launcher alice: the file denies subscribe on coorm.v1.app.*.*.exited"),
    # replies no longer allowed
    ("agent", lambda e: e["permissions"].pop("allow_responses"), "agent: allow_responses is False"),
])
def test_the_permission_check_catches_a_disagreement(store, name, change, complaint):
    text = _edit(store.nats_auth_path.read_text(), store, name, change)
    found = problems(granted(text, identities(store)), expected(store))
    assert any(p.startswith(complaint) for p in found), found


def test_a_broad_grant_the_file_no_longer_makes_is_reported(store):
    """A recorded broad grant must be in the file (else the record is stale and must go)."""
    output = nats_pattern(f"coorm.v1.app.{APP}.output.{REQUEST}")
    text = _edit(store.nats_auth_path.read_text(), store, "agent", _disallow("publish", output))
    found = problems(granted(text, identities(store)), expected(store))
    assert any(f"records a broad publish grant on {output}" in p for p in found), found


def test_an_identity_the_store_does_not_have_is_reported(store):
    text = store.nats_auth_path.read_text().replace("users = [", 'users = [\n    {"user": "launcher", '
                                                    '"password": "x", "permissions": {}}', 1)
    found = problems(granted(text, identities(store)), expected(store))
    assert any("unknown user launcher" in p for p in found), found


# ================================================================================================
# the real server, running the file
# ================================================================================================
def _ids(user: str) -> dict[str, str]:
    return {USER: user, "<app>": "a1", NODE: "c0n0", REQUEST: f"{user}.a1.r.1", STREAM: "COORM_LIFECYCLE"}


def _concrete(subject: str, user: str) -> str:
    """A subject as a client uses it, for ``user``'s application: ids for the placeholders (literal
    wildcards stay)."""
    ids = _ids(user)
    return ".".join(ids.get(t, t) for t in subject.split("."))


IDENTITIES = ("service", "agent", "alice")


def _role(name: str) -> tuple[Role, str | None]:
    return (Role(name), None) if name in ("service", "agent") else (Role.LAUNCHER, name)


def _cases() -> list[tuple[str, str, str, bool]]:
    """For each identity and subject of the table, for alice's application and bob's: the publish and the
    subscriptions a client would make (a concrete one, and the wildcard the services subscribe with), and
    whether the table grants it."""
    out = []
    for name in IDENTITIES:
        need = permissions(*_role(name))
        for e in ENDPOINTS:
            subs = {nats_pattern(e.subscribe_as or e.subject)}
            pubs = set()
            for user in USERS:
                pubs.add(_concrete(e.subject, user))
                subs.add(_concrete(e.subscribe_as or e.subject, user))
            for pub in sorted(pubs):
                out.append((name, "publish", pub, any(covers(n, pub) for n in need.publish)))
            for sub in sorted(subs):
                out.append((name, "subscribe", sub, any(covers(n, sub) for n in need.subscribe)))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = NatsWithStore(tmp_path_factory.mktemp("nats"), users=USERS)
    s.start()
    yield s
    s.stop()


async def _disagreements(server: NatsWithStore) -> list[str]:
    """Each case the server decides otherwise than the table."""
    cases = _cases()
    wrong = []
    for name in IDENTITIES:
        async with client(server.url, server.identity(name)) as c:
            for _, action, subject, ok in (x for x in cases if x[0] == name):
                allowed = await c.may(action, subject)
                if allowed != ok:
                    wrong.append(f"{who(*_role(name))} {action} {subject}: the table {'grants' if ok else 'refuses'}, "
                                 f"the server {'allows' if allowed else 'refuses'}")
    return wrong


def test_the_cases_ask_both_ways():
    cases = _cases()
    for name in IDENTITIES:
        for action in ACTIONS:
            oks = {ok for n, a, _, ok in cases if n == name and a == action}
            assert oks == {True, False}, (name, action)
    # and a user is asked about another's subjects, which the table refuses
    assert any(n == "alice" and ".bob." in s and not ok for n, _, s, ok in cases)


async def test_the_server_grants_each_identity_exactly_what_the_table_grants(server):
    assert await _disagreements(server) == []


async def test_the_server_check_catches_a_broader_grant(tmp_path):
    """The check above can fail: a user allowed to read every application's requests (and their session
    tokens) is caught."""
    s = NatsWithStore(tmp_path, users=USERS)
    path = s.store.nats_auth_path
    path.write_text(_edit(path.read_text(), s.store, "launcher alice", _allow("subscribe", "coorm.v1.app.*.*.request")))
    s.start()
    try:
        wrong = await _disagreements(s)
    finally:
        s.stop()
    assert sorted(wrong) == [
        f"launcher alice subscribe {sub}: the table refuses, the server allows"
        for sub in ("coorm.v1.app.*.*.request", "coorm.v1.app.alice.a1.request", "coorm.v1.app.bob.a1.request")]
