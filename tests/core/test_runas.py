"""Under which identity, with which environment and in which directory a launch starts
(:mod:`coorm.node_agent.runas`): real users of this host (``root``, ``nobody``), real directories, and
real processes for the identity a child drops to."""

from __future__ import annotations

import fnmatch
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coorm.node_agent import runas
from coorm.node_agent.runas import LaunchRefused
from coorm.shared.events import ErrorCode

NOBODY = pwd.getpwnam("nobody")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="changing identity needs root")
COORM = {"COORM_NODE": "c0n0", "COORM_APP": "nobody.a1"}


def test_resolve_reads_the_user_s_account():
    run = runas.resolve("nobody", agent_uid=0)
    assert (run.uid, run.gid, run.home, run.shell) == (NOBODY.pw_uid, NOBODY.pw_gid, NOBODY.pw_dir, NOBODY.pw_shell)
    assert set(run.groups) == set(os.getgrouplist("nobody", NOBODY.pw_gid))
    root = runas.resolve("root", agent_uid=0)
    assert (root.uid, root.gid) == (0, 0) and root.dropper() is None  # nothing to change
    assert run.dropper() is not None


def test_an_unknown_user_is_refused():
    with pytest.raises(LaunchRefused) as e:
        runas.resolve("no_such_user_here", agent_uid=0)
    assert e.value.code is ErrorCode.UNKNOWN_USER


def test_an_agent_that_is_not_root_runs_its_own_user_only():
    with pytest.raises(LaunchRefused) as e:
        runas.resolve("root", agent_uid=NOBODY.pw_uid)
    assert e.value.code is ErrorCode.FORBIDDEN and "not root" in e.value.message
    own = runas.resolve("nobody", agent_uid=NOBODY.pw_uid)
    assert own.dropper() is None  # already that user: no change of identity attempted


# ================================================================================================
# the environment
# ================================================================================================
def test_the_environment_is_never_the_agent_s(monkeypatch):
    monkeypatch.setenv("COORM_TEST_AGENT_SECRET", "s3cret")
    run = runas.resolve("nobody", agent_uid=0)
    env = runas.launch_env(run, {"OMP_NUM_THREADS": "8", "HOME": "/scratch/me"}, deny=("LD_PRELOAD",),
                           coorm=COORM)
    assert "COORM_TEST_AGENT_SECRET" not in env
    assert env["USER"] == env["LOGNAME"] == "nobody" and env["SHELL"] == NOBODY.pw_shell
    assert env["PATH"] == runas.DEFAULT_PATH
    assert env["OMP_NUM_THREADS"] == "8" and env["HOME"] == "/scratch/me"  # what the user sent wins over the base
    assert {k: env[k] for k in COORM} == COORM


def test_the_user_cannot_override_the_job_s_own_variables():
    env = runas.launch_env(runas.resolve("nobody", agent_uid=0), {"COORM_APP": "root.a9"}, deny=(), coorm=COORM)
    assert env["COORM_APP"] == "nobody.a1"


def test_variables_the_operator_denies_refuse_the_launch():
    run = runas.resolve("nobody", agent_uid=0)
    for name in ("LD_PRELOAD", "LD_AUDIT"):
        with pytest.raises(LaunchRefused) as e:
            runas.launch_env(run, {name: "/tmp/evil.so"}, deny=("LD_PRELOAD", "LD_AUDIT"), coorm=COORM)
        assert e.value.code is ErrorCode.FORBIDDEN and name in e.value.message
    with pytest.raises(LaunchRefused):
        runas.launch_env(run, {"LD_DEBUG": "all"}, deny=("LD_*",), coorm=COORM)  # patterns
    assert runas.launch_env(run, {"LD_PRELOAD": "x.so"}, deny=(), coorm=COORM)["LD_PRELOAD"] == "x.so"


@pytest.mark.parametrize(("name", "value"), [("", "x"), ("A=B", "x"), ("A\x00", "x"), ("A", "x\x00y")])
def test_what_is_no_environment_variable_is_refused(name, value):
    with pytest.raises(LaunchRefused) as e:
        runas.launch_env(runas.resolve("nobody", agent_uid=0), {name: value}, deny=(), coorm=COORM)
    assert e.value.code is ErrorCode.BAD_REQUEST


NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="="), min_size=1,
                max_size=12)


@given(requested=st.dictionaries(NAMES, st.text(st.characters(blacklist_characters="\x00"), max_size=8),
                                 max_size=8),
       deny=st.lists(st.sampled_from(["LD_*", "A*", "*X", "PATH", "Q?"]), max_size=3))
