"""read_log, behind GetLaunchLogs: a log's tail, then what follows an offset, whole lines only
while the launch runs, so that a follower that joins the pieces gets the log exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from cgsvc.domain import launches
from cgsvc.domain.launches import read_log


def test_tail_then_whole_lines_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    text, end = read_log(log, 2)
    assert (text, end) == ("two\nthree", 14)  # the tail, and the offset past the whole file
    with log.open("ab") as fh:
        fh.write("four \u00e9\nfi".encode())  # a line still being written
    text, end2 = read_log(log, 2, after=end, ended=False)
    assert text == "four \u00e9\n" and end2 == end + len("four \u00e9\n".encode())
    assert read_log(log, 2, after=end2, ended=False) == ("", end2)  # nothing whole yet: wait
    with log.open("ab") as fh:
        fh.write(b"ve")
    assert read_log(log, 2, after=end2, ended=True) == ("five", log.stat().st_size)  # ended: the rest, as is
    pieces, offset = [], 0
    for _ in range(3):
        text, offset = read_log(log, 0, after=offset, ended=True)
        pieces.append(text)
    assert "".join(pieces).encode() == log.read_bytes()


def test_chunks_are_bounded_and_a_replaced_file_reads_from_the_start(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launches, "LOG_CHUNK_BYTES", 8)
    log = tmp_path / "rank1.log"
    log.write_bytes(b"ab\ncdefghijklmnop\nq\n")
    got, offset = [], 0
    while offset < log.stat().st_size:
        text, offset = read_log(log, 0, after=offset, ended=False)
        got.append(text)
    # a full chunk is cut after its last newline; a line longer than a chunk goes in pieces
    assert got == ["ab\n", "cdefghij", "klmnop\n", "q\n"]
    assert read_log(log, 0, after=10_000, ended=True) == ("ab\n", 3)  # past the end: from the start
    assert read_log(tmp_path / "absent.log", 0, after=5) == ("", 5)
