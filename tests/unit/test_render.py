"""The CLI's text: what a person reads on a terminal."""

from __future__ import annotations

from cgsvc_client.render import workload_text

from cgsvc.v1 import launch_pb2


def test_a_workload_reads_as_a_person_would_say_it() -> None:
    w = launch_pb2.LaunchWorkload(input_len=8, output_len=2, requests=3, concurrency=1, seed=5)
    assert workload_text(w) == "3 requests x 8 in / 2 out, concurrency 1, seed 5"
    # concurrency 0 is every request at once: it read "concurrency 0"
    assert workload_text({"requests": 1, "input_len": 4, "output_len": 1}) == ("1 request x 4 in / 1 out, "
                                                                               "concurrency all, seed 0")
