"""read_log, behind GetLaunchLogs: a log's tail, then what follows an offset, whole lines only
while the launch runs, so that a follower that joins the pieces gets the log exactly."""

from __future__ import annotations

from pathlib import Path

from cgsvc.domain.launches import read_log


def test_tail_then_whole_lines_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    text, end, size = read_log(log, 2)
    assert (text, end, size) == ("two\nthree", 14, 14)  # the tail, and the offset past the whole file
    with log.open("ab") as fh:
        fh.write("four \u00e9\nfi".encode())  # a line still being written
    text, end2, _ = read_log(log, 2, after=end, ended=False)
    assert text == "four \u00e9\n" and end2 == end + len("four \u00e9\n".encode())
    assert read_log(log, 2, after=end2, ended=False)[:2] == ("", end2)  # nothing whole yet: wait
    with log.open("ab") as fh:
        fh.write(b"ve")
    size = log.stat().st_size
    assert read_log(log, 2, after=end2, ended=True) == ("five", size, size)  # ended: the rest, as is
    pieces, offset = [], 0
    for _ in range(3):
        text, offset, _ = read_log(log, 0, after=offset, ended=True)
        pieces.append(text)
    assert "".join(pieces).encode() == log.read_bytes()


def test_chunks_are_bounded_and_a_replaced_file_reads_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "rank1.log"
    log.write_bytes(b"ab\ncdefghijklmnop\nq\n")
    got, offset = [], 0
    while offset < log.stat().st_size:
        text, offset, size = read_log(log, 0, after=offset, ended=False, limit=8)
        got.append(text)
        assert size == 20
    # a full chunk is cut after its last newline; a line longer than a chunk goes in pieces
    assert got == ["ab\n", "cdefghij", "klmnop\n", "q\n"]
    assert read_log(log, 0, after=10_000, ended=True, limit=8) == ("ab\n", 3, 20)  # past the end: from the start
    assert read_log(tmp_path / "absent.log", 0, after=5) == ("", 5, 5)


def test_a_log_longer_than_an_answer_holds_is_given_in_part_and_says_its_size(tmp_path: Path) -> None:
    """The whole log (tail 0) from its start as far as the answer's share goes, whole lines, with
    the log's size so that a reader asks on; the last N lines from within the share."""
    log = tmp_path / "rank0.log"
    log.write_bytes(b"".join(b"line %02d\n" % i for i in range(10)))  # 8 bytes a line, 80 in all
    assert read_log(log, 0, ended=True, limit=20) == ("line 00\nline 01\n", 16, 80)
    assert read_log(log, 2, ended=True, limit=20) == ("line 08\nline 09", 80, 80)
    # more lines asked for than the share holds: those that fit, the cut first one left out
    assert read_log(log, 5, ended=True, limit=20) == ("line 08\nline 09", 80, 80)
    assert read_log(log, 0, ended=True) == (log.read_text(), 80, 80)  # a small log: whole


def test_a_log_of_bad_bytes_stays_within_its_share_as_text(tmp_path: Path) -> None:
    """Each undecodable byte reads as U+FFFD (three bytes), so a share of raw bytes decoded to up
    to three times the share: a group of binary logs could pass the message size."""
    log = tmp_path / "rank0.log"
    log.write_bytes(b"\xff" * 90 + b"\n" + b"ok\n")
    pieces, offset = [], 0
    while offset < log.stat().st_size:
        text, offset, _ = read_log(log, 0, after=offset, ended=True, limit=60)
        assert len(text.encode()) <= 60 and text, (text, offset)
        pieces.append(text)
    assert "".join(pieces) == log.read_bytes().decode(errors="replace")  # read on, the log is all there
    tail, _, _ = read_log(log, 2, ended=True, limit=200)
    assert len(tail.encode()) <= 200 and tail == "ok"  # the bad line is too long to be one of the last in reach
