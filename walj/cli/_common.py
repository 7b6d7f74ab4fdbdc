"""Shared plumbing of the commands: exit codes, input checks, scanning with progress, output."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from .._codec import MAX_DEPTH
from ..archive import ArchiveError, is_url
from ..log import format as fmt
from ..log.fs import DEFAULT_FS, FileSystem
from ..log.lock import holds_lock, owner_info
from ..log.scan import LogScan, TornTail
from ..log.segment import Problem, read_header
from ._model import time_of

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_QUEUED = 3  # `walj resolve`: a live writer did not answer its request within the wait
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure the command reports as one line on stderr, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- input ----------------------------------------------------------------------------------


def segment_names(path: str) -> list[str]:
    """The segment file names in directory `path`, in log order; CliError if it is not a log."""
    if not os.path.lexists(path):
        raise CliError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        if fmt.segment_index(os.path.basename(path)) is not None:
            parent = os.path.dirname(path) or "."
            raise CliError(f"{path} is a segment file; a walj log is the directory that holds "
                           f"it: try {parent}")
        raise CliError(f"{path} is a file, not a walj log (a log is a directory of segments)")
    try:
        names = os.listdir(path)
    except PermissionError:
        raise CliError(f"{path}: permission denied") from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read the directory: {exc.strerror or exc}") from None
    found = sorted(n for n in names if fmt.segment_index(n) is not None)
    if not found:
        hint = ""
        if any(_holds_segments(os.path.join(path, n)) for n in names):
            hint = f"; it holds session logs: try `walj sweep {path}`"
        raise CliError(f"{path} is not a walj log (no seg-*.jsonl segment in it){hint}")
    return found


def open_log(path: str, archive: str | None = None) -> tuple[str, FileSystem, list[str]]:
    """The log a read command reads, as (directory, file system, segment names): a local
    directory, an archived session's URL, or a local session continued from its archive root
    (`--archive`). An archive view is opened only for those two (never fsspec otherwise).
    """
    if archive is None and not is_url(path):
        return path, DEFAULT_FS, segment_names(path)
    from ..archive._view import open_view

    if archive is not None:
        segment_names(path)  # a local session directory, with its checks and hints
    try:
        view = open_view(path if archive is None else archive,
                         local=None if archive is None else path)
        names = view.listdir(view.directory)
    except (ArchiveError, ImportError) as exc:
        raise CliError(str(exc)) from None
    if not names:
        raise CliError(f"{path} holds no archived segment (an archived session is "
                       "ARCHIVE/<log id>; `walj sweep ARCHIVE` lists them)")
    return view.directory, view, names


def _holds_segments(path: str) -> bool:
    try:
        return os.path.isdir(path) and any(
            fmt.segment_index(n) is not None for n in os.listdir(path))
    except OSError:
        return False


def segment_bytes(path: str, names: Iterable[str], fs: FileSystem = DEFAULT_FS) -> int:
    total = 0
    for name in names:
        with contextlib.suppress(OSError):
            total += fs.stat(os.path.join(path, name)).st_size
    return total


def log_created(path: str, names: Sequence[str],
                fs: FileSystem = DEFAULT_FS) -> float | None:
    """When the log began: the `created` time of its first segment's header, if it verifies."""
    if not names:
        return None
    try:
        header = read_header(fs, path, names[0])
    except OSError:
        return None
    return time_of(header.created) if header is not None and header.first_seq == 1 else None


def last_writer(path: str) -> dict[str, Any] | None:
    """The writer that last took the log's lock, from LOCK.owner (read, never locked): its
    writer id, whether that process still runs on this host, and whether it still holds the
    lock (from the kernel's table of locks; None: another host, or no table, so unknown)."""
    info = owner_info(path)
    if info is None:
        return None
    pid, host, since, writer = info
    running: bool | None = None
    holds: bool | None = None
    if host == socket.gethostname():
        try:
            if pid <= 0:  # kill() would take it for a process group, or every process
                raise ProcessLookupError
            os.kill(pid, 0)
            running = True
        except PermissionError:
            running = True
        except (OSError, OverflowError, ValueError):
            running = False
        holds = holds_lock(path, pid) if running else False
    return {"pid": pid, "host": host, "since": since, "running": running,
            "writer_id": writer, "holds_lock": holds}


def os_error(exc: OSError) -> CliError:
    where = exc.filename if exc.filename else "input"
    if isinstance(exc, PermissionError):
        return CliError(f"{where}: permission denied")
    return CliError(f"{where}: {exc.strerror or exc}")


# --- scanning -------------------------------------------------------------------------------


class Progress:
    """A byte counter shown on stderr by tqdm, only when stderr is a terminal and tqdm is
    installed; otherwise every call does nothing."""

    def __init__(self, total: int, desc: str) -> None:
        self._pending = 0
        bar = progress_bar()
        self._bar: Any = None if bar is None else bar(
            total=total, desc=desc, unit="B", unit_scale=True, delay=0.5, leave=False,
            file=sys.stderr)

    def add(self, count: int) -> None:
        if self._bar is not None:
            self._pending += count
            if self._pending >= 1 << 20:
                self._bar.update(self._pending)
                self._pending = 0

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def progress_wanted() -> bool:
    try:
        return sys.stderr.isatty() and not os.environ.get("WALJ_NO_PROGRESS")
    except (AttributeError, ValueError):
        return False


