"""The job traces the simulator and the paper experiments replay: the Parallel Workloads Archive's cleaned
logs by name, downloaded once into a cache with their checksum checked, and a small sample that ships
with CooRM.

Where a trace is looked for (:func:`locate`): the cache (``$XDG_CACHE_HOME/coorm/traces``, by default
``~/.cache/coorm/traces``), then each folder of ``COORM_TRACES`` (``os.pathsep``-separated), then the
folder ``shared/workloads`` beside a checkout of the repository. ``coorm trace fetch NAME`` fills the
cache from the archive, or from a mirror (``COORM_TRACE_MIRROR``: a base URL holding the same file names).

A checksum is of the *uncompressed* log: the archive and its mirrors may gzip the same log differently.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ARCHIVE = "https://www.cs.huji.ac.il/labs/parallel/workload"
SAMPLE = Path(__file__).resolve().parent / "data" / "sample.swf.gz"
# the sample is these packs of 200 usable jobs of the LLNL Atlas log (the ones the quick paper experiments
# replay), one after the other: its pack i is the log's pack SAMPLE_PACKS[i]
SAMPLE_PACKS = (23, 46, 69, 137)


@dataclass(frozen=True)
class Trace:
    name: str  # the archive's name of the cleaned log
    folder: str  # the log's folder in the archive
    sha256: str  # of the uncompressed log
    size: int  # bytes, uncompressed

    @property
    def file(self) -> str:
        return f"{self.name}.swf.gz"

    def url(self, mirror: str | None = None) -> str:
        if mirror:
            return f"{mirror.rstrip('/')}/{self.file}"
        return f"{ARCHIVE}/{self.folder}/{self.file}"


CATALOGUE: dict[str, Trace] = {t.name: t for t in (
    Trace("CTC-SP2-1996-3.1-cln", "l_ctc_sp2",
          "8e33a9b597e1ddda2d2164347bac08c9444e1a2620a7947df52f0a1622ec4cde", 7_167_987),
    Trace("HPC2N-2002-2.2-cln", "l_hpc2n",
          "77b8993c73ae438385f6c0015708251f52dc316267b03ac19a406fbea2802afa", 19_242_100),
    Trace("KTH-SP2-1996-2.1-cln", "l_kth_sp2",
          "fba36494c4e4257f72182e8b629ebb0bcb054b3b82851ef957445bd627adcc87", 2_620_495),
    Trace("LANL-CM5-1994-4.1-cln", "l_lanl_cm5",
          "4766a62dabcc7403ec0a55534aff297203e692ddbf6637bd40100a3800f6354a", 11_354_840),
    Trace("LLNL-Atlas-2006-2.1-cln", "l_llnl_atlas",
          "8b3aaab739fa0bda8abaccc37c207d0b19d9d147b19e7f47a1641133a56fd07f", 4_059_977),
    Trace("SDSC-SP2-1998-4.2-cln", "l_sdsc_sp2",
          "2bb635f4b5793f52bd49ccb8fd913d95f9c5be6346925162cadcaf0117e28cf2", 5_601_165),
)}


class TraceError(Exception):
    """A trace that is unknown, missing, or not what the catalogue says."""


def _name(name: str) -> str:
    for suffix in (".gz", ".swf"):
        name = name.removesuffix(suffix)
    return name


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coorm" / "traces"


def search_path() -> list[Path]:
    """Where :func:`locate` looks, in order."""
    out = [cache_dir()]
    out += [Path(p) for p in os.environ.get("COORM_TRACES", "").split(os.pathsep) if p]
    sibling = Path(__file__).resolve().parents[3] / "shared" / "workloads"  # beside a checkout
    if sibling.is_dir():
        out.append(sibling)
    return out


def locate(name: str) -> Path:
    """The path of trace ``name`` (``sample``: the shipped sample), or :class:`TraceError` saying how to
    get it."""
    name = _name(name)
    if name == "sample":
        return SAMPLE
    for folder in search_path():
        path = folder / f"{name}.swf.gz"
        if path.is_file():
            return path
    hint = f"coorm trace fetch {name}" if name in CATALOGUE else "coorm trace list"
    where = ", ".join(str(p) for p in search_path())
    raise TraceError(f"trace {name} not found (looked in {where}): get it with '{hint}'")


def checksum(path: Path) -> str:
    """SHA-256 of the uncompressed log."""
    h = hashlib.sha256()
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str, *, mirror: str | None = None, progress: Callable[[int, int], None] | None = None) -> Path:
    """Download trace ``name`` into the cache unless a verified copy is there; its path. The download is
    checked against the catalogue's checksum before it takes the trace's name in the cache, so that a
    broken download is never found by :func:`locate`."""
    import urllib.request

    name = _name(name)
    trace = CATALOGUE.get(name)
    if trace is None:
        raise TraceError(f"unknown trace {name!r}: one of {', '.join(sorted(CATALOGUE))}")
    target = cache_dir() / trace.file
    if target.is_file() and checksum(target) == trace.sha256:
        return target
    mirror = mirror if mirror is not None else os.environ.get("COORM_TRACE_MIRROR")
    url = trace.url(mirror)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{trace.file}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - http(s) from our catalogue
                    total = int(resp.headers.get("Content-Length") or 0)
                    done = 0
                    while chunk := resp.read(1 << 16):
                        out.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
            except OSError as e:
                raise TraceError(f"cannot download {url}: {e}") from None
        try:
            got = checksum(Path(tmp))
        except (OSError, EOFError) as e:
            raise TraceError(f"{url} is not a gzip'd log: {e}") from None
        if got != trace.sha256:
            raise TraceError(f"{url}: checksum {got[:16]}... is not the catalogue's {trace.sha256[:16]}...")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
