"""The traces: fetched from an archive (here a real HTTP server on loopback) into the cache with their
checksum checked, found in the cache, then COORM_TRACES, then beside a checkout; the shipped sample."""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from coorm.simulator import traces
from coorm.simulator.trace import read_swf
from coorm.simulator.traces import CATALOGUE, SAMPLE, TraceError

ATLAS = "LLNL-Atlas-2006-2.1-cln"
SWF = b"; Version: 2.2\n; MaxNodes: 2\n; MaxProcs: 4\n 1 0 -1 10 4 -1 -1 4 20 -1 1 1 1 1 1 1 -1 -1\n"


class _Archive:
    """A directory served over HTTP on loopback, counting the requests it answers."""

    def __init__(self, root: Path) -> None:
        self.root, self.hits = root, 0
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(root), **k)

            def do_GET(self):  # noqa: N802 - the http.server API
                outer.hits += 1
                super().do_GET()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """An archive holding a small log under the Atlas name, with the catalogue's checksum made its own."""
    root = tmp_path / "archive"
    root.mkdir()
    with gzip.open(root / f"{ATLAS}.swf.gz", "wb") as f:
        f.write(SWF)
    import hashlib

    entry = CATALOGUE[ATLAS]
    monkeypatch.setitem(CATALOGUE, ATLAS, traces.Trace(ATLAS, entry.folder, hashlib.sha256(SWF).hexdigest(),
                                                       len(SWF)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a = _Archive(root)
    yield a
    a.close()


def test_a_fetch_downloads_verifies_and_caches_once(archive):
    path = traces.fetch(ATLAS, mirror=archive.url)
    assert path == traces.cache_dir() / f"{ATLAS}.swf.gz" and path.read_bytes()
    jobs, cores = read_swf(path)
    assert [j.id for j in jobs] == [1] and cores == 2
    assert archive.hits == 1
    assert traces.fetch(ATLAS, mirror=archive.url) == path
    assert archive.hits == 1, "a verified copy is not downloaded again"
    assert traces.locate(ATLAS) == path


def test_a_download_that_is_not_the_catalogue_s_log_is_refused_and_not_kept(archive):
    with gzip.open(archive.root / f"{ATLAS}.swf.gz", "wb") as f:
        f.write(SWF.replace(b" 10 ", b" 11 "))  # one field changed
    with pytest.raises(TraceError, match="checksum"):
        traces.fetch(ATLAS, mirror=archive.url)
    assert not traces.cache_dir().exists() or not list(traces.cache_dir().iterdir())
    (archive.root / f"{ATLAS}.swf.gz").write_bytes(b"not gzip")
    with pytest.raises(TraceError, match="gzip"):
        traces.fetch(ATLAS, mirror=archive.url)
    assert not list(traces.cache_dir().iterdir())


def test_unknown_and_unreachable_traces_are_refused(archive):
    from coorm.shared.servers import free_port

    with pytest.raises(TraceError, match="unknown trace"):
        traces.fetch("Nowhere-1999-cln", mirror=archive.url)
    with pytest.raises(TraceError, match="cannot download"):
        traces.fetch(ATLAS, mirror=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TraceError, match="cannot download"):  # the archive has no such file: 404
        traces.fetch("KTH-SP2-1996-2.1-cln", mirror=archive.url)
    assert not list(traces.cache_dir().iterdir())


def test_locate_looks_in_the_cache_then_coorm_traces(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "X-1-cln.swf.gz").write_bytes(b"")
    monkeypatch.setenv("COORM_TRACES", os.pathsep.join([str(a), str(b)]))
    assert traces.locate("X-1-cln") == a / "X-1-cln.swf.gz"
    assert traces.locate("X-1-cln.swf.gz") == a / "X-1-cln.swf.gz"
    cached = traces.cache_dir() / "X-1-cln.swf.gz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert traces.locate("X-1-cln") == cached
    with pytest.raises(TraceError, match="coorm trace list"):
        traces.locate("Y-1-cln")


def test_the_sample_is_the_atlas_packs_it_names():
    jobs, cores = read_swf(SAMPLE)
    assert traces.locate("sample") == SAMPLE and cores == 8
    assert len(jobs) == 200 * len(traces.SAMPLE_PACKS)
    sibling = Path(traces.__file__).resolve().parents[3] / "shared" / "workloads" / f"{ATLAS}.swf.gz"
    if sibling.is_file():  # beside the full log: the sample is its packs, job for job
        full, _ = read_swf(sibling)
        for i, p in enumerate(traces.SAMPLE_PACKS):
            assert jobs[200 * i: 200 * (i + 1)] == full[200 * p: 200 * (p + 1)]


def test_the_command_fetches_and_says_why_it_cannot(archive, tmp_path):
    env = {**os.environ, "COORM_TRACE_MIRROR": archive.url}
    ok = subprocess.run([sys.executable, "-m", "coorm.cli.main", "trace", "fetch", "Nowhere-1999-cln"], env=env,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 1 and "unknown trace" in ok.stderr and "Traceback" not in ok.stderr
    listing = subprocess.run([sys.executable, "-m", "coorm.cli.main", "trace", "list"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "sample" in listing.stdout

