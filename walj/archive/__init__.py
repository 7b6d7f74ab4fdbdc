"""walj.archive: sealed segments in object storage. Ship them, then read and verify them there.

Sealed segments are immutable files that carry their own SHA-256 seal and chain to the one
before, so they make good objects: `ship` copies a session's sealed segments, and its
quarantined cuts, to ARCHIVE/<log_id>/ under their own names and reads each copy back before
counting it; it never deletes, never takes the writer's lock, and never writes over an object
that holds bytes the session lacks (a fork is a ForkError: the archive is append-only). `read`
and `verify` read an archived session, alone or followed by its local directory, with the log
layer's own scanner (through its FileSystem seam, see _view), so the seal chain is checked
across the boundary and every object is read as untrusted input.

A plain path or file:// URL needs nothing beyond the standard library; any other URL goes
through fsspec (`pip install 'walj[s3]'` for s3://), and credentials and endpoints come the
fsspec way: storage_options, FSSPEC_S3_* and AWS_* variables, profiles. This package is never
imported by `import walj`.

Modules: _store (local and fsspec object stores), _append (the append-only rule), _view (the
read-only seam over one session), _ship (copy and verify), _report (what a ship did),
_quarantine (the cut bytes and their manifest), _read (read and verify).
"""

from __future__ import annotations

from ._append import ForkError
from ._read import read, verify
from ._report import ShipReport
from ._ship import ship, verified_copies
from ._store import ArchiveError, is_url
from ._view import archived_sessions

__all__ = ["ArchiveError", "ForkError", "ShipReport", "archived_sessions", "is_url", "read", "ship",
           "verified_copies", "verify"]
