"""Small helpers shared by the log tests: listing segments and writing known logs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import walj


def segments(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.startswith("seg-") and p.suffix == ".jsonl")


def data_size(segment: Path) -> int:
    """How many bytes of a segment are data: a live writer's zeros after them are not."""
    return len(segment.read_bytes().rstrip(b"\0"))


def make_records(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"i": i, "text": f"record {i}", "pad": "p" * (i % 7)} for i in range(start, start + n)]


def write_log(path: Path, records: list[dict[str, Any]], **options: Any) -> None:
    with walj.Log.open(path, **options) as log:
        for record in records:
            log.append(record)


def all_data(path: Path, **options: Any) -> list[dict[str, Any]]:
    out = []
    for expected_seq, record in enumerate(walj.read(path, **options), start=1):
        assert record.seq == expected_seq
        out.append(record.data)
    return out


def load_script(path: Path) -> Any:
    """Import a script that is not in a package (benchmarks/, tools/) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strace_calls(trace: str) -> list[tuple[str, str]]:
    """(call, file) for every call of an `strace -f -o` trace, in order: the path an openat
    opened, the destination of a rename, the path of an unlink (unlinkat read as unlink) or of
    an rmdir, and for a call on a descriptor the path it was opened from ("?" when unknown).
    A pwrite64 (a write at an offset, as into a preallocated segment) reads as a write."""
    fds: dict[str, str] = {}
    calls: list[tuple[str, str]] = []
    for line in trace.splitlines():
        call = line.split(None, 1)[1] if line[:1].isdigit() else line
        op = call.split("(", 1)[0]
        args = call[len(op) + 1 :]
        op = "write" if op == "pwrite64" else op
        result = call.rsplit("=", 1)[-1].strip().split()[0] if "=" in call else ""
        if op == "openat":
            target = args.split('"')[1]
            if result.isdigit():
                fds[result] = target
        elif op == "rename":
            target = args.split('"')[3]
        elif op in ("unlink", "unlinkat"):
            target, op = args.split('"')[1], "unlink"
        elif op == "rmdir":
            target = args.split('"')[1]
        else:
            fd = re.match(r"\d+", args)
            target = fds.get(fd.group(0), "?") if fd else "?"
        calls.append((op, target))
    return calls


def wait_until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll `check` until it holds or `seconds` pass; its last answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def fingerprint(value: Any) -> str:
    """The reference fingerprint (docs/RECOVERY.md): SHA-256 of the value's canonical JSON, by
    the standard library's encoder alone, to check the journal's fast path against."""
    from walj.journal._fingerprint import canonical_json, sha256_text

    return sha256_text(canonical_json(value))
