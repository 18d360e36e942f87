"""A copy reads every table of the source at one moment (cgsvc/audit/copy.py): a record committed
by another writer while the copy is between two tables is in none of them, on SQLite (its read
transaction) and on PostgreSQL (REPEATABLE READ). Were the tables read at different moments, the
chain head copied last would name a record the copied log does not hold, and the copy would not
verify."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgsvc.audit.copy import copy_store
from cgsvc.audit.store import AuditStore
from tests.integration.pg import pg_url_or_skip
from tests.integration.test_audit_store import entry


@pytest.fixture(params=["sqlite", "postgresql"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AuditStore]:
    url = (f"sqlite:///{tmp_path / 'source.db'}" if request.param == "sqlite"
           else pg_url_or_skip(f"copy_snapshot_{uuid.uuid4().hex[:10]}"))
    s = AuditStore(url)
    yield s
    s.close()


def test_a_record_committed_during_the_copy_is_in_no_table_of_it(source: AuditStore, tmp_path: Path) -> None:
    for i in range(1, 6):
        source.append(entry(i))
    writer = AuditStore(source.url)  # another writer on the same log, as a live server is
    committed: list[int] = []

    def meanwhile(table: str, rows: int) -> None:
        if table == "audit_records" and not committed:  # the records are copied; the head and the tree are not
            committed.append(writer.append(entry(6)).record.sequence)

    target = AuditStore(f"sqlite:///{tmp_path / 'target.db'}")
    try:
        done = copy_store(source, target, meanwhile)
    finally:
        target.close()
        writer.close()
    assert committed == [6]  # the write did land in the source, mid-copy
    assert done.verification.ok, done.verification
    assert (done.tree_size, done.rows["audit_records"]) == (5, 5)
    assert done.root_hash == source.root_at(5).hex() and source.tree_head()[0] == 6
