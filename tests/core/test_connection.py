"""The command line's light connection reader agrees with the settings every other command uses, and its fast
batch commands read their options as the full command line does."""

from __future__ import annotations

import getpass
import json

import pytest

from coorm.cli import fast
from coorm.shared.connection import Client, CredentialsError
from coorm.shared.credentials import CredentialStore, new_identity
from coorm.shared.endpoints import Role
from coorm.shared.protocol import BatchSubmit
from coorm.shared.settings import Settings

ME = getpass.getuser()


@pytest.fixture
def clean(monkeypatch, tmp_path):
    for var in ("COORM_NATS_URL", "COORM_NATS_CREDENTIALS", "COORM_NATS_SEED", "COORM_CREDENTIALS_DIR",
                "COORM_CONNECT_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "connection.json"))
    return tmp_path


def _agree() -> Client:
    client, settings = Client(), Settings()
    assert client.nats_url == settings.nats_url
    assert client.url_source == settings.source_of("nats_url")
    assert client.connect_timeout == settings.connect_timeout
    ident = settings.identity(Role.LAUNCHER)
    assert (client.user, client.seed) == ((ident.name, ident.seed) if ident else (ME, None))
    return client


def test_the_defaults(clean):
    assert _agree().seed is None


def test_the_connection_file_and_its_credential_store(clean, monkeypatch):
    store = CredentialStore(clean / "store").init(users=[ME])
    (clean / "connection.json").write_text(json.dumps({"nats_url": "nats://10.1.2.3:4333",
                                                       "credentials_dir": str(store.root)}))
    assert _agree().seed == store.user(ME).seed
    monkeypatch.setenv("COORM_NATS_URL", "nats://127.0.0.9:1")  # a variable wins over the file
    monkeypatch.setenv("COORM_CONNECT_TIMEOUT", "0.5")
    assert _agree().nats_url == "nats://127.0.0.9:1"


def test_an_identity_file_or_a_seed_in_the_environment(clean, monkeypatch):
    ident = new_identity("alice", Role.LAUNCHER)
    path = clean / "alice.json"
    path.write_text(ident.to_json())
    path.chmod(0o600)
    monkeypatch.setenv("COORM_NATS_CREDENTIALS", str(path))
    assert _agree().user == "alice"
    path.chmod(0o644)  # readable by others: refused, as ssh refuses a key
    with pytest.raises(CredentialsError, match="chmod 600"):
        Client()
    monkeypatch.delenv("COORM_NATS_CREDENTIALS")
    monkeypatch.setenv("COORM_NATS_SEED", ident.seed)
    assert _agree().seed == ident.seed


# -- the fast path's options ------------------------------------------------------------------------
@pytest.fixture
def sent(monkeypatch, tmp_path):
    """What the fast path would send (the request itself is the live tests')."""
    out: list[dict] = []
    monkeypatch.setattr(fast, "request", lambda verb, body, service, resend=False: out.append(body) or {"job": "7"})
    monkeypatch.chdir(tmp_path)
    return out


def test_batch_options_override_the_directives(sent, tmp_path, capsys):
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH -N 4 -t 30 -J from-script\n#COORM -c c1\necho $1\n")
    assert fast.run(["batch", "-N2", "--job-name=cli", "-a", "0-3%2", "job.sh", "x", "-N", "9"]) == 0
    (body,) = sent
    assert (body["nodes"], body["walltime"], body["name"], body["cluster"], body["array"]) == (2, 1800.0, "cli",
                                                                                              "c1", "0-3%2")
    assert body["argv"] == ["x", "-N", "9"] and body["script"].startswith("#!/bin/sh")
    assert body["cwd"] == str(tmp_path) and capsys.readouterr().out == "Submitted batch job 7\n"
    assert BatchSubmit.model_validate(body).submission  # its own id: sent again, it makes no second job
    assert fast.run(["batch", "job.sh"]) == 0
    assert sent[1]["submission"] != body["submission"]  # (a submission's own, not the command line's)


def test_submit_no_wait_queues_its_command(sent):
    assert fast.run(["submit", "--no-wait", "-c", "c0", "-N", "3", "-t", "1h", "--", "sh", "-c", "echo -N"]) == 0
    (body,) = sent
    assert (body["argv"], body["nodes"], body["walltime"], body["cluster"]) == (["sh", "-c", "echo -N"], 3,
                                                                                3600.0, "c0")
    assert "script" not in body


def test_what_the_fast_path_does_not_read_goes_to_the_full_command_line(sent):
    for argv in (["batch", "--help"], ["batch", "--mem", "4G", "job.sh"], ["submit", "--no-wait", "--bogus", "--",
                                                                          "true"], ["submit", "--help"],
                 ["submit", "--bogus", "--", "true"], ["submit", "-N", "0", "--", "true"], ["queue", "-t", "R"],
                 ["queue", "--json", "--bogus"], ["history", "-s", "CD"], ["history", "--since", "soonish"],
                 ["history", "--help"]):
        with pytest.raises(fast.Fallback):
            fast.run(argv)
    assert fast.run(["status"]) is None and fast.run(["nodes"]) is None
    assert sent == []


def test_a_wrapped_command_goes_as_a_command_line_not_as_a_script(sent):
    """``--wrap``: /bin/sh runs the line itself on the first node (no script file made and removed for it),
    its directives read as a script's would be."""
    assert fast.run(["batch", "-N", "2", "--wrap", "echo $COORM_JOB_ID; true"]) == 0
    (body,) = sent
    assert (body["wrap"], body["argv"], body["nodes"], body["name"]) == ("echo $COORM_JOB_ID; true", [], 2, "wrap")
    assert "script" not in body


def test_bad_values_are_refused_with_exit_2_before_anything_is_sent(sent):
    with pytest.raises(fast.Failed) as e:
        fast.run(["batch", "-t", "soon", "--wrap", "true"])
    assert e.value.code == 2 and "walltime" in str(e.value)
    with pytest.raises(fast.Failed) as e:
        fast.run(["batch", "--array", "0-3%0", "--wrap", "true"])
    assert e.value.code == 2
    with pytest.raises(fast.Failed):
        fast.run(["batch", "--wrap", "true", "job.sh"])  # both
    assert sent == []


@pytest.mark.parametrize("role", [Role.LAUNCHER, Role.SERVICE])
def test_the_fast_path_signs_the_server_s_nonce_as_nkeys_does(role):
    """The hot path's own Ed25519 signer and nkeys agree on the public key and the signature (Ed25519 is
    deterministic), for users' and services' seeds; a seed that is not one is refused, not mis-signed."""
    import base64
    import os

    import nkeys

    from coorm.shared.connection import sign_nonce

    for _ in range(20):
        seed = new_identity("alice", role).seed
        nonce = base64.urlsafe_b64encode(os.urandom(11)).rstrip(b"=")
        kp = nkeys.from_seed(seed.encode())
        assert sign_nonce(seed, nonce) == (kp.public_key.decode(), base64.b64encode(kp.sign(nonce)).decode())
    seed = new_identity("alice", role).seed
    flipped = seed[:10] + ("A" if seed[10] != "A" else "B") + seed[11:]  # (the CRC catches it)
    for bad in (flipped, "U" + seed[1:], "not a seed", seed[:20]):
        with pytest.raises(CredentialsError):
            sign_nonce(bad, b"nonce")


@pytest.mark.parametrize("url", ["nats://127.0.0.1:4222", "nats://host", "nats://u:p@h:42", "nats://u@h:1/",
                                 "nats://u:@h", "nats://a:b:c@h:7"])
def test_the_fast_path_reads_a_nats_url_as_urlsplit_does(url):
    from urllib.parse import urlsplit

    ours, theirs = fast._Url(url), urlsplit(url)
    assert (ours.hostname, ours.port, ours.username, ours.password) == (
        theirs.hostname, theirs.port or 4222, theirs.username, theirs.password)


def test_a_record_class_without_typing_is_a_named_tuple():
    from typing import NamedTuple as Typed

    from coorm.shared.records import NamedTuple as Light

    class A(Light):
        """doc"""

        x: int
        y: str = "y"

        def both(self) -> str:
            return f"{self.x}{self.y}"

    class B(Typed):
        x: int
        y: str = "y"

    a = A(1)
    assert a == B(1) and a._fields == B._fields and a._asdict() == B(1)._asdict()
    assert a._replace(y="z") == (1, "z") and a.both() == "1y" and A.__doc__ == "doc" and isinstance(a, tuple)
    assert not hasattr(a, "__dict__")
    import pickle

    from coorm.batch.jobscript import JobOptions

    options = JobOptions(nodes=2, time="1h")
    assert pickle.loads(pickle.dumps(options)) == options and options.merged(JobOptions(time="2h")).time == "2h"
    with pytest.raises(TypeError):
        class C(Light):
            x: int = 1
            y: int


def test_a_frame_cut_by_a_read_timeout_is_read_whole_on_the_next_call():
    """The attached submit reads with a short timeout (it looks at signals in between): a message whose
    bytes straddle a timeout must come whole on the next call, not be lost or misparsed."""
    import socket

    a, b = socket.socketpair()
    try:
        a.settimeout(0.05)
        conn = fast.Conn(a, "_INBOX.u.me", 0.0, "lost")
        b.sendall(b"PING\r\nMSG _INBOX.u.me.x 1 11\r\nhello")
        assert conn.frame() == ("PING", None)
        with pytest.raises(TimeoutError):
            conn.frame()  # the message's payload is not all there yet
        b.sendall(b" world\r\nHMSG s 2 _INBOX.r 12 14\r\nNATS/1.0\r\n\r\nok\r\n")
        assert conn.frame() == ("MSG _INBOX.u.me.x 1 11", b"hello world")
        assert conn.frame() == ("HMSG s 2 _INBOX.r 12 14", b"NATS/1.0\r\n\r\nok")
        b.close()
        with pytest.raises(ConnectionError):
            conn.frame()  # the server went away
    finally:
        a.close()