def test_the_environment_holds_what_it_must_and_nothing_else(requested, deny):
    run = runas.resolve("nobody", agent_uid=0)
    try:
        env = runas.launch_env(run, requested, deny=deny, coorm=COORM)
    except LaunchRefused as e:
        assert e.code is ErrorCode.FORBIDDEN
        assert any(fnmatch.fnmatchcase(k, p) for k in requested if k not in COORM for p in deny)
        return
    assert not any(fnmatch.fnmatchcase(k, p) for k in requested if k not in COORM for p in deny)
    assert {k: env[k] for k in COORM} == COORM
    base = {"HOME", "USER", "LOGNAME", "SHELL", "PATH"}
    assert set(env) == base | set(requested) | set(COORM)


# ================================================================================================
# the working directory
# ================================================================================================
@pytest.fixture
def tree() -> Iterator[Path]:
    """A directory under /tmp that anyone may enter (pytest's tmp_path is under a 0700 directory)."""
    top = Path(tempfile.mkdtemp(dir="/tmp", prefix="coorm-runas-"))
    top.chmod(0o711)
    try:
        yield top
    finally:
        shutil.rmtree(top)


@AS_ROOT
def test_a_directory_closed_to_the_user_is_refused_and_open_ones_accepted(tree):
    nobody, root = runas.resolve("nobody", agent_uid=0), runas.resolve("root", agent_uid=0)
    closed = tree / "closed"
    closed.mkdir(mode=0o700)
    (closed / "inner").mkdir(mode=0o755)
    with pytest.raises(LaunchRefused) as e:
        runas.check_cwd(nobody, str(closed / "inner"))  # a closed parent closes what is under it
    assert e.value.code is ErrorCode.BAD_CWD and str(closed) in e.value.message
    assert runas.check_cwd(root, str(closed)) == str(closed)
    opened = tree / "open"
    opened.mkdir()
    opened.chmod(0o755)
    assert runas.check_cwd(nobody, str(opened)) == str(opened)
    # through the group: the directory is the nobody group's, closed to others
    team = tree / "team"
    team.mkdir()
    os.chown(team, 0, NOBODY.pw_gid)
    team.chmod(0o770)
    assert runas.check_cwd(nobody, str(team)) == str(team)
    os.chown(team, 0, grp.getgrnam("root").gr_gid)
    with pytest.raises(LaunchRefused):
        runas.check_cwd(nobody, str(team))
    # a symbolic link is followed: it cannot lead into what the user may not enter
    (tree / "link").symlink_to(closed)
    with pytest.raises(LaunchRefused):
        runas.check_cwd(nobody, str(tree / "link"))


def test_what_is_no_directory_is_refused(tree):
    run = runas.resolve("root", agent_uid=0)
    (tree / "file").write_text("x")
    for cwd, code in ((str(tree / "file"), ErrorCode.BAD_CWD), (str(tree / "missing"), ErrorCode.BAD_CWD),
                      ("relative/dir", ErrorCode.BAD_REQUEST)):
        with pytest.raises(LaunchRefused) as e:
            runas.check_cwd(run, cwd)
        assert e.value.code is code, cwd


def test_the_default_is_the_home_or_else_the_root():
    assert runas.check_cwd(runas.resolve("root", agent_uid=0), None) == pwd.getpwnam("root").pw_dir
    assert runas.check_cwd(runas.resolve("nobody", agent_uid=0), None) == "/"  # /nonexistent does not exist


