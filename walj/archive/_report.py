"""What one ship did: the report `walj.archive.ship` returns and `walj archive` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._append import SKIPPED


@dataclass
class ShipReport:
    """What one `ship` did, by name in the session directory (a segment, `quarantine/<file>`,
    `quarantine/MANIFEST.jsonl`). `shipped` were written as new objects and read back intact;
    `repaired` were written over a partial or damaged copy of the same bytes (nothing it held
    is lost); `skipped` were archived already; `bytes` is what was copied. A quarantine file
    that does not match its own manifest line is shipped as it is and listed in
    `unverified` too, never among the copies a caller may drop (verified_copies)."""

    log_id: str | None
    url: str
    shipped: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    bytes: int = 0

    def count(self, outcome: str, name: str, size: int) -> None:
        getattr(self, outcome).append(name)
        if outcome != SKIPPED:
            self.bytes += size

    def to_json(self) -> dict[str, Any]:
        return {"schema": "walj.archive/2", "log_id": self.log_id, "url": self.url,
                "shipped": list(self.shipped), "repaired": list(self.repaired),
                "skipped": list(self.skipped), "unverified": list(self.unverified),
                "bytes": self.bytes}
