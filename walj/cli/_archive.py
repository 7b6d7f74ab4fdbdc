"""`walj archive SESSION_DIR --to URL`: ship a session's sealed segments to an archive."""

from __future__ import annotations

import argparse

from ._common import EXIT_OK, CliError, emit_json, plural, segment_names, write_lines


def cmd_archive(args: argparse.Namespace) -> int:
    from ..archive import ArchiveError, ship

    segment_names(args.path)  # a session directory, with the same checks and hints as a read
    try:
        report = ship(args.path, args.to, recheck=args.recheck)
    except (ArchiveError, ImportError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        emit_json({**report.to_json(), "path": args.path})
        return EXIT_OK
    if report.log_id is None:
        write_lines([f"{args.path}: no sealed segment yet; nothing to ship"])
        return EXIT_OK
    lines = [f"{args.path} -> {report.url}/",
             f"  shipped {plural(len(report.shipped), 'segment')} ({report.bytes:,} bytes, each "
             f"read back and verified), {len(report.skipped)} already archived"]
    if report.replaced:
        lines.append(f"  replaced {plural(len(report.replaced), 'object')} that did not match: "
                     + ", ".join(report.replaced))
    write_lines(lines)
    return EXIT_OK
