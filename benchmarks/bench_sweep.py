"""The "sweep" family: `walj sweep ROOT` over many local sessions, sessions/s and peak RSS,
against reading every byte of the same files (the I/O floor of any sweep); and `walj sweep URL`
over ARCHIVED_SESSIONS ended sessions shipped to an S3 API (moto's server, started here on
127.0.0.1), against listing and reading every object of them through s3fs with as many threads.

The root holds SWEEP_SESSIONS journals (a full run: 10,000), each a few turns of no-op calls,
one in every BLOCKED_EVERY left with an ambiguous call so the sweep has blockers to report. It
is built once per run, in a child with fsync switched off (no figure is taken there). Both
series run as a fresh process, wall clock with interpreter start, and report the peak RSS of
the largest process of the run (the sweep's workers included: RUSAGE_CHILDREN after they are
reaped).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_core import Config, Measure, Sample

SWEEP_SESSIONS = 10_000
QUICK_SWEEP_SESSIONS = 300
ARCHIVED_SESSIONS = 1_000
QUICK_ARCHIVED_SESSIONS = 100
BUCKET = "walj-bench"
BLOCKED_EVERY = 100

# Run a command as a child and report its wall time and the peak RSS of its process tree.
_TIMED = r'''
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
seconds = time.perf_counter() - t0
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"seconds": seconds, "exit": proc.returncode, "rss_kib": kib,
                  "stderr": proc.stderr.decode(errors="replace")[-500:]}))
'''

# Read every byte of every file under a root: the floor for any tool that checks them all.
_READ_ALL = r'''
import os, sys
total = 0
for dirpath, _dirs, files in os.walk(sys.argv[1]):
    for name in files:
        with open(os.path.join(dirpath, name), "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
print(total)
'''

_BUILD = r'''
import os, sys
os.fsync = lambda fd: None  # building only: no figure is taken in this process
os.fdatasync = lambda fd: None
from pathlib import Path
import walj
root, n, blocked_every = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
end = len(sys.argv) > 4 and sys.argv[4] == "end"  # ended: every segment sealed, archivable
def noop(**kw): return None
def unknown(**kw): raise walj.ToolOutcomeUnknown("connection lost after the request went out")
for k in range(n):
    with walj.ToolJournal.open(root / f"session-{k:06d}", tools={"noop": noop, "send": unknown},
                               sync="never") as journal:
        for t in range(3):
            with journal.turn() as turn:
                for c in range(3):
                    turn.dispatch("noop", {"t": t, "c": c})
        if k % blocked_every == 0:
            try:
                with journal.turn() as turn:
                    turn.dispatch("send", {"to": "ann"})
            except walj.ToolOutcomeUnknown:
                pass
        if end:
            journal.end()
print(n)
'''


def sweep_count(cfg: Config) -> int:
    base = QUICK_SWEEP_SESSIONS if cfg.quick else SWEEP_SESSIONS
    return max(20, int(base * min(1.0, cfg.scale)))


class SweepRoot:
    """The root of sessions, built on first use and shared by both series of the run."""

    def __init__(self, cfg: Config, env: dict[str, str]) -> None:
        self.path = cfg.workdir / "sweep-root"
        self.sessions = sweep_count(cfg)
        self.env = env
        self._built = False

    def get(self) -> Path:
        if not self._built:
            subprocess.run([sys.executable, "-c", _BUILD, str(self.path), str(self.sessions),
                            str(BLOCKED_EVERY)], env=self.env, check=True, capture_output=True)
            self._built = True
        return self.path


def _timed(cmd: list[str], env: dict[str, str], sessions: int, ok_exits: tuple[int, ...]
           ) -> Sample:
    out = subprocess.run([sys.executable, "-c", _TIMED, *cmd], env=env, capture_output=True,
                         text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["exit"] not in ok_exits:
        raise RuntimeError(f"exit {result['exit']}: {result['stderr'].strip()[-200:]}")
    sample = Sample(value=sessions / result["seconds"], ops=sessions, seconds=result["seconds"])
    sample.extra["rss_mb"] = result["rss_kib"] * 1024 / 1e6
    return sample


def walj_sweep(root: SweepRoot) -> Measure:
    """`python -m walj sweep ROOT --json`: every session's checksums, seals and recovery state."""

    def measure(_d: Path) -> Sample:
        path = root.get()
        # Exit 1: the sweep found the blocked sessions it was built with, as it must.
        return _timed([sys.executable, "-m", "walj", "sweep", str(path), "--json"], root.env,
                      root.sessions, (1,))

    return measure


