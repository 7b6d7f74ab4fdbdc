"""walj.cli: the `walj` command (`main`): forensic reads, resolution and repair, the demo.

It promises: the read commands (verify, inspect, dump, tail, timeline, stats, sweep) take no
lock and never write, so they work on a copied directory and beside a live writer; every byte
they read is treated as hostile, and every string they print is escaped; `resolve` and
`repair` take the writer lock and never delete a byte. The read path runs on the standard
library alone (the forensic zipapp, tools/build_zipapp.py).

It sits above both layers; nothing below imports it. From the log it takes only declared
names (walj.log and its public modules); every import of the journal's private record and
state modules is in _model, which also holds the one rebuild of a journal's state the commands
share. Each command builds a model (scan, rebuild, classify), then renders it as text or JSON.
"""

from __future__ import annotations

from ._main import main

__all__ = ["main"]
