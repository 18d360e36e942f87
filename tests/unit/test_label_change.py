"""Reading an Update request's labels and update_mask (AIP-134, AIP-161 map keys) into a change."""

from __future__ import annotations

import pytest

from cgsvc.domain.labels import LabelChange, read_change
from cgsvc.errors import ServiceError


def fields_of(err: pytest.ExceptionInfo[ServiceError]) -> list[str]:
    return [v.field for v in err.value.violations]


def test_a_mask_of_keys_sets_the_given_and_removes_the_absent() -> None:
    change = read_change({"team": "infra", "env": "prod"}, ["labels.team", "labels.ticket", "labels.env"], "launch")
    assert change == LabelChange(replace=False, set={"env": "prod", "team": "infra"}, remove=("ticket",))
    assert change.apply({"team": "ml", "ticket": "inc-42", "owner": "ana"}) == {
        "env": "prod", "owner": "ana", "team": "infra"}  # owner: not named, kept


def test_the_whole_labels_path_replaces_them_and_no_mask_reads_as_the_populated_field() -> None:
    assert read_change({"a": "1"}, ["labels"], "launch").apply({"b": "2"}) == {"a": "1"}
    assert read_change({}, ["labels"], "launch").apply({"b": "2"}) == {}  # clears them
    assert read_change({"a": "1"}, [], "launch").apply({"b": "2"}) == {"a": "1"}  # AIP-134: populated fields
    with pytest.raises(ServiceError) as err:
        read_change({}, [], "launch")  # nothing populated: nothing to update is a mistake, said so
    assert fields_of(err) == ["update_mask"] and "nothing to update" in err.value.message, err.value


def test_bad_masks_and_labels_are_refused_by_field() -> None:
    for mask, field in ((["state"], "update_mask"), (["labels", "labels.a"], "update_mask"),
                        (["labels.Team"], "update_mask"), (["labels."], "update_mask")):
        with pytest.raises(ServiceError) as err:
            read_change({"a": "1"}, mask, "launch")
        assert err.value.code == "INVALID_ARGUMENT" and fields_of(err) == [field], (mask, err.value)
    with pytest.raises(ServiceError) as err:
        read_change({"a": "A B"}, ["labels.a"], "experiment")
    assert fields_of(err) == ["experiment.labels.a"], err.value
    with pytest.raises(ServiceError) as err:  # a label given but not named: it would be dropped unseen
        read_change({"a": "1", "b": "2"}, ["labels.a"], "launch")
    assert fields_of(err) == ["launch.labels.b"] and "update_mask" in err.value.violations[0].description


def test_a_change_says_what_it_did() -> None:
    change = read_change({"team": "infra", "env": "prod"}, ["labels.team", "labels.ticket", "labels.env"], "launch")
    before = {"team": "ml", "ticket": "inc-42"}
    assert change.describe(before, change.apply(before)) == (
        "env=prod added, team=infra (was ml), ticket=inc-42 removed")
    assert change.describe(before, before) == "unchanged"