def read_all(root: SweepRoot) -> Measure:
    """Walk the same root and read every byte of every file, in one process."""

    def measure(_d: Path) -> Sample:
        path = root.get()
        return _timed([sys.executable, "-c", _READ_ALL, str(path)], root.env, root.sessions,
                      (0,))

    return measure


# --- archived sessions ----------------------------------------------------------------------

# Ship every session under a root to URL, many at a time (building only: no figure is taken).
_SHIP = r'''
import os, sys
from concurrent.futures import ThreadPoolExecutor
import fsspec
import walj.archive
root, url, bucket = sys.argv[1], sys.argv[2], sys.argv[3]
fs = fsspec.filesystem("s3")
if not fs.exists(bucket):
    fs.mkdir(bucket)
names = sorted(os.listdir(root))
with ThreadPoolExecutor(16) as pool:
    reports = list(pool.map(lambda name: walj.archive.ship(os.path.join(root, name), url), names))
assert all(r.shipped for r in reports), "a session had nothing sealed to ship"
print(len(reports))
'''

# List every archived session and read every byte of every object, in `jobs` threads: the
# floor for any tool that checks them all through the same client.
_READ_ARCHIVE = r'''
import sys
from concurrent.futures import ThreadPoolExecutor
import fsspec
url, jobs = sys.argv[1], int(sys.argv[2])
fs = fsspec.filesystem("s3")
sessions = fs.ls(url.split("://", 1)[1], detail=False)
def read(prefix):
    return sum(len(fs.cat_file(key)) for key in fs.ls(prefix, detail=False))
with ThreadPoolExecutor(jobs) as pool:
    print(sum(pool.map(read, sessions)))
'''


def archive_missing() -> str | None:
    """Why the archived figures cannot run here, or None when they can."""
    for module in ("moto.server", "s3fs", "fsspec"):
        try:
            __import__(module)
        except ImportError:
            return f"{module.split('.')[0]} not installed (pip install -e '.[bench]')"
    return None


def archived_count(cfg: Config) -> int:
    base = QUICK_ARCHIVED_SESSIONS if cfg.quick else ARCHIVED_SESSIONS
    return max(10, int(base * min(1.0, cfg.scale)))


def sweep_jobs() -> int:
    """walj sweep's default number of workers (threads, for an archive)."""
    return min(8, os.cpu_count() or 1)


class ArchivedRoot:
    """Ended sessions shipped to moto's S3 server on 127.0.0.1, built on first use; `close`
    stops the server. The children reach it through the environment alone, as a user would."""

    FAKE_AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def __init__(self, cfg: Config, env: dict[str, str]) -> None:
        self.local = cfg.workdir / "sweep-archived-local"
        self.sessions = archived_count(cfg)
        self.url = f"s3://{BUCKET}/sessions"
        self.env = dict(env)
        self._server: Any = None

    def get(self) -> str:
        if self._server is None:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            os.environ.update(self.FAKE_AWS)  # moto's own boto calls
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            self._server = server
            host, port = server.get_host_and_port()
            self.env.update(self.FAKE_AWS)
            self.env["FSSPEC_S3_ENDPOINT_URL"] = f"http://{host}:{port}"
            subprocess.run([sys.executable, "-c", _BUILD, str(self.local), str(self.sessions),
                            str(BLOCKED_EVERY), "end"], env=self.env, check=True,
                           capture_output=True)
            subprocess.run([sys.executable, "-c", _SHIP, str(self.local), self.url, BUCKET],
                           env=self.env, check=True, capture_output=True)
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def walj_sweep_archived(root: ArchivedRoot) -> Measure:
    """`python -m walj sweep URL --json` over every archived session."""

    def measure(_d: Path) -> Sample:
        url = root.get()
        return _timed([sys.executable, "-m", "walj", "sweep", url, "--json"], root.env,
                      root.sessions, (1,))

    return measure


def read_archive(root: ArchivedRoot) -> Measure:
    """List and read every archived object through s3fs, with walj sweep's thread count."""

    def measure(_d: Path) -> Sample:
        url = root.get()
        return _timed([sys.executable, "-c", _READ_ARCHIVE, url, str(sweep_jobs())], root.env,
                      root.sessions, (0,))

    return measure
