"""`walj archive SESSION_DIR --to URL`: ship a session's sealed segments and quarantined cuts
to an archive."""

from __future__ import annotations

import argparse

from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    emit_json,
    plural,
    segment_names,
    write_lines,
)

QUARANTINE = "quarantine/"


def cmd_archive(args: argparse.Namespace) -> int:
    from ..archive import ArchiveError, ForkError, ship

    segment_names(args.path)  # a session directory, with the same checks and hints as a read
    try:
        report = ship(args.path, args.to, recheck=args.recheck)
    except ForkError as exc:  # a refused write, like damage: exit 1
        raise CliError(str(exc), EXIT_PROBLEMS) from None
    except (ArchiveError, ImportError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        emit_json({**report.to_json(), "path": args.path})
        return EXIT_PROBLEMS if report.unverified else EXIT_OK
    if report.log_id is None:
        write_lines([f"{args.path}: no sealed segment yet; nothing to ship"])
        return EXIT_OK
    segments = [n for n in report.shipped if not n.startswith(QUARANTINE)]
    cuts = [n for n in report.shipped if n.startswith(QUARANTINE)]
    lines = [f"{args.path} -> {report.url}/",
             f"  shipped {plural(len(segments), 'segment')}"
             + (f" and {plural(len(cuts), 'quarantine file')}" if cuts else "")
             + f" ({report.bytes:,} bytes, each read back and verified), "
             f"{len(report.skipped)} already archived"]
    if report.repaired:
        lines.append(f"  repaired {plural(len(report.repaired), 'object')} that held a partial "
                     "or damaged copy of the same bytes: " + ", ".join(report.repaired))
    if report.unverified:
        lines.append(f"  {plural(len(report.unverified), 'quarantine file')} that do not match "
                     "their manifest line, shipped as they are (kept by prune): "
                     + ", ".join(report.unverified))
    write_lines(lines)
    return EXIT_PROBLEMS if report.unverified else EXIT_OK
