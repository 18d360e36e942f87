"""A record's hash is over canonical JSON; the fast encoder must give the very same bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cgsvc.audit.records import canonical_record_json
from cgsvc.plan import canonical_json

values = st.one_of(st.text(), st.text(min_size=129, max_size=400), st.integers(), st.lists(st.text(), max_size=4))


@given(st.dictionaries(st.text(), values, max_size=12))
def test_the_fast_encoder_is_canonical_json(fields: dict[str, object]) -> None:
    assert canonical_record_json(fields) == canonical_json(fields)


def test_a_chained_record_is_the_one_its_constructor_makes() -> None:
    """chain() and chained() build records without AuditRecord's __init__: every field must
    still be set, to the value the constructor would give, and the hash must be canonical."""
    import dataclasses

    from cgsvc.audit.records import AuditEntry, AuditRecord, chain, chained
    from cgsvc.plan import sha256_hex

    entry = AuditEntry(principal="alice", peer="ipv4:127.0.0.1:1", method="/m", request_id="r", trace_id="t",
                       model="m\x00", gpu="H100", spec_json='{"a":"\\u00e9"}', plan_json='{"p":1}', plan_hash="ph",
                       rule_ids=("b", "a"), policy_version="v1", policy="cgsvc", service_version="0.1",
                       outcome_code=3, outcome_message="é \"quoted\"", launch_id="l", plan_id="p")
    record = chain(entry, 7, "2026-12-02T00:00:00.000000Z", "0" * 64)
    assert list(record.__dict__) == [f.name for f in dataclasses.fields(AuditRecord)]
    assert record == AuditRecord(**record.__dict__)
    assert record.record_hash == sha256_hex(canonical_json(record.hashed_fields())) == record.compute_hash()
    assert chained(entry, 7, record.time, record.prev_hash, record.record_hash) == record
