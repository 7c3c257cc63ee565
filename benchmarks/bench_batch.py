"""CooRM's batch queue beside Slurm, in the same run, on this machine, on the same workloads.

Slurm is the private 64-node cluster of ``/work/shared/peers/slurm`` (copied to ``--slurm-dir``, installed
with its ``install.sh`` if ``slurmctld`` is missing, started with ``./start.sh multi 64``, stopped with
``./stop.sh``); its measurements are the functions of its ``bench.py``, imported from the copy. CooRM is
``coorm up --clusters c0=64`` started here as a child (a session of its own) and stopped with SIGTERM; every
``coorm`` command finds it through ``COORM_CONNECTION_FILE``. Each test runs on Slurm, then on CooRM, then
the next test; each system is started and stopped once.

Tests (``--tests``, default all but queued10k):

* latency    -- sbatch / ``coorm batch --wrap`` submit -> job script start, idle cluster, n=20;
* srun       -- ``srun -N1 date`` / ``coorm submit -N 1 -- date`` submit -> task start, n=20;
* cmdtime    -- the wall time of ``sbatch --wrap true`` / ``coorm batch --wrap true`` (and of
  ``coorm submit --no-wait true``), n=20;
* throughput -- 1000 one-node ``true`` jobs from 4 parallel submitters, first submit -> all completed; the
  submitting clients' CPU time; the peak RSS of each system's processes (sampled once a second);
* array      -- one 1000-task array of ``true``, submit -> all completed;
* backfill   -- ``make_workload(200, 64, 5, 42)``: 200 jobs queued in the workload's order, then let go at once
  (Slurm: its partition DOWN, then UP; CooRM: ``coorm batch -H``, then ``coorm release -n TAG``); makespan and
  waits against the ideal conservative backfill of ``bench.sim_conservative``. A job's start and end are the
  first and last ``date`` its output file holds;
* queued10k  -- 10,000 held jobs (an array of 9,900 + 100 singles): the wall time of ``coorm queue``
  (``squeue``) and the whole system's RSS, then everything cancelled.

Targets (issue 13) are printed next to the figures, met or not. The users' commands (``coorm batch``,
``submit``, ``queue``...) run from a client install of this checkout, as README tells login-node users to
install it (``--client-venv``, kept between runs; the checkout is installed again each run); ``--dev-client``
runs them from the development venv instead (editable, server extras: about 30 ms more per command).

    python benchmarks/bench_batch.py --quick --no-slurm          # CooRM only, a fast check (~5 min)
    python benchmarks/bench_batch.py --quick                     # both, fewer jobs (~15 min)
    python benchmarks/bench_batch.py --out batch.json            # the full run (~40 min)
    python benchmarks/bench_batch.py --tests queued10k --no-slurm
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import importlib
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

PEER_SRC = Path("/work/shared/peers/slurm")
NODES = 64
DEFAULT_TESTS = ["latency", "srun", "cmdtime", "throughput", "array", "backfill"]
ALL_TESTS = DEFAULT_TESTS + ["queued10k"]
ENDED = {"completed", "failed", "timeout", "cancelled", "node_fail"}


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def cpu_s(ru) -> float:
    return ru.ru_utime + ru.ru_stime


class CommandFailed(RuntimeError):
    def __init__(self, cmd: list[str], r: subprocess.CompletedProcess) -> None:
        super().__init__(f"`{' '.join(cmd)}` exited {r.returncode}\nstdout: {r.stdout.strip()[-2000:]}\n"
                         f"stderr: {r.stderr.strip()[-2000:]}")


# ------------------------------------------------------------------------------------------ processes, RSS
def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, starttime) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime (field 22)
        out[int(d)] = (int(rest[1]), int(rest[19]))
    return out


def descendants(root: int) -> dict[int, int]:
    """root and its descendants: pid -> starttime."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        if p in table:
            out[p] = table[p][1]
            todo += children.get(p, [])
    return out


