"""Copy a whole cgsvc database into an empty one: from one machine's SQLite log to the PostgreSQL
that replicas share, or into a backup, with the log still verifying and proving what it did.

Every table is copied row for row, as it is (records, their chain and Merkle nodes, plans,
launches, experiments, idempotency keys, the log's signing keys, replica leases), from one
consistent snapshot of the source: a server may go on writing to it meanwhile, and the copy holds
the log as it was at one moment. The target is written in one transaction, so a copy that fails
leaves it empty. Nothing is recomputed: a record's hash covers its own fields, so a copy whose
records verify, and whose tree has the source's root at that size, is the same log, and a
checkpoint signed before the copy still proves against it (with the source's signing key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from cgsvc.audit.store import (
    AuditStore,
    Verification,
    chain_head,
    metadata,
    schema_migrations,
)
from cgsvc.launch.store import EXPERIMENT_STATES, LAUNCH_STATES, ExperimentStore, LaunchStore
from cgsvc.text import counted

CHUNK = 2000  # rows a statement
# Kept by each store for itself: the target has its own, written when its schema was made.
NOT_COPIED = (schema_migrations.name,)
ACTIVE_STATES = LAUNCH_STATES[:4]  # PLACING .. RUNNING (cgsvc.domain.launches.ACTIVE)


class CopyError(ValueError):
    """The copy cannot be made as asked; `field` names the argument, the message what would do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Copied:
    rows: dict[str, int]  # table -> rows copied, in the order copied
    tree_size: int
    root_hash: str  # hex, the target's: the source's root at that size
    log_key_id: str  # the key that signed the log's checkpoints ("" when no server named one)
    verification: Verification  # the target, read back after its commit
    active: list[str]  # launches and experiments that were running when copied (their names)


def tables_of(store: AuditStore) -> list[sa.Table]:
    """The tables a copy carries, parents first: those of the schema that the store holds."""
    present = set(sa.inspect(store.read_engine).get_table_names())
    return [t for t in metadata.sorted_tables if t.name in present and t.name not in NOT_COPIED]


def _holding(store: AuditStore, tables: list[sa.Table]) -> dict[str, int]:
    """Rows in `tables` beyond those a store is made with."""
    with store.read_engine.begin() as conn:
        counts = {t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()) for t in tables}
        if counts.get(chain_head.name) == 1:
            head = conn.execute(sa.select(chain_head.c.sequence)).scalar_one()
            counts[chain_head.name] = 0 if int(head) == 0 else 1
    return {name: n for name, n in counts.items() if n}


def copy_store(source: AuditStore, target: AuditStore,
               progress: Callable[[str, int], None] = lambda table, rows: None,
               verifying: Callable[[int, int], None] | None = None) -> Copied:
    """Copy every row of `source` into `target`, which must hold nothing yet; then read the
    target back and verify its log. `progress(table, rows)` hears of each chunk written,
    `verifying(checked, total)` how far the read-back has got."""
    rows = copy_rows(source, target, progress)
    size, root = target.tree_head()
    key = target.log_key()
    return Copied(rows, size, root.hex(), key[1] if key else "", target.verify(verifying), running(target))


def running(store: AuditStore) -> list[str]:
    """The launches and experiments a store holds as still running: in a copy, the work of the
    source's replicas, which the target's take over as a lapsed replica's."""
    return ([f"launches/{row.launch_id}" for row in LaunchStore(store).in_states(ACTIVE_STATES)]
            + [f"experiments/{row.experiment_id}" for row in ExperimentStore(store).in_state(EXPERIMENT_STATES[0])])


def copy_rows(source: AuditStore, target: AuditStore,
              progress: Callable[[str, int], None] = lambda table, rows: None) -> dict[str, int]:
    """copy_store's copy, committed, without the read-back: rows copied a table."""
    if source.schema_version() != target.schema_version():
        raise CopyError("target", f"schema version {target.schema_version()}, the source's is "
                                  f"{source.schema_version()}: copy with the release that made the newer one")
    tables = tables_of(source)
    missing = sorted({t.name for t in tables} - {t.name for t in tables_of(target)})
    if missing:
        raise CopyError("target", f"has no table {', '.join(missing)}")
    if held := _holding(target, tables):
        said = ", ".join(counted(n, name.removesuffix("s") if name.endswith("s") else name + " row")
                         for name, n in list(held.items())[:3]) + (", ..." if len(held) > 3 else "")
        raise CopyError("target", f"already holds {said}: copy into an empty database (a new data directory, or a "
                                  "PostgreSQL database no server has used), so that no log is mixed with another")
    rows: dict[str, int] = {}
    with source.read_engine.connect() as read:
        if source.dialect == "postgresql":  # one snapshot for every table, as SQLite's read transaction is
            read = read.execution_options(isolation_level="REPEATABLE READ")
        with read.begin(), target.write_engine.begin() as write:
            write.execute(chain_head.delete())
            for table in tables:
                rows[table.name] = 0
                order = list(table.primary_key.columns) or list(table.columns)
                result = read.execution_options(yield_per=CHUNK).execute(sa.select(table).order_by(*order))
                for chunk in result.partitions(CHUNK):
                    write.execute(table.insert(), [dict(r._mapping) for r in chunk])
                    rows[table.name] += len(chunk)
                    progress(table.name, rows[table.name])
    if target.dialect == "postgresql":  # the planner's statistics now, not when autovacuum gets to it:
        with target.write_engine.begin() as write:  # until then a rare filter scans (bench/RESULTS.md)
            for table in tables:
                write.exec_driver_sql(f"ANALYZE {table.name}")
    return rows

