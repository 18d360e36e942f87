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