def vmrss_kb(pid: int) -> tuple[int, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            txt = f.read()
    except OSError:
        return 0, ""
    m = re.search(r"^VmRSS:\s+(\d+) kB", txt, re.M)
    n = re.search(r"^Name:\s+(\S+)", txt, re.M)
    return (int(m.group(1)) if m else 0), (n.group(1) if n else "?")


def rss_of(pids) -> tuple[int, dict[str, int]]:
    total, by_name = 0, {}
    for p in pids:
        kb, name = vmrss_kb(p)
        total += kb
        if kb:
            by_name[name] = by_name.get(name, 0) + kb
    return total, by_name


class RssSampler:
    """Sums VmRSS over pids_fn() once a second in a thread; keeps the peak."""

    def __init__(self, pids_fn) -> None:
        self.pids_fn, self.peak_kb, self.peak_by_name, self.samples = pids_fn, 0, {}, 0
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop_ev.is_set():
            with contextlib.suppress(Exception):
                kb, by = rss_of(self.pids_fn())
                self.samples += 1
                if kb > self.peak_kb:
                    self.peak_kb, self.peak_by_name = kb, by
            self.stop_ev.wait(1.0)

    def __enter__(self) -> RssSampler:
        self.th.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_ev.set()
        self.th.join(5)

    def result(self) -> dict:
        return {"peak_rss_mb": round(self.peak_kb / 1024, 1), "samples": self.samples,
                "peak_by_process_mb": {k: round(v / 1024, 1) for k, v in sorted(self.peak_by_name.items())}}


# ------------------------------------------------------------------------------------------------ Slurm side
class Slurm:
    def __init__(self, d: Path) -> None:
        self.dir, self.started = d, False

    def prepare(self) -> None:
        if not self.dir.exists():
            log(f"copying {PEER_SRC} to {self.dir}")
            shutil.copytree(PEER_SRC, self.dir)
        if shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists():
            log("slurmctld not found: running install.sh (apt)")
            subprocess.run(["./install.sh"], cwd=self.dir, check=True, timeout=1800)

    def start(self) -> None:
        self.started = True  # stop.sh even if start.sh fails half-way (it stops only what it recorded)
        log(f"starting Slurm: {self.dir}/start.sh multi {NODES}")
        r = subprocess.run(["./start.sh", "multi", str(NODES)], cwd=self.dir, capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            raise CommandFailed(["./start.sh", "multi", str(NODES)], r)
        os.environ["SLURM_CONF"] = str(self.dir / "slurm.conf")  # what env.sh exports for bench.sh

    def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        log("stopping Slurm (stop.sh)")
        r = subprocess.run(["./stop.sh"], cwd=self.dir, capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or "note:" in r.stdout:
            log(f"stop.sh: rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()}")

    def pids(self) -> list[int]:
        out = []
        for f in (self.dir / "run" / "pids").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                out.append(int(f.read_text().strip()))
        return out

    def cleanup_jobs(self, b: ModuleType) -> None:
        with contextlib.suppress(Exception):
            b.run(["scancel", "--user", getpass.getuser()], timeout=30)
            time.sleep(2)


def load_bench(d: Path) -> ModuleType:
    """Slurm's bench.py from d (it reads d/run/mode and d/run/nnodes when imported)."""
    sys.path.insert(0, str(d))
    b = importlib.import_module("bench")
    b.log = log  # its progress lines to stderr with ours: stdout is for the table
    os.makedirs(b.OUT, exist_ok=True)
    return b


def stub_bench(base: Path) -> ModuleType:
    """bench.py for its workload and simulators only (--no-slurm): a copy beside a run/ it can read."""
    d = base / "slurm-bench"
    (d / "run").mkdir(parents=True)
    shutil.copy(PEER_SRC / "bench.py", d / "bench.py")
    (d / "run" / "mode").write_text("multi\n")
    (d / "run" / "nnodes").write_text(f"{NODES}\n")
    return load_bench(d)


def slurm_cmdtime(b, n: int) -> dict:
    """sbatch's own wall time for a `--wrap true` job, the way bench.submit runs it."""
    xs = []
    for i in range(n):
        t0 = time.time()
        b.submit(b.res_args(1) + ["-J", f"cmd{i}", "-o", "/dev/null", "-e", "/dev/null", "--wrap", "true"])
        xs.append(time.time() - t0)
        time.sleep(0.1)
    time.sleep(3)  # let the trivial jobs end before the next test
    return {"batch_cmd_wall_s": b.pstats(xs), "samples_s": [round(x, 4) for x in xs]}


def slurm_queued(b, slurm: Slurm, n: int, par: int) -> dict:
    """n held jobs (sbatch -H; the default MaxArraySize of 1001 rules out one array), then squeue's time."""
    args = b.res_args(1) + ["-H", "-o", "/dev/null", "-e", "/dev/null", "--wrap", "true"]
    t0 = time.time()
    fails = []

    def one(i: int) -> None:
        try:
            b.submit(["-J", f"q{i}"] + args)
        except Exception as e:  # noqa: BLE001 - counted and reported
            fails.append(str(e))
    with ThreadPoolExecutor(par) as ex:
        list(ex.map(one, range(n)))
    res = {"jobs": n, "submit_wall_s": time.time() - t0, "submit_failures": len(fails), "first_failures": fails[:3]}
    res.update(time_queue_cmd(lambda: b.run([b.SQUEUE], timeout=120)))
    res["rss"] = {"total_mb": round(rss_of(slurm.pids())[0] / 1024, 1),
                  "by_process_mb": {k: round(v / 1024, 1) for k, v in rss_of(slurm.pids())[1].items()}}
    t = time.time()
    b.run(["scancel", "--user", getpass.getuser()], timeout=300)
    res["cancel_wall_s"] = time.time() - t
    time.sleep(3)
    return res


def time_queue_cmd(fn, reps: int = 5) -> dict:
    """fn() run reps times: its wall times, and how it failed if it did (the figure then stands for nothing)."""
    xs, lines, rcs, err = [], 0, [], None
    for _ in range(reps):
        t = time.time()
        r = fn()
        xs.append(time.time() - t)
        rcs.append(r.returncode)
        lines = len(r.stdout.splitlines())
        if r.returncode != 0 and err is None:
            err = f"exited {r.returncode}: {r.stderr.strip()[-300:]}"
    out = {"queue_cmd_wall_s": {"median": statistics.median(xs), "max": max(xs), "samples": xs},
           "queue_cmd_lines": lines, "queue_cmd_rcs": rcs}
    if err:
        out["queue_cmd_error"] = err
    return out


# ------------------------------------------------------------------------------------------------ CooRM side
REPO = Path(__file__).resolve().parents[1]


def system_python() -> str:
    """The interpreter a login node's user has: the distribution's ``python3`` when it is recent enough for
    CooRM (3.11), else this one. Which one matters: a command's CPU is mostly the interpreter's start, and a
    shared-library build (pyenv's, this project's development venv) starts with ~40 % more instructions than
    Debian's static one (callgrind, ``python -c pass`` in a venv: 38.2M against 27.4M)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(cand, os.X_OK):
            r = subprocess.run([cand, "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True)
            if r.stdout.strip() == "True":
                return cand
    return sys.executable


def client_install(venv: Path, python: str) -> str:
    """The ``coorm`` a user runs on a login node: this checkout installed as README says for them
    (``pip install <checkout>``: the client only, compiled, not editable), in its own venv made with
    ``python``. The development venv is not what users run: its editable finder and the server extras'
    ``.pth`` files cost every command ~30 ms before its first line, and with ``PYTHONDONTWRITEBYTECODE`` set it
    compiles the package on every call. The venv is kept between runs (made again if ``python`` is another
    interpreter); the checkout is installed again each run."""
    venv_python = venv / "bin" / "python"
    cfg = venv / "pyvenv.cfg"
    made_by = next((line.split("=", 1)[1].strip() for line in cfg.read_text().splitlines()
                    if line.startswith("home")), None) if cfg.exists() else None
    if venv_python.exists() and made_by != str(Path(python).resolve().parent):
        log(f"the client venv {venv} was made with another interpreter ({made_by}): made again")
        shutil.rmtree(venv)
    if not venv_python.exists():
        log(f"creating the client venv {venv} with {python} (pip install {REPO}: the first time takes a minute)")
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv_python), "-m", "pip", "install", "-q", str(REPO)], check=True)
    else:
        subprocess.run([str(venv_python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                        str(REPO)], check=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    return str(venv / "bin" / "coorm")


class Coorm:
    def __init__(self, base: Path, client: str | None = None) -> None:
        self.base, self.workdir, self.jobdir = base, base / "coorm-up", base / "jobs"
        self.jobdir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, COORM_CONNECTION_FILE=str(base / "connection.json"))
        exe = Path(sys.executable).with_name("coorm")
        self.exe = str(exe) if exe.exists() else (shutil.which("coorm") or "coorm")  # runs the servers
        self.client = client or self.exe  # what users type
        self.proc: subprocess.Popen | None = None
        self.known: dict[int, int] = {}  # every process seen under coorm up: pid -> starttime
        self.up_log = base / "coorm-up.log"

    # -- the system
    def start(self, timeout: float = 180) -> None:
        log(f"starting CooRM: coorm up --clusters c0={NODES} --workdir {self.workdir}")
        with open(self.up_log, "w") as out:
            self.proc = subprocess.Popen([self.exe, "up", "--clusters", f"c0={NODES}", "--workdir", str(self.workdir)],
                                         env=self.env, cwd=self.base, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline, last = time.time() + timeout, ""
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coorm up exited {self.proc.returncode}: {self.up_log.read_text()[-2000:]}")
            self.remember()
            r = self.run(["status", "--json"], timeout=30, check=False)
            if r.returncode == 0:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    c0 = [c for c in json.loads(r.stdout)["clusters"] if c["cluster"] == "c0"]
                    last = f"c0 up={c0[0]['up'] if c0 else None}"
                    if c0 and c0[0]["up"] >= NODES:
                        self.remember()
                        log(f"CooRM up: {NODES} nodes on c0 (pid {self.proc.pid})")
                        return
            else:
                last = r.stderr.strip()[-300:]
            time.sleep(1)
        raise RuntimeError(f"CooRM did not show {NODES} nodes up on c0 within {timeout:.0f} s (last: {last})")

    def remember(self) -> dict[int, int]:
        tree = descendants(self.proc.pid) if self.proc else {}
        self.known.update(tree)
        return tree

    def pids(self) -> list[int]:
        return list(self.remember())

    def stop(self) -> None:
        if self.proc is None:
            return
        p, self.proc = self.proc, None
        with contextlib.suppress(Exception):
            self.known.update(descendants(p.pid))
        log(f"stopping CooRM (SIGTERM to process group {p.pid})")
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                log("coorm up ignored SIGTERM for 90 s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # its children run in sessions of their own: end any that outlived it (same pid and start time only)
        table = proc_table()
        left = [pid for pid, st in self.known.items() if pid != p.pid and table.get(pid, (0, -1))[1] == st]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not left:
                break
            log(f"processes of coorm up still running: {left}: {sig.name}")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(5)
            table = proc_table()
            left = [pid for pid in left if table.get(pid, (0, -1))[1] == self.known[pid]]

    # -- commands
    def run(self, args: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [self.client, *args]
        r = subprocess.run(cmd, env=self.env, cwd=self.jobdir, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise CommandFailed(["coorm", *args], r)
        return r

    def submit_id(self, args: list[str]) -> str:
        r = self.run(args)
        m = re.search(r"Submitted batch job (\S+)", r.stdout)
        if not m:
            raise RuntimeError(f"`coorm {' '.join(args)}` printed no job id: {r.stdout.strip()!r} {r.stderr.strip()!r}")
        return m.group(1)

    def queue(self) -> list[dict]:
        return json.loads(self.run(["queue", "--json"], timeout=120).stdout)

    def history(self, since: float) -> list[dict]:
        return json.loads(self.run(["history", "--json", "--since", str(int(since))], timeout=120).stdout)

    def wait_ended(self, ids: set[str] | None, timeout: float, array: str | None = None, n_tasks: int = 0,
                   interval: float = 1.0, since: float | None = None) -> tuple[bool, dict[str, dict], float]:
        """Until every job of ids (or n_tasks tasks of array) has ended: (ok, history records, observed time).
        History is asked for the jobs ended since `since` (default: a minute ago) only: a reply of all the jobs
        ended in the run could pass the 1 MB a NATS message may have."""
        since = since if since is not None else time.time() - 60
        def ours(j: dict) -> bool:
            if array is not None:
                return str(j.get("array_id")) == array or str(j["id"]).split("_")[0] == array
            return str(j["id"]) in ids
        deadline, recs = time.time() + timeout, {}
        while time.time() < deadline:
            if not any(ours(j) for j in self.queue()):
                recs = {str(j["id"]): j for j in self.history(since) if ours(j) and j.get("state") in ENDED}
                if len(recs) >= (n_tasks if array is not None else len(ids)):
                    return True, recs, time.time()
            time.sleep(interval)
        recs = {str(j["id"]): j for j in self.history(since) if ours(j) and j.get("state") in ENDED}
        return False, recs, time.time()

    def cleanup_jobs(self) -> None:
        with contextlib.suppress(Exception):
            self.run(["cancel", "-u", getpass.getuser()], timeout=300, check=False)


def states_of(recs) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in recs:
        out[j.get("state", "?")] = out.get(j.get("state", "?"), 0) + 1
    return out


def coorm_latency(c: Coorm, b, n: int, rng: random.Random) -> dict:
    lat, rpc, ids, srv = [], [], [], []
    phases = [(k + rng.random()) / n for k in range(n)]  # as bench.test_latency: stratified arrival phases
    rng.shuffle(phases)
    for i in range(n):
        time.sleep(phases[i])
        f = c.jobdir / f"lat_{i}.t"
        if f.exists():
            f.unlink()
        t0 = time.time()
        jid = c.submit_id(["batch", "-N", "1", "-t", "10m", "-J", f"lat{i}", "-o", "/dev/null", "-e", "/dev/null",
                           "--wrap", f"date +%s.%N > {f}; sleep 1"])
        t1 = time.time()
        start = b.read_float_file(str(f), t0 + 60)
        if start is None:
            raise RuntimeError(f"latency job {jid} did not start within 60 s")
        lat.append(start - t0)
        rpc.append(t1 - t0)
        ids.append(jid)
        ok, recs, _ = c.wait_ended({jid}, 60, interval=0.2, since=t0 - 5)
        if not ok:
            raise RuntimeError(f"latency job {jid} did not end within 60 s")
        srv.append(recs[jid]["started"] - recs[jid]["submitted"])
        log(f"  latency {i + 1}/{n}: job {jid} submit->start {lat[-1] * 1000:.0f} ms "
            f"(command {rpc[-1] * 1000:.0f} ms; history: started-submitted "
            f"{srv[-1] * 1000:.0f} ms)")
    return {"submit_to_start_s": b.pstats(lat), "batch_cmd_wall_s": b.pstats(rpc),
            "history_submitted_to_started_s": b.pstats(srv),
            "samples_s": [round(x, 4) for x in lat], "job_ids": ids}


FLOAT = re.compile(r"^\s*(\d{9,}\.\d+)\s*$", re.M)


def coorm_srun(c: Coorm, b, n: int, rng: random.Random) -> dict:
    lat, tot = [], []
    for i in range(n):
        time.sleep(rng.uniform(0.0, 1.0))
        t0 = time.time()
        r = c.run(["submit", "-N", "1", "-t", "1m", "-J", f"srun{i}", "--", "date", "+%s.%N"], timeout=60)
        t1 = time.time()
        m = FLOAT.search(r.stdout)
        if not m:
            raise RuntimeError(f"coorm submit printed no timestamp: {r.stdout.strip()!r} {r.stderr.strip()!r}")
        lat.append(float(m.group(1)) - t0)
        tot.append(t1 - t0)
    log(f"  srun-like latency median {statistics.median(lat) * 1000:.0f} ms "
        f"(round trip median {statistics.median(tot) * 1000:.0f} ms)")
    return {"submit_to_task_start_s": b.pstats(lat), "total_roundtrip_s": b.pstats(tot),
            "samples_s": [round(x, 4) for x in lat]}


def coorm_cmdtime(c: Coorm, b, n: int) -> dict:
    bt, st = [], []
    for _ in range(n):
        t0 = time.time()
        c.submit_id(["batch", "-N", "1", "-t", "10m", "-o", "/dev/null", "-e", "/dev/null", "--wrap", "true"])
        bt.append(time.time() - t0)
        t0 = time.time()
        c.submit_id(["submit", "--no-wait", "-N", "1", "-t", "10m", "-o", "/dev/null", "--", "true"])
        st.append(time.time() - t0)
        time.sleep(0.1)
    time.sleep(3)
    log(f"  command time p50: batch {statistics.median(bt) * 1000:.0f} ms, "
        f"submit --no-wait {statistics.median(st) * 1000:.0f} ms")
    return {"batch_cmd_wall_s": b.pstats(bt), "submit_nowait_cmd_wall_s": b.pstats(st),
            "batch_samples_s": [round(x, 4) for x in bt], "submit_nowait_samples_s": [round(x, 4) for x in st]}


def coorm_throughput(c: Coorm, n: int, par: int, timeout: float) -> dict:
    fails: list[str] = []

    def one(i: int) -> str | None:
        try:
            return c.submit_id(["submit", "--no-wait", "-N", "1", "-t", "10m", "-o", "/dev/null", "--", "true"])
        except Exception as e:  # noqa: BLE001 - counted and reported
            fails.append(str(e))
            return None
    with RssSampler(c.pids) as rss:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t_first = time.time()
        with ThreadPoolExecutor(par) as ex:
            ids = [x for x in ex.map(one, range(n)) if x is not None]
        t_sub = time.time()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        log(f"  throughput: {len(ids)} submitted in {t_sub - t_first:.1f} s ({len(fails)} failed); waiting")
        ok, recs, t_obs = c.wait_ended(set(ids), timeout, interval=1.0, since=t_first - 5)
    ends = [j["ended"] for j in recs.values() if j.get("ended")]
    t_done = max(ends) if ends else t_obs
    res = {"jobs": n, "parallel_submitters": par, "submitted": len(ids), "submit_failures": len(fails),
           "first_failures": fails[:3], "all_completed": ok and not fails, "completed_records": len(recs),
           "states": states_of(recs.values()), "submit_wall_s": t_sub - t_first,
           "submit_rate_jobs_per_s": len(ids) / (t_sub - t_first),
           "client_cpu_s": cpu_s(ru1) - cpu_s(ru0),
           "first_submit_to_all_complete_s": t_done - t_first,
           "observed_all_complete_s": t_obs - t_first,
           "throughput_jobs_per_s": len(recs) / (t_done - t_first), "rss": rss.result()}
    if recs:
        st = [j["started"] for j in recs.values() if j.get("started")]
        res["first_start_to_last_end_s"] = max(ends) - min(st) if st and ends else None
    log(f"  throughput: {len(recs)} jobs in {res['first_submit_to_all_complete_s']:.1f} s = "
        f"{res['throughput_jobs_per_s']:.1f} jobs/s; client CPU {res['client_cpu_s']:.1f} s; "
        f"peak RSS {res['rss']['peak_rss_mb']} MB; states {res['states']}")
    return res


def coorm_array(c: Coorm, n: int, timeout: float) -> dict:
    t_first = time.time()
    jid = c.submit_id(["batch", f"--array=0-{n - 1}", "-N", "1", "-t", "10m", "-o", "/dev/null", "-e", "/dev/null",
                       "--wrap", "true"])
    t_sub = time.time()
    ok, recs, t_obs = c.wait_ended(None, timeout, array=jid, n_tasks=n, interval=1.0, since=t_first - 5)
    ends = [j["ended"] for j in recs.values() if j.get("ended")]
    t_done = max(ends) if ends else t_obs
    res = {"jobs": n, "array_job_id": jid, "all_completed": ok, "completed_records": len(recs),
           "states": states_of(recs.values()), "submit_wall_s": t_sub - t_first,
           "first_submit_to_all_complete_s": t_done - t_first, "observed_all_complete_s": t_obs - t_first,
           "throughput_jobs_per_s": len(recs) / (t_done - t_first)}
    log(f"  array: {len(recs)} tasks in {res['first_submit_to_all_complete_s']:.1f} s = "
        f"{res['throughput_jobs_per_s']:.1f} jobs/s; states {res['states']}")
    return res


def ideal_backfill(b, jobs, unit: float) -> dict:
    rt = lambda j: j["walltime"] * unit  # noqa: E731 - as bench.test_backfill
    area = sum(j["size"] * rt(j) for j in jobs)
    ideal = {"area_lower_bound_makespan_s": max(area / NODES, max(rt(j) for j in jobs))}
    sims = (("fcfs", b.sim_fcfs), ("easy_backfill", b.sim_easy), ("conservative_backfill", b.sim_conservative))
    for name, fn in sims:
        s = fn(jobs, NODES, rt)
        ideal[name] = b.summarize(jobs, s, {k: s[k] + rt(jobs[k]) for k in s})
    return ideal


def coorm_backfill(c: Coorm, b, n: int, wmax: int, unit: float, seed: int, timeout: float) -> dict:
    jobs = b.make_workload(n, NODES, wmax, seed)
    rt = lambda j: j["walltime"] * unit  # noqa: E731 - as bench.test_backfill
    area = sum(j["size"] * rt(j) for j in jobs)
    ideal = ideal_backfill(b, jobs, unit)
    tag = f"bf{int(time.time())}"
    ids = []
    t_q = time.time()
    for j in jobs:  # in the workload's order, held (Slurm's test keeps its partition DOWN meanwhile)
        f = c.jobdir / f"{tag}_{j['i']}.out"
        ids.append(c.submit_id(["batch", "-H", "-N", str(j["size"]), "-t", str(j["walltime"]),  # minutes
                                "-J", tag, "-o", str(f), "-e", "/dev/null",
                                "--wrap", f"date +%s.%N; sleep {rt(j)}; date +%s.%N"]))
    log(f"  backfill: {len(ids)} held jobs queued in {time.time() - t_q:.1f} s; releasing them")
    t0 = time.time()
    c.run(["release", "-n", tag], timeout=120)
    t_rel = time.time() - t0
    ok, recs, t_obs = c.wait_ended(set(ids), timeout, interval=2.0, since=t0 - 5)
    start, end, copies = {}, {}, {}
    for j in jobs:
        # CooRM runs a batch job's script on every node it gets (docs/protocol.md, BatchSubmit), sbatch on the
        # first only: `size` copies append their two dates to the file. The job: first date -> last date.
        with contextlib.suppress(OSError, ValueError):
            a = [float(x) for x in (c.jobdir / f"{tag}_{j['i']}.out").read_text().split()]
            if a:
                start[j["i"]], end[j["i"]], copies[j["i"]] = min(a) - t0, max(a) - t0, len(a) // 2
    res = {"jobs": n, "nodes": NODES, "seed": seed, "walltime_units_max": wmax, "unit_s": unit,
           "all_completed": ok, "observed_all_done_s": t_obs - t0, "release_cmd_wall_s": t_rel,
           "states": states_of(recs.values()), "ideal": ideal}
    if len(start) == n:
        s = res["coorm"] = b.summarize(jobs, start, end)
        s["utilization"] = area / (NODES * s["makespan_s"])
        s["mean_job_overhead_beyond_sleep_s"] = statistics.fmean(end[k] - start[k] - rt(jobs[k]) for k in start)
        s["makespan_over_conservative_ideal"] = s["makespan_s"] / ideal["conservative_backfill"]["makespan_s"]
        s["makespan_over_LB"] = s["makespan_s"] / ideal["area_lower_bound_makespan_s"]
        order = sorted(start, key=lambda k: start[k])
        s["jobs_started_before_an_earlier_queued_job"] = sum(
            1 for k in order if any(start[m] > start[k] + 1e-6 for m in range(k)))
        log(f"  coorm: makespan {s['makespan_s']:.1f} s (ideal conservative "
            f"{ideal['conservative_backfill']['makespan_s']:.0f} s), avg wait {s['avg_wait_s']:.1f} s")
    else:
        log(f"  backfill: only {len(start)}/{n} jobs wrote start/end times; states {res['states']}")
    hist = recs
    res["script_copies_per_job"] = {"equal_to_size": sum(copies.get(j["i"]) == j["size"] for j in jobs),
                                    "one": sum(copies.get(j["i"]) == 1 for j in jobs)}
    hs = lambda j, k: round(hist[ids[j["i"]]][k] - t0, 3) if hist.get(ids[j["i"]], {}).get(k) else None  # noqa: E731
    res["per_job"] = [{**j, "id": ids[j["i"]], "runtime_s": rt(j), "start_s": round(start.get(j["i"], -1), 3),
                       "end_s": round(end.get(j["i"], -1), 3), "script_copies": copies.get(j["i"]),
                       "history_started_s": hs(j, "started"), "history_ended_s": hs(j, "ended"),
                       "state": hist.get(ids[j["i"]], {}).get("state")}
                      for j in jobs]
    return res


def coorm_queued(c: Coorm, n: int, singles: int, par: int, timeout: float) -> dict:
    t0 = time.time()
    arr = c.submit_id(["batch", "-H", f"--array=0-{n - singles - 1}", "-N", "1", "-t", "10m", "-o", "/dev/null",
                       "--wrap", "true"])
    t_arr = time.time() - t0
    fails: list[str] = []

    def one(i: int) -> None:
        try:
            c.submit_id(["batch", "-H", "-N", "1", "-t", "10m", "-o", "/dev/null", "--wrap", "true"])
        except Exception as e:  # noqa: BLE001 - counted and reported
            fails.append(str(e))
    with ThreadPoolExecutor(par) as ex:
        list(ex.map(one, range(singles)))
    res = {"jobs": n, "array_tasks": n - singles, "array_id": arr, "singles": singles,
           "array_submit_wall_s": t_arr, "submit_wall_s": time.time() - t0, "submit_failures": len(fails),
           "first_failures": fails[:3]}
    time.sleep(5)  # (a submission is on record when it is answered: this only lets the services settle)
    res.update(time_queue_cmd(lambda: c.run(["queue"], timeout=120, check=False)))
    res["queue_json_cmd"] = time_queue_cmd(lambda: c.run(["queue", "--json"], timeout=120, check=False), reps=3)
    r = c.run(["queue", "--json"], timeout=120, check=False)
    if r.returncode == 0:
        with contextlib.suppress(ValueError):
            q = json.loads(r.stdout)
            res["queue_json_entries"], res["queue_json_states"] = len(q), states_of(q)
    tot, by = rss_of(c.pids())
    res["rss"] = {"total_mb": round(tot / 1024, 1), "by_process_mb": {k: round(v / 1024, 1) for k, v in by.items()}}
    log(f"  queued10k: `coorm queue` p50 {res['queue_cmd_wall_s']['median']:.2f} s "
        f"({res.get('queue_cmd_error') or str(res['queue_cmd_lines']) + ' lines'}); RSS {res['rss']['total_mb']} MB")
    t = time.time()
    r = c.run(["cancel", "-u", getpass.getuser()], timeout=600, check=False)
    res["cancel"] = {"wall_s": time.time() - t, "rc": r.returncode, "stdout_tail": r.stdout.strip()[-300:],
                     "stderr_tail": r.stderr.strip()[-300:]}
    deadline, left = time.time() + timeout, None
    while time.time() < deadline:
        r = c.run(["queue", "--json"], timeout=120, check=False)
        left = len(json.loads(r.stdout)) if r.returncode == 0 else None
        if left == 0:
            break
        time.sleep(2)
    res["queue_after_cancel"] = {"left": left, "wall_s": time.time() - t}
    log(f"  queued10k: cancelled in {res['cancel']['wall_s']:.1f} s (rc {res['cancel']['rc']}); "
        f"queue empty after {res['queue_after_cancel']['wall_s']:.1f} s: {left == 0}")
    return res


# ---------------------------------------------------------------------------------------------------- table
def get(d, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def fmt(v, unit: str) -> str:
    if v is None:
        return "–"
    if unit == "ms":
        return f"{v * 1000:.0f} ms"
    if unit == "s":
        return f"{v:.1f} s"
    if unit == "jobs/s":
        return f"{v:.1f} jobs/s"
    if unit == "MB":
        return f"{v:.0f} MB"
    if unit == "n":
        return f"{v:.0f}"
    if unit == "cpu":
        return f"{v:.1f} CPU s"
    return f"{v}"


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def rows(res: dict, quick: bool) -> list[dict]:
    S, C = res["slurm"], res["coorm"]
    out = []

    def row(test, metric, s, c, unit, target="", met=None):
        r = ratio(c, s)
        out.append({"test": test, "metric": metric, "slurm": s, "coorm": c, "unit": unit, "ratio": r,
                    "target": target, "met": None if met is None else bool(met)})

    def err(test):
        for side, name in ((S, "Slurm"), (C, "CooRM")):
            if get(side, test, "error"):
                out.append({"test": test, "metric": f"{name} error", "slurm": None, "coorm": None, "unit": "",
                            "ratio": None, "target": get(side, test, "error").splitlines()[0][:120], "met": False})

    def both(f, *conds):
        return None if any(x is None for x in conds) else f()

    if "latency" in res["tests"]:
        s, c = get(S, "latency", "submit_to_start_s", "median"), get(C, "latency", "submit_to_start_s", "median")
        row("latency", "batch submit→start p50", s, c, "ms", "≤ 0.5× sbatch", both(lambda: c <= 0.5 * s, s, c))
        row("latency", "batch submit→start p10", get(S, "latency", "submit_to_start_s", "p10"),
            get(C, "latency", "submit_to_start_s", "p10"), "ms")
        row("latency", "batch submit→start p90", get(S, "latency", "submit_to_start_s", "p90"),
            get(C, "latency", "submit_to_start_s", "p90"), "ms")
        row("latency", "CooRM only: history's started − submitted p50 (server side)", None,
            get(C, "latency", "history_submitted_to_started_s", "median"), "ms")
        err("latency")
    if "srun" in res["tests"]:
        s = get(S, "srun", "srun_submit_to_task_start_s", "median")
        c = get(C, "srun", "submit_to_task_start_s", "median")
        row("srun", "`submit` (srun) submit→task start p50", s, c, "ms", "≤ 2× srun", both(lambda: c <= 2 * s, s, c))
        row("srun", "`submit` (srun) round trip p50", get(S, "srun", "srun_total_roundtrip_s", "median"),
            get(C, "srun", "total_roundtrip_s", "median"), "ms")
        err("srun")
    if "cmdtime" in res["tests"]:
        s = get(S, "cmdtime", "batch_cmd_wall_s", "median")
        for key, name in (("batch_cmd_wall_s", "`batch --wrap true` command time p50"),
                          ("submit_nowait_cmd_wall_s", "`submit --no-wait true` command time p50")):
            c = get(C, "cmdtime", key, "median")
            met = None if c is None else (c <= 0.150 and (s is None or c <= 5 * s))
            row("cmdtime", name, s, c, "ms", "≤ 150 ms and ≤ 5× sbatch", met)
        err("cmdtime")
    if "throughput" in res["tests"]:
        n = get(C, "throughput", "jobs") or get(S, "throughput", "jobs")
        s, c = get(S, "throughput", "throughput_jobs_per_s"), get(C, "throughput", "throughput_jobs_per_s")
        row("throughput", f"{n} jobs, 4 submitters: first submit→all done", s, c, "jobs/s", "≥ 1× Slurm",
            both(lambda: c >= s, s, c))
        row("throughput", "submit phase wall", get(S, "throughput", "submit_wall_s"),
            get(C, "throughput", "submit_wall_s"), "s")
        row("throughput", "submitting clients' CPU", get(S, "throughput", "client_cpu_s"),
            get(C, "throughput", "client_cpu_s"), "cpu")
        row("throughput", "peak RSS of the system's processes", get(S, "throughput", "rss", "peak_rss_mb"),
            get(C, "throughput", "rss", "peak_rss_mb"), "MB")
        err("throughput")
    if "array" in res["tests"]:
        n = get(C, "array", "jobs") or get(S, "array", "jobs")
        s, c = get(S, "array", "throughput_jobs_per_s"), get(C, "array", "throughput_jobs_per_s")
        row("array", f"{n}-task array: submit→all done", s, c, "jobs/s", "≥ 5× Slurm", both(lambda: c >= 5 * s, s, c))
        err("array")
    if "backfill" in res["tests"]:
        ideal_s = get(S, "backfill", "ideal", "conservative_backfill", "makespan_s")
        ideal_c = get(C, "backfill", "ideal", "conservative_backfill", "makespan_s")
        ideal = ideal_c or ideal_s
        s, c = get(S, "backfill", "slurm", "makespan_s"), get(C, "backfill", "coorm", "makespan_s")
        n = get(C, "backfill", "jobs") or get(S, "backfill", "jobs")
        met = None if c is None or ideal is None else (c <= 1.10 * ideal and (s is None or c <= s))
        row("backfill", f"{n} jobs: makespan", s, c, "s", "≤ Slurm and ≤ 1.10× ideal", met)
        row("backfill", "makespan ÷ ideal conservative",
            ratio(s, ideal_s), ratio(c, ideal_c), "", "≤ 1.10",
            None if c is None or ideal is None else c <= 1.10 * ideal)
        row("backfill", "ideal conservative backfill makespan (bench.sim_conservative)", ideal_s, ideal_c, "s")
        row("backfill", "mean wait", get(S, "backfill", "slurm", "avg_wait_s"),
            get(C, "backfill", "coorm", "avg_wait_s"), "s")
        row("backfill", "median wait", get(S, "backfill", "slurm", "median_wait_s"),
            get(C, "backfill", "coorm", "median_wait_s"), "s")
        row("backfill", "mean time a job took beyond its sleep", get(S, "backfill", "slurm",
            "mean_job_overhead_beyond_sleep_s"), get(C, "backfill", "coorm", "mean_job_overhead_beyond_sleep_s"), "s")
        row("backfill", "jobs started before an earlier-queued job", get(S, "backfill", "slurm",
            "jobs_started_before_an_earlier_queued_job"), get(C, "backfill", "coorm",
            "jobs_started_before_an_earlier_queued_job"), "n")
        err("backfill")
    if "queued10k" in res["tests"]:
        s, c = get(S, "queued10k", "queue_cmd_wall_s", "median"), get(C, "queued10k", "queue_cmd_wall_s", "median")
        if get(C, "queued10k", "queue_cmd_error"):
            c = None
        if get(S, "queued10k", "queue_cmd_error"):
            s = None
        row("queued10k", "`queue` (squeue) wall p50, 10,000 queued", s, c, "ms", "< 1 s",
            None if get(C, "queued10k") is None or "error" in C["queued10k"] else (c is not None and c < 1))
        for side, name in ((S, "Slurm"), (C, "CooRM")):
            for key, what in (("queue_cmd_error", "`queue`"), ("queue_json_cmd", "`queue --json`")):
                e = get(side, "queued10k", key) if key == "queue_cmd_error" else get(side, "queued10k", key,
                                                                                     "queue_cmd_error")
                if e:
                    out.append({"test": "queued10k", "metric": f"{name} {what} failed", "slurm": None,
                                "coorm": None, "unit": "", "ratio": None, "target": e.splitlines()[0][:160],
                                "met": False})
        s, c = get(S, "queued10k", "rss", "total_mb"), get(C, "queued10k", "rss", "total_mb")
        row("queued10k", "whole system's RSS, 10,000 queued", s, c, "MB", "< 2 GB", None if c is None else c < 2048)
        err("queued10k")
    return out


def table(rs: list[dict]) -> str:
    lines = ["| test | metric | Slurm | CooRM | CooRM/Slurm | target (issue 13) | met? |",
             "|---|---|---|---|---|---|---|"]
    for r in rs:
        u = r["unit"]
        sv = fmt(r["slurm"], u) if u else ("–" if r["slurm"] is None else f"{r['slurm']:.2f}")
        cv = fmt(r["coorm"], u) if u else ("–" if r["coorm"] is None else f"{r['coorm']:.2f}")
        rt = "–" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        met = "" if r["met"] is None else ("met" if r["met"] else "**not met**")
        target = str(r["target"]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['test']} | {r['metric']} | {sv} | {cv} | {rt} | {target} | {met} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- main
def _sigterm(_sig, _frame):
    raise KeyboardInterrupt("SIGTERM")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", default=",".join(DEFAULT_TESTS), help=f"comma list of {','.join(ALL_TESTS)}")
    ap.add_argument("--quick", action="store_true", help="fewer jobs: 200 for throughput/array, 60 backfill jobs")
    ap.add_argument("--no-slurm", action="store_true", help="CooRM only (no ratios)")
    ap.add_argument("--out", help="write the raw results (every sample) to this JSON file")
    ap.add_argument("--slurm-dir", default="/tmp/slurm-peer", help="writable copy of the Slurm peer scripts")
    ap.add_argument("--lat-n", type=int, default=20)
    ap.add_argument("--tp-n", type=int, help="throughput/array jobs (default 1000; 200 with --quick)")
    ap.add_argument("--tp-par", type=int, default=4)
    ap.add_argument("--bf-n", type=int, help="backfill jobs (default 200; 60 with --quick)")
    ap.add_argument("--bf-wmax", type=int, default=5)
    ap.add_argument("--bf-unit", type=float, default=1.0, help="seconds of runtime per walltime minute")
    ap.add_argument("--q-n", type=int, default=10000, help="queued10k: jobs held in the queue")
    ap.add_argument("--q-singles", type=int, default=100, help="queued10k: how many of them are single jobs")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=float, default=1800, help="per-test completion deadline (s)")
    ap.add_argument("--client-venv", default=str(Path.home() / ".cache" / "coorm-bench" / "client"),
                    help="where the users' coorm is installed (pip install <checkout>), kept between runs")
    ap.add_argument("--client-python", help="the interpreter of the users' venv (default: the distribution's "
                    "python3 if it is 3.11 or later, else this one)")
    ap.add_argument("--dev-client", action="store_true",
                    help="users' commands with the development venv's coorm (editable, server extras) instead")
    a = ap.parse_args()
    tests = [t for t in a.tests.split(",") if t]
    bad = [t for t in tests if t not in ALL_TESTS]
    if bad:
        ap.error(f"unknown tests {bad}; known: {ALL_TESTS}")
    tp_n = a.tp_n or (200 if a.quick else 1000)
    bf_n = a.bf_n or (60 if a.quick else 200)
    signal.signal(signal.SIGTERM, _sigterm)

    base = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    res = {"tests": tests, "args": vars(a), "host_cpus": os.cpu_count(), "nodes": NODES, "workdir": str(base),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "slurm": {}, "coorm": {}}

    def save() -> None:
        if a.out:
            res["rows"] = rows(res, a.quick)
            Path(a.out).write_text(json.dumps(res, indent=1, default=str))

    slurm = None if a.no_slurm else Slurm(Path(a.slurm_dir))
    client_python = a.client_python or system_python()
    client = None if a.dev_client else client_install(Path(a.client_venv), client_python)
    res["client"] = client or "the development venv's coorm"
    if client:
        res["client_python"] = subprocess.run([client_python, "-c", "import sys; print(sys.version.split()[0])"],
                                              capture_output=True, text=True).stdout.strip() + f" ({client_python})"
        log(f"users' commands: {client}, Python {res['client_python']}")
    coorm = Coorm(base, client)
    interrupted = False
    try:
        if slurm:
            slurm.prepare()
            slurm.start()
            b = load_bench(slurm.dir)
            res["slurm_version"] = b.run([b.SCONTROL, "--version"]).stdout.strip()
        else:
            b = stub_bench(base)
        coorm.start()
        rng_s, rng_c = random.Random(a.seed), random.Random(a.seed)  # the same arrival phases on both
        for t in tests:
            sides = ([("slurm", slurm)] if slurm else []) + [("coorm", coorm)]
            for side, _ in sides:
                log(f"== {t} on {side}")
                c0 = b.cpu_times()
                try:
                    if side == "slurm":
                        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                        if t == "latency":
                            r = b.test_latency(a.lat_n, rng_s)
                        elif t == "srun":
                            r = b.test_srun_latency(a.lat_n, rng_s)
                        elif t == "cmdtime":
                            r = slurm_cmdtime(b, a.lat_n)
                        elif t == "throughput":
                            with RssSampler(slurm.pids) as rss:
                                r = b.test_throughput(tp_n, a.tp_par, a.timeout)
                            r["client_cpu_s"] = cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - cpu_s(ru0)
                            r["rss"] = rss.result()
                        elif t == "array":
                            r = b.test_array(tp_n, a.timeout)
                        elif t == "backfill":
                            r = b.test_backfill(bf_n, a.bf_wmax, a.bf_unit, a.seed, a.timeout)
                        else:
                            r = slurm_queued(b, slurm, a.q_n, a.tp_par)
                    else:
                        if t == "latency":
                            r = coorm_latency(coorm, b, a.lat_n, rng_c)
                        elif t == "srun":
                            r = coorm_srun(coorm, b, a.lat_n, rng_c)
                        elif t == "cmdtime":
                            r = coorm_cmdtime(coorm, b, a.lat_n)
                        elif t == "throughput":
                            r = coorm_throughput(coorm, tp_n, a.tp_par, a.timeout)
                        elif t == "array":
                            r = coorm_array(coorm, tp_n, a.timeout)
                        elif t == "backfill":
                            r = coorm_backfill(coorm, b, bf_n, a.bf_wmax, a.bf_unit, a.seed, a.timeout)
                        else:
                            r = coorm_queued(coorm, a.q_n, a.q_singles, a.tp_par, a.timeout)
                except Exception as e:  # noqa: BLE001 - reported in the table and the JSON, then the next test
                    log(f"  {side} {t} FAILED: {e}")
                    r = {"error": f"{type(e).__name__}: {e}"}
                    if side == "slurm":
                        slurm.cleanup_jobs(b)
                    else:
                        coorm.cleanup_jobs()
                r["host_cpu_busy_fraction"] = b.cpu_busy_since(c0)
                res[side][t] = r
                save()
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping both systems")
    finally:
        try:
            coorm.stop()
        finally:
            if slurm:
                slurm.stop()
    res["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rs = rows(res, a.quick)
    save()
    print(f"\nCooRM batch queue vs Slurm 22.05 ({'quick' if a.quick else 'full'} run, {NODES} emulated nodes, "
          f"{os.cpu_count()} host CPUs, {res['started']}){' -- INTERRUPTED' if interrupted else ''}\n")
    print(f"users' coorm: {res['client']}" + (f", Python {res['client_python']}" if "client_python" in res else "")
          + "\n")
    print(table(rs))
    if a.out:
        print(f"\nraw samples: {a.out}")
    print(f"CooRM's work directory (logs): {base}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
