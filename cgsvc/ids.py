"""Resource ids: time-ordered, so that a new row lands at the right edge of every index on it.

A random id (uuid4) puts each new plan in a random page of the plans table's primary key and
of the audit log's plan_id index: under load every record then dirtied two more pages per
commit than its neighbours did (bench/RESULTS.md, "Trust"). An id that starts with the time
keeps those inserts on the last page, the way UUIDv7 and ULID do.

    new_id()      24 hex digits: 12 of milliseconds since the epoch, then 48 random bits
    parse_name()  the ID of a resource name ("plans/ID"), or INVALID_ARGUMENT naming the field

The random part is for uniqueness, not secrecy (ids are names, callers are authorised by role),
so it comes from the process's seeded generator rather than a system call per id.
"""

from __future__ import annotations

import random
import time

from cgsvc.errors import FieldViolation, ServiceError

_random = random.Random()  # seeded from os.urandom at import


def new_id() -> str:
    """A new, time-ordered resource id (24 lower-case hex digits)."""
    return f"{time.time_ns() // 1_000_000:012x}{_random.getrandbits(48):012x}"


def parse_name(name: str, collection: str, field: str = "name") -> str:
    """The ID of a resource name "{collection}/ID"; INVALID_ARGUMENT on `field` for anything else."""
    prefix = f"{collection}/"
    if not name.startswith(prefix) or len(name) == len(prefix) or "/" in name[len(prefix):]:
        raise ServiceError.invalid([FieldViolation(field, f"must look like {collection}/ID, got {name!r}")])
    return name[len(prefix):]
