"""Reading and verifying an archived session (and its local tail) with the log's own scanner."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .. import _codec
from ..errors import CorruptionError
from ..log import Record, VerifyReport
from ..log.scan import LogScan
from ._view import archive_problem, open_view


def verify(url: str | os.PathLike[str], *, local: str | os.PathLike[str] | None = None,
           storage_options: dict[str, Any] | None = None) -> VerifyReport:
    """`walj.verify` of an archived session: every checksum, seq, header, seal and the seal
    chain, read-only. Without `local`, `url` is ARCHIVE/<log_id>; with it, `url` is the
    archive root and the local session's segments continue the archived ones."""
    view = open_view(url, local=local, storage_options=storage_options)
    scan = LogScan(view.directory, mode="salvage", fs=view)
    for _ in scan:
        pass
    view.finish(scan)
    return VerifyReport(ok=not scan.problems, records=scan.records, segments=scan.segments,
                        torn_tail=scan.torn_tail, problems=scan.problems, log_id=scan.log_id,
                        last_seq=scan.last_seq)


def read(url: str | os.PathLike[str], start_seq: int = 0, *,
         local: str | os.PathLike[str] | None = None, recovery: str = "tolerate_tail",
         storage_options: dict[str, Any] | None = None) -> Iterator[Record]:
    """`walj.read` of an archived session (arguments as for `verify`): records in order from
    `start_seq`, each checksum verified before it is yielded; damage raises CorruptionError
    when reached, and so does an archived last segment without a seal (recovery="salvage"
    skips what does not verify instead)."""
    view = open_view(url, local=local, storage_options=storage_options)
    scan = LogScan(view.directory, mode=recovery, start_seq=start_seq, fs=view,
                   follow_rotation=True, report_holes=True)
    decode, decode_error = _codec.raw_decoder()
    salvage = recovery == "salvage"
    for seq, data in scan:
        try:
            value = decode(data)
        except (decode_error, RecursionError) as exc:
            if salvage:
                continue
            raise CorruptionError(f"record {seq} of {view.directory} cannot be decoded: {exc}",
                                  seq=seq, kind="bad_line") from exc
        yield Record(seq, value)
    problem = archive_problem(view, scan)
    if problem is not None and not salvage:
        raise CorruptionError(problem.describe(), file=problem.file, offset=problem.offset,
                              seq=problem.seq, kind=problem.kind)
