"""walj.log: the storage layer. A segmented, checksummed, append-only JSONL log on plain files.

It promises: a record `append` acknowledged as durable survives a crash; every line carries an
XXH64 checksum of its own bytes, seqs are contiguous, and sealed segments chain by SHA-256; on
open a torn tail is told from damage, its bytes kept in quarantine/, and damage refused with a
typed error naming file, offset and seq; one writer per directory. Durability is a property of
the order of system calls, all of which go through the FileSystem seam (`fs.py`).

It never interprets a record's contents (a record is a JSON object it stores and hands back),
and never imports the journal, the CLI or an integration. Its public surface is below; the
internal hooks above it are `Log.open(_replay=...)`, the callback that sees each verified
record's data bytes during the open's own scan, so a layer above can rebuild its state in the
same pass, and `_replay_start`, which picks the segment that scan begins at from the first
bytes of each segment's first record (the segments before it are checked by header and seal,
their records not read).

Its surface for the layers above: this package's names, and the public modules below, each with an
`__all__` (nothing above the log imports a private module or name of it): format (the line format:
framing, XXH64 checksums, header, seal, segment names; the code twin of docs/FORMAT.md), fs (the
I/O seam, an interface the archive implements for its read-only view), lines (splitting a file into
lines through the seam), segment (reading one segment file, resumable where a read stopped: the one
reader every scan uses), scan (reading a whole directory: order, seal chain, torn tail or damage),
lock (one writer per directory), quarantine (cut bytes and their manifest). Private: _xxh64 (pure-
Python XXH64), _log (the writer: a plain class composing the three parts after it), _durability
(the writer's state, poisoning), _group (sync modes, group commit), _rotation (the active segment:
creating, sealing, switching), _compaction (where the log begins: Log.drop_before), _opening
(options and tail recovery), _read (reader and verifier, of a directory or of a FileSystem view:
`read_view`, `verify_view`), _base (the BASE marker of a compacted log), _syncers (the interval
syncers), _commits (the process-wide commit service), _requests (request files in `requests/`:
asks another process leaves for the live writer).
"""

from __future__ import annotations

from ._base import Base
from ._commits import commit_stats, set_commit_mode
from ._log import Log
from ._read import Record, VerifyReport, read, read_view, verify, verify_view
from ._requests import (
           PICK_UP_LIMIT,
           REQUEST_LIMIT,
           REQUESTS_DIR,
           MalformedRequestError,
           RequestWatch,
)
from ._requests import holds_log as holds_log
from ._requests import load as load_request
from ._requests import pending as pending_requests
from ._requests import post as post_request
from ._requests import remove as remove_request
from ._requests import remove_stale as remove_stale_requests
from .format import BASE_NAME
from .quarantine import CutLine, Quarantined

__all__ = ["BASE_NAME", "PICK_UP_LIMIT", "REQUESTS_DIR", "REQUEST_LIMIT", "Base",
           "CutLine", "Log",
           "MalformedRequestError", "Quarantined", "Record", "RequestWatch", "VerifyReport",
           "holds_log", "load_request", "pending_requests", "post_request", "read", "read_view",
           "remove_request", "remove_stale_requests", "set_commit_mode", "commit_stats",
           "verify", "verify_view"]
