"""The writer's check that its segment still has a name (after each sync) asks for the link
count alone: a stat that reads a file's times makes Linux (6.13 and later) give the next write a
fine-grained mtime, and on ext4 the fdatasync after it then commits the inode through the
journal, a metadata commit per append that preallocation exists to avoid."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import walj
from walj.log.fs import FileSystem

STRACE = shutil.which("strace")
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def test_link_count_follows_the_names_of_an_open_file(tmp_path: Path) -> None:
    fs, path = FileSystem(), tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert fs.link_count(fd) == 1
        os.link(path, tmp_path / "g")
        assert fs.link_count(fd) == 2
        os.unlink(path)
        os.unlink(tmp_path / "g")
        assert fs.link_count(fd) == 0
    finally:
        os.close(fd)


def test_a_writer_whose_segment_was_unlinked_is_poisoned_after_its_next_sync(
        tmp_path: Path) -> None:
    log = walj.Log.open(tmp_path / "log")
    log.append({"n": 1})
    (segment,) = sorted((tmp_path / "log").glob("seg-*.jsonl"))
    segment.unlink()
    with pytest.raises(walj.PoisonedError, match="deleted"):
        log.append({"n": 2})
    with pytest.raises(walj.PoisonedError):
        log.close()


CHILD = textwrap.dedent("""
    import sys, walj
    log = walj.Log.open(sys.argv[1], sync="always")
    for n in range(200):
        log.append({"n": n})
    log.close()
""")


@pytest.mark.skipif(STRACE is None or not sys.platform.startswith("linux"),
                    reason="needs strace on Linux")
def test_durable_appends_never_read_the_segments_times(tmp_path: Path) -> None:
    """Between the segment's first write and its close, no stat of the segment asks for more
    than its link count (-y names each descriptor's file)."""
    out, path = tmp_path / "trace", tmp_path / "log"
    subprocess.run([STRACE, "-f", "-qq", "-y", "-o", str(out), "-e",
                    "trace=%stat,%fstat,statx,pwrite64,fdatasync", sys.executable, "-c", CHILD,
                    str(path)], check=True, env=ENV)
    lines = [line for line in out.read_text().splitlines() if "seg-" in line]
    writes = [i for i, line in enumerate(lines) if "pwrite64(" in line]
    assert len(writes) >= 200
    between = lines[writes[0]:writes[-1]]
    stats = [line for line in between if re.search(r"\b(new)?f?stat(at)?\(|\blstat\(", line)]
    assert stats == [], stats[:3]
    counts = [line for line in between if "statx(" in line]
    assert len(counts) >= 199 and all("STATX_NLINK" in line and "STATX_MTIME" not in line
                                      and "STATX_BASIC_STATS" not in line for line in counts)
