"""walj.cli: the `walj` command (`main`): forensic reads, resolution and repair, the demo.

It promises: the read commands (verify, inspect, dump, tail, timeline, stats, sweep) take no
lock and never write, so they work on a copied directory and beside a live writer; every byte
they read is treated as hostile, and every string they print is escaped; `resolve` and
`repair` take the writer lock and never delete a byte. The read path runs on the standard
library alone (the forensic zipapp, tools/build_zipapp.py).

It sits above both layers and may read their internals (the scanner, the rebuild); nothing
below imports it.
"""

from __future__ import annotations

from ._main import main

__all__ = ["main"]
