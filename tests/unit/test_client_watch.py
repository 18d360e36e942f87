"""Client.followed, the loop under `watch_launch` and `watch_experiment`, over plain iterators: a
stream closed before what it watches has ended is opened again, and one that keeps closing with
nothing in it is given up after `resume_for` seconds. (A real server restarting under a watch:
tests/e2e/test_launches.py, test_launch_wait_outlives_a_server_restart.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cgsvc_client.client import Client

from cgsvc.errors import ServiceError


def client() -> Client:
    return Client("127.0.0.1:1")  # a channel connects only when called: these streams are not gRPC ones


def test_a_stream_closed_early_is_opened_again_and_followed_to_the_end() -> None:
    opened: list[Iterator[str]] = [iter(["RUNNING"]), iter(["RUNNING", "SUCCEEDED", "never read"])]
    told: list[tuple[ServiceError | None, float]] = []
    with client() as c:
        seen = list(c.followed(lambda: opened.pop(0), lambda state: state == "SUCCEEDED",
                               on_resume=lambda err, pause: told.append((err, pause))))
    assert seen == ["RUNNING", "RUNNING", "SUCCEEDED"]
    assert told == [(None, 0.5)]  # said once: the server closed it, opened again after 0.5 s


def test_a_stream_that_keeps_closing_empty_is_given_up_after_resume_for() -> None:
    told: list[tuple[ServiceError | None, float]] = []
    with client() as c, pytest.raises(ServiceError, match="closed the watch for 1.2 s without a word") as e:
        list(c.followed(lambda: iter(()), lambda state: False, resume_for=1.2,
                        on_resume=lambda err, pause: told.append((err, pause))))
    assert e.value.code == "UNAVAILABLE"
    assert [pause for _, pause in told] == [0.5, 1.0]  # waits grow while nothing comes


def test_a_number_the_api_cannot_carry_is_bad_input_naming_its_field() -> None:
    """Regression: `Client.list_plans(page_size=2**31)` (or a workload's seed past an int32, a
    tree size past an int64) raised protobuf's "ValueError: Value out of range", which names no
    field, from inside the client. It is INVALID_ARGUMENT naming the field, before anything is
    sent (nothing listens at this address)."""
    with Client("127.0.0.1:1") as c:
        for call, field in ((lambda: c.list_plans(page_size=2**31), "page_size"),
                            (lambda: c.list_audit_records(page_size=-2**31 - 1), "page_size"),
                            (lambda: c.list_launches(page_size=2**40), "page_size"),
                            (lambda: c.list_experiments(page_size=2**40), "page_size"),
                            (lambda: c.consistency_proof(2**63), "first_size"),
                            (lambda: c.inclusion_proof("auditRecords/1", 2**64), "tree_size"),
                            (lambda: c.launch_logs("launches/x", tail_lines=2**31), "tail_lines"),
                            (lambda: c.launch_logs("launches/x", after_offsets={"rank0.log": 2**63}), "after_offsets"),
                            (lambda: c.create_launch("/m", {"seed": 2**31}), "workload.seed"),
                            (lambda: c.create_launch("/m", {"input_len": "12"}), "workload.input_len"),
                            (lambda: c.create_launch("/m", {"inputlen": 12}), "workload.inputlen"),
                            (lambda: c.create_launch("/m", {}, engine={"kv_cache_mb": "x"}), "engine.kv_cache_mb"),
                            (lambda: c.create_experiment(["plans/a", "plans/b"], "/m", {}, repeats=2**31), "repeats"),
                            (lambda: c.create_experiment(["plans/a", "plans/b"], "/m", {"requests": 2**33}, 1),
                             "workload.requests")):
            with pytest.raises(ServiceError) as caught:
                call()
            assert caught.value.code == "INVALID_ARGUMENT", (field, caught.value)
            assert [v.field for v in caught.value.violations] == [field], (field, caught.value)
