"""`walj report`: every session under a root (or one session, or an archive) on one
self-contained HTML page for an operator, blocked sessions first, bounded in size."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from ..archive import is_url
from ._accounting import OWN_DIRS
from ._common import EXIT_OK, EXIT_PROBLEMS, CliError, plural, write_lines
from ._report_detail import check_session, session_detail
from ._report_html import PATH, esc, order_key, page, sessions_table
from ._report_session import section
from ._sweep import FINE, STATUSES, archived_logs, find_logs, job_count, relative


def cmd_report(args: argparse.Namespace) -> int:
    source: str = args.source
    if args.detail < 0:
        raise CliError("--detail must be 0 or more")
    if args.archive is not None and is_url(source):
        raise CliError("--archive goes with a local ROOT or PATH; a URL is read alone")
    output = _output_path(args.output)
    if args.archive is not None and not archived_logs(args.archive):  # readable, not empty
        raise CliError(f"{args.archive} holds no archived session (ARCHIVE/<log id>/, as "
                       "`walj archive SESSION_DIR --to ARCHIVE` ships them)")
    jobs = job_count(args)
    entries = _checked(source, args.archive, jobs)
    _refuse_inside(output, [e["path"] for e in entries if not is_url(e["path"])])
    entries.sort(key=order_key)
    chosen = entries[:args.detail]
    details, failed = _details(chosen, args.archive, jobs, _remote(source, args.archive))
    counts = {status: sum(1 for e in entries if e["status"] == status) for status in STATUSES}
    size = _write(output, _render(args, entries, chosen, details, counts))
    write_lines([f"{output}: {plural(len(entries), 'session')} "
                 f"({', '.join(f'{counts[s]:,} {s}' for s in STATUSES if counts[s])}), "
                 f"{len(chosen)} in full, {size:,} bytes"])
    fine = all(e["status"] in FINE for e in entries)
    return EXIT_OK if fine and not failed else EXIT_PROBLEMS


def _details(chosen: list[dict[str, Any]], archive: str | None, jobs: int,
             threads: bool) -> tuple[list[dict[str, Any]], bool]:
    """Each chosen session read in full, and whether any could not be read. An unreadable one
    is never read again: it may be a symbolic link, which is not followed."""
    readable = [e["path"] for e in chosen if e["status"] != "unreadable"]
    read = dict(zip(readable, _run(functools.partial(session_detail, archive=archive),
                                   readable, jobs, threads=threads), strict=True))
    details = [read.get(e["path"]) or {"path": e["path"], "error": e["detail"] or "unreadable"}
               for e in chosen]
    return details, any("error" in d for d in read.values())


def _render(args: argparse.Namespace, entries: list[dict[str, Any]],
            chosen: list[dict[str, Any]], details: list[dict[str, Any]],
            counts: dict[str, int]) -> str:
    """The page: a row for every session, then the chosen ones in full."""
    source: str = args.source
    now = time.time()
    anchors = {entry["path"]: f"s{i + 1}" for i, entry in enumerate(chosen)}

    def label(path: str) -> str:
        return relative(path, source) if path != source else path

    summary = [f"{esc(source, PATH)}" + (f" with its archive {esc(args.archive, PATH)}"
                                          if args.archive else ""),
               f"{plural(len(entries), 'session')}: " + ", ".join(
                   f"{counts[s]:,} {s}" for s in STATUSES if counts[s] or s in FINE)]
    bounds = (f"Blocked sessions first, then damaged ones, then the others, most recent activity "
              f"first. Shown in full below: the first {len(chosen)} in this order (at most "
              f"{args.detail}: --detail); every session has its row here. "
              "<code>walj inspect PATH</code> and <code>walj timeline PATH</code> show any "
              "session whole.")
    return page(esc(label(source), PATH), summary, sessions_table(entries, anchors, now, label),
                [section(anchors[e["path"]], e, d, label(e["path"]), now)
                 for e, d in zip(chosen, details, strict=True)], bounds)


def _remote(source: str, archive: str | None) -> bool:
    """Whether reading waits on an archive (threads) rather than on the CPU (processes)."""
    return is_url(source) or archive is not None


def _checked(source: str, archive: str | None, jobs: int) -> list[dict[str, Any]]:
    """Every session of `source` checked as `walj sweep` checks it."""
    if is_url(source):
        logs = archived_logs(source) or [source.rstrip("/")]
        unreadable: list[dict[str, Any]] = []
    else:
        logs, unreadable = find_logs(source)
    if not logs and not unreadable:
        raise CliError(f"{source} holds no walj log (no directory with seg-*.jsonl segments)")
    checked = _run(functools.partial(check_session, archive=archive), logs, jobs,
                   threads=_remote(source, archive))
    if len(logs) == 1 and is_url(source) and checked[0]["status"] == "unreadable":
        raise CliError(str(checked[0]["detail"]))  # neither an archive root nor a session
    return checked + unreadable


def _run(task: Callable[[str], dict[str, Any]], paths: list[str], jobs: int, *,
         threads: bool) -> list[dict[str, Any]]:
    """`task` of each path, in order: in this process (`--jobs 1`), in threads (an archive:
    reading waits on the network) or in worker processes (reading a directory is CPU work)."""
    workers = min(jobs, len(paths))
    if workers <= 1:
        return [task(path) for path in paths]
    if not threads:
        try:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                return list(pool.map(task, paths, chunksize=max(1, len(paths) // (jobs * 8))))
        except (OSError, NotImplementedError, ImportError):
            pass  # no working multiprocessing here: threads
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(task, paths))


def _output_path(output: str) -> str:
    """Where the page goes: a file in an existing directory (never a log's segment)."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise CliError(f"{output}: no such directory {parent}")
    if os.path.isdir(output):
        raise CliError(f"{output} is a directory; -o takes the report's file name")
    return output


def _refuse_inside(output: str, sessions: list[str]) -> None:
    """A report reads sessions and writes nothing in them: never its page (nor its temporary
    file) into a session directory or one of its own directories."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(output)))
    inside = {parent, os.path.dirname(parent)}
    for session in sessions:
        real = os.path.realpath(session)
        if real == parent or (real in inside and os.path.basename(parent) in OWN_DIRS):
            raise CliError(f"{output} is inside the session {session}: a report writes "
                           "nothing into a session; write it elsewhere")


def _write(output: str, text: str) -> int:
    """Write the page whole or not at all: a temporary file beside it, renamed over it, so an
    interrupted report never leaves half a page. Readable by its owner only, as it quotes the
    logs (argument previews, outputs' errors, notes)."""
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".walj-report-", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(output)))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(data)
