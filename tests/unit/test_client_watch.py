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