def progress_bar() -> Any:
    """tqdm's bar class when a bar is to be shown (progress_wanted) and tqdm is installed."""
    if not progress_wanted():
        return None
    try:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    return tqdm


def scan(path: str, names: Sequence[str], *, start_seq: int = 0, desc: str = "scanning",
         fs: FileSystem = DEFAULT_FS) -> tuple[LogScan, Iterator[tuple[int, bytes]]]:
    """A read-only LogScan of the log in salvage mode (every record that verifies; problems are
    kept, never raised) and an iterator over its (seq, data) pairs, which drives a progress bar
    when one is shown. An archive view adds its own end check once the scan is done."""
    log_scan = LogScan(path, mode="salvage", start_seq=start_seq, fs=fs)
    finish = getattr(fs, "finish", None)
    if not progress_wanted() and finish is None:
        return log_scan, iter(log_scan)

    def records() -> Iterator[tuple[int, bytes]]:
        progress = Progress(segment_bytes(path, names, fs), desc)
        add = progress.add
        try:
            for seq, data in log_scan:
                add(len(data) + 40)
                yield seq, data
        finally:
            progress.close()
        if finish is not None:
            finish(log_scan)

    return log_scan, records()


def problem_json(problem: Problem) -> dict[str, Any]:
    return {"file": problem.file, "offset": problem.offset, "seq": problem.seq,
            "kind": problem.kind, "detail": problem.detail}


def torn_json(torn: TornTail | None) -> dict[str, Any] | None:
    if torn is None:
        return None
    return {"file": torn.file, "offset": torn.offset, "length": torn.length, "kind": torn.kind}


# --- output ---------------------------------------------------------------------------------

# Every string from a log (a tool's output, an exception message, a tool name a model chose, a
# file name in the directory) is hostile: on a terminal, ESC, C1 and the bidi controls could
# write the clipboard, retitle the window, clear the screen or reorder what is shown. Lone
# surrogates cannot be written at all. Text views show each as an escape, `\x1b` or `\u202e`.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# JSON already escapes C0; these others are legal raw in a JSON string, so they are escaped too.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` safe for a terminal: every control character shown as an escape. Every text view
    writes through this (write_lines, table, short, warn, the record rows of dump and tail)."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def json_text(text: str) -> str:
    """JSON text with DEL, C1, bidi controls and lone surrogates as \\u escapes: the same JSON
    value, and safe on a terminal. Outside strings JSON has only ASCII, so this is lossless."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_ready(value: Any, depth: int = 0) -> Any:
    """`value` with what strict JSON cannot hold replaced by null: NaN and Infinity, integers
    too long to write, and containers nested deeper than a log record may be."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value.bit_length() < 10_000 else None
    if depth >= MAX_DEPTH + 8 and isinstance(value, (dict, list, tuple)):
        return None
    if isinstance(value, dict):
        return {str(k): json_ready(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v, depth + 1) for v in value]
    return value


def emit_json(value: Any, out: IO[str] | None = None) -> None:
    """Write `value` as strict JSON: never NaN or Infinity (a strict parser refuses them)."""
    stream = out or sys.stdout
    try:
        text = json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False)
    except (ValueError, RecursionError):
        text = json.dumps(json_ready(value), ensure_ascii=False, indent=2, allow_nan=False)
    stream.write(json_text(text) + "\n")


def opt_str(value: Any) -> str | None:
    """A field that should be a string: itself, or None (unknown) when it is not one."""
    return value if isinstance(value, str) else None


def str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def int_list(value: Any) -> list[int]:
    return [v for v in value if type(v) is int] if isinstance(value, list) else []


def clock(t: Any) -> str:
    """A Unix time as `YYYY-MM-DD HH:MM:SS` UTC, or '-' (unknown, or no plausible time)."""
    t = time_of(t)
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def duration(seconds: float | None) -> str:
    """A short human duration: 250ms, 4.2s, 3m12s, 5h04m, 2d03h."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def short(text: Any, width: int) -> str:
    """One printable line of at most `width` characters; a cut ends with '…'."""
    value = "-" if text is None else text if isinstance(text, str) else _describe(text)
    value = printable(" ".join(value.split()))
    if len(value) <= width:
        return value
    return value[: max(0, width - 1)] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "  ",
          right: Iterable[int] = ()) -> list[str]:
    """Rows aligned under their headers; columns in `right` (indices) align right."""
    cells = [["-" if c is None else printable(str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    right_set = set(right)

    def line(row: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right_set else c.ljust(widths[i])
                 for i, c in enumerate(row)]
        return (indent + "  ".join(parts)).rstrip()

    return [line(list(headers))] + [line(row) for row in cells]


def write_lines(lines: Iterable[str], out: IO[str] | None = None) -> None:
    stream = out or sys.stdout
    for text in lines:
        stream.write(printable(text) + "\n")


def warn(text: str) -> None:
    """One printable line on stderr."""
    sys.stderr.write(printable(text) + "\n")
    sys.stderr.flush()


def _describe(value: Any) -> str:
    """A value as text. A container or a number from a record may be too deep or too long for
    str(), so those are shown as (bounded) JSON."""
    if isinstance(value, bool) or not isinstance(value, (dict, list, tuple, int, float)):
        return str(value)
    try:
        return json.dumps(json_ready(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else (words or word + 's')}"
