"""Reading and verifying an archived session (and its local tail) with the log's own reader."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ..log import Record, VerifyReport, read_view, verify_view
from ._view import archive_problem, open_view


def verify(url: str | os.PathLike[str], *, local: str | os.PathLike[str] | None = None,
           storage_options: dict[str, Any] | None = None) -> VerifyReport:
    """`walj.verify` of an archived session: every checksum, seq, header, seal and the seal
    chain, read-only. Without `local`, `url` is ARCHIVE/<log_id>; with it, `url` is the
    archive root and the local session's segments continue the archived ones."""
    view = open_view(url, local=local, storage_options=storage_options)
    return verify_view(view.directory, view, finish=view.finish)


def read(url: str | os.PathLike[str], start_seq: int = 0, *,
         local: str | os.PathLike[str] | None = None, recovery: str = "tolerate_tail",
         storage_options: dict[str, Any] | None = None) -> Iterator[Record]:
    """`walj.read` of an archived session (arguments as for `verify`): records in order from
    `start_seq`, each checksum verified before it is yielded; damage raises CorruptionError
    when reached, and so does an archived last segment without a seal (recovery="salvage"
    skips what does not verify instead)."""
    view = open_view(url, local=local, storage_options=storage_options)
    yield from read_view(view.directory, view, start_seq, recovery=recovery,
                         end_problem=lambda scan: archive_problem(view, scan))
