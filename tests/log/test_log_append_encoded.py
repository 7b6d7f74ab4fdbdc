"""Log.append_encoded: records the caller already encoded, one write and at most one sync for
several, and the same refusals as append (typed, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import all_data, segments

import walj
from walj.log.format import encode_record


def test_append_encoded_writes_what_append_would(logdir: Path, tmp_path: Path) -> None:
    records = [{"i": i, "text": "é\n\u2028", "f": 1.5} for i in range(4)]
    with walj.Log.open(logdir) as log, walj.Log.open(tmp_path / "plain") as plain:
        assert log.append_encoded(encode_record(records[0])) == 1
        assert log.append_encoded(*(encode_record(r) for r in records[1:]), durable=True) == 4
        for record in records:
            plain.append(record)
    assert all_data(logdir) == records
    ours, theirs = segments(logdir)[0].read_bytes(), segments(tmp_path / "plain")[0].read_bytes()
    # The same lines (the header differs only by the log's own id).
    assert ours.splitlines()[1:] == theirs.splitlines()[1:]


@pytest.mark.parametrize("bad", [b"", b"[1]", b'{"a":1}\n{"b":2}', b'{"a":1', "{}",
                                 bytearray(b"{}")])
def test_append_encoded_refuses_what_is_not_one_encoded_record(logdir: Path,
                                                               bad: object) -> None:
    with walj.Log.open(logdir) as log:
        log.append({"ok": 1})
        size = segments(logdir)[0].stat().st_size
        with pytest.raises(walj.SerializationError):
            log.append_encoded(bad)  # type: ignore[arg-type]
        with pytest.raises(walj.SerializationError):
            log.append_encoded(b'{"ok":2}', bad)  # type: ignore[arg-type]
        with pytest.raises(walj.SerializationError):
            log.append_encoded()
        assert segments(logdir)[0].stat().st_size == size
        assert log.append_encoded(b'{"ok":3}') == 2
    assert all_data(logdir) == [{"ok": 1}, {"ok": 3}]


def test_append_encoded_refuses_a_record_too_large(logdir: Path) -> None:
    with walj.Log.open(logdir, max_record_bytes=1000) as log:
        with pytest.raises(walj.RecordTooLargeError):
            log.append_encoded(b'{"a":1}', encode_record({"x": "y" * 1000}))
        assert log.append_encoded(encode_record({"x": "y" * 900})) == 1
