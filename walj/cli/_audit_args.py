"""`walj audit`'s command line: its arguments, and the times --since and --until take."""

from __future__ import annotations

import argparse
import datetime
import math
from typing import Any

from ._common import CliError

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_LAST = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.timezone.utc)

AUDIT_DESCRIPTION = """\
Export one row per tool execution, resolution and approval request or decision of every
session under ROOT (or of one session, or an archive), ending with a manifest: each
segment's seal digest, each session's chain head, the filters, and the rows' own SHA-256.
With --verify FILE, derive the rows again from the logs and compare: exit 0 exactly when the
export matches them, 1 when it does not (one line per finding), 2 on unreadable input."""


def add_audit_parser(sub: Any) -> None:
    """Register `walj audit` on the subcommands `sub` of the walj parser."""
    p = sub.add_parser("audit", help="a verifiable export of executions, resolutions and "
                       "approvals (or --verify one)", description=AUDIT_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="ROOT|PATH|URL",
                   help="a directory of sessions, one session, or an archive URL")
    p.add_argument("--archive", metavar="URL", help="the archive root the sessions were "
                   "shipped to: each session is read from it, then from its directory")
    p.add_argument("--since", metavar="T", help="only rows at or after T (ISO 8601 or unix "
                   "time; without a zone, UTC)")
    p.add_argument("--until", metavar="T", help="only rows before T (ISO 8601 or unix time)")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl",
                   help="JSON Lines with the manifest as its last line (default), or CSV "
                   "with the manifest beside it in FILE.manifest.json")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write the export")
    p.add_argument("--verify", metavar="FILE", help="check this export against the logs")
    p.add_argument("--json", action="store_true",
                   help="--verify: print the documented JSON schema")


def parse_time(text: str | None, option: str) -> float | None:
    """A --since or --until value as a unix time: a number, or an ISO 8601 date and time
    (UTC when it names no zone). CliError for anything else, or a time outside 1970-9999."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = _iso_time(text, option)
    if not math.isfinite(value) or not 0 <= value <= (_LAST - _EPOCH).total_seconds():
        raise CliError(f"{option} {text!r} is outside 1970-9999")
    return value


def _iso_time(text: str, option: str) -> float:
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00")
                                                 .replace("z", "+00:00"))
    except ValueError:
        raise CliError(f"{option} {text!r} is neither an ISO 8601 time "
                       "(2026-12-05T06:00:00Z) nor a unix time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return (moment - _EPOCH).total_seconds()


def iso_time(t: float | None) -> str | None:
    """A unix time as ISO 8601 UTC with microseconds (`2026-12-05T06:00:00.123000Z`)."""
    if t is None:
        return None
    moment = _EPOCH + datetime.timedelta(seconds=t)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