# ================================================================================================
# the child's identity
# ================================================================================================
@AS_ROOT
def test_the_child_runs_as_the_user_with_the_user_s_groups(tree):
    run = runas.resolve("nobody", agent_uid=0)
    env = runas.launch_env(run, {}, deny=(), coorm=COORM)
    out = subprocess.run(["/usr/bin/id", "-u", "-n"], env=env, cwd=runas.check_cwd(run, str(tree)),
                         preexec_fn=runas.chain(run.dropper()), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "nobody"
    ids = subprocess.run(["/bin/sh", "-c", "id -u; id -g; id -G"], env=env, cwd="/",
                         preexec_fn=runas.chain(run.dropper()), capture_output=True, text=True, check=True)
    uid, gid, groups = ids.stdout.split("\n")[:3]
    assert (int(uid), int(gid)) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert {int(g) for g in groups.split()} == set(run.groups) | {run.gid}
    assert 0 not in {int(g) for g in groups.split()}  # root's groups are gone


def test_chain_runs_its_steps_in_order_and_drops_the_nones():
    seen: list[int] = []
    step = runas.chain(None, lambda: seen.append(1), None, lambda: seen.append(2))
    assert step is not None
    step()
    assert seen == [1, 2]
    assert runas.chain(None, None) is None


# ================================================================================================
# output files: opened by the child, as the user
# ================================================================================================
def _run_to_files(run: runas.RunAs, files: runas.OutputFiles, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", script], env=runas.launch_env(run, {}, deny=(), coorm=COORM), cwd="/",
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          preexec_fn=runas.chain(run.dropper(), files.opener()), check=True)


@AS_ROOT
def test_output_files_are_the_user_s_own(tree):
    run = runas.resolve("nobody", agent_uid=0)
    home = tree / "home"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    with runas.OutputFiles(str(home / "out.txt"), None) as files:
        _run_to_files(run, files, "id -u; echo err >&2")
    assert (home / "out.txt").read_text() == f"{NOBODY.pw_uid}\nerr\n"
    st = (home / "out.txt").stat()
    assert (st.st_uid, st.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)  # created by the user, not by root
    assert st.st_mode & 0o777 == 0o644 & ~_umask()
    with runas.OutputFiles(str(home / "o"), str(home / "e"), append=False) as files:
        _run_to_files(run, files, "echo out; echo err >&2")
    assert ((home / "o").read_text(), (home / "e").read_text()) == ("out\n", "err\n")
    # stdout published (not a file), stderr to a file
    with runas.OutputFiles(None, str(home / "e2")) as files:
        out = subprocess.run(["/bin/sh", "-c", "echo out; echo err >&2"], cwd="/", capture_output=True, text=True,
                             preexec_fn=runas.chain(run.dropper(), files.opener()), check=True)
    assert out.stdout == "out\n" and out.stderr == "" and (home / "e2").read_text() == "err\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@AS_ROOT
def test_an_output_file_the_user_may_not_write_fails_in_the_child_and_says_why(tree):
    """The agent is root: a check in the agent would pass. The child opens the file after dropping to the
    user, fails, and the agent learns the path and the reason through the pipe."""
    run = runas.resolve("nobody", agent_uid=0)
    closed = tree / "closed"
    closed.mkdir(mode=0o700)
    precious = tree / "passwd"
    precious.write_text("root:x:0:0\n")
    precious.chmod(0o644)
    home = tree / "home"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    link = home / "out.txt"
    link.symlink_to(precious)
    os.lchown(link, NOBODY.pw_uid, NOBODY.pw_gid)
    marker = home / "started"
    for target, append in ((closed / "out.txt", True), (precious, False), (link, False), (link, True)):
        with runas.OutputFiles(str(target), None, append=append) as files:
            with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
                _run_to_files(run, files, f"touch {marker}")
            why = files.refusal("nobody")
        assert why == f"nobody cannot write the output to {target}: Permission denied", why
    assert precious.read_text() == "root:x:0:0\n" and not marker.exists() and not (closed / "out.txt").exists()
    # the second file too: stderr's
    with runas.OutputFiles(str(home / "fine.txt"), str(closed / "err.txt")) as files:
        with pytest.raises(subprocess.SubprocessError):
            _run_to_files(run, files, f"touch {marker}")
        assert files.refusal("nobody") == f"nobody cannot write the output to {closed / 'err.txt'}: Permission denied"
    # a child that failed for another reason: no word from the files
    with runas.OutputFiles(str(home / "fine.txt"), None) as files:
        with pytest.raises(subprocess.SubprocessError):
            subprocess.run(["true"], preexec_fn=runas.chain(_fail, files.opener()), check=True)
        assert files.refusal("nobody") is None
    assert not marker.exists()


def _fail() -> None:
    raise RuntimeError("another step failed")


def test_a_missing_directory_is_named():
    root = runas.resolve("root", agent_uid=0)
    with runas.OutputFiles("/nonexistent-coorm/out.txt", None) as files:
        with pytest.raises(subprocess.SubprocessError):
            _run_to_files(root, files, "true")
        assert files.refusal("root") == "root cannot write the output to /nonexistent-coorm/out.txt: " \
                                        "No such file or directory"


def test_output_files_need_a_file():
    with pytest.raises(ValueError):
        runas.OutputFiles(None, None)
