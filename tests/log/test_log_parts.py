"""The writer's parts (walj/log/_durability.py, _rotation.py, _compaction.py) hold the state
they share and nothing of the Log, so a Log is freed the moment its last reference goes."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import walj


@pytest.mark.parametrize("sync", ["always", "batch", "interval", "never"])
def test_a_log_dropped_without_close_is_closed_at_once_without_the_cycle_collector(
        tmp_path: Path, sync: str) -> None:
    """A part holding the Log (or a bound method of it) would make a reference cycle: a log
    dropped without close() would then keep its lock and descriptor until the cycle collector
    happened to run, and its records appended since the last sync would stay unsynced."""
    path = tmp_path / sync
    gc.collect()
    gc.disable()
    try:
        log = walj.Log.open(path, sync=sync, sync_interval_ms=60_000)
        log.append({"n": 1})
        log.append_many([{"n": 2}, {"n": 3}])
        log.drop_before(1)
        with pytest.warns(ResourceWarning, match="unclosed"):
            del log
        with walj.Log.open(path) as again:  # the directory was released: not "already open"
            assert again.durable_seq == again.last_seq == 3
    finally:
        gc.enable()
    assert [r.data for r in walj.read(path)] == [{"n": 1}, {"n": 2}, {"n": 3}]
