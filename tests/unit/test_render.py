"""The CLI's text: what a person reads on a terminal."""

from __future__ import annotations

from typing import Any

from cgsvc_client.render import workload_text

from cgsvc.v1 import launch_pb2


def test_a_workload_reads_as_a_person_would_say_it() -> None:
    w = launch_pb2.LaunchWorkload(input_len=8, output_len=2, requests=3, concurrency=1, seed=5)
    assert workload_text(w) == "3 requests x 8 in / 2 out, concurrency 1, seed 5"
    # concurrency 0 is every request at once: it read "concurrency 0"
    assert workload_text({"requests": 1, "input_len": 4, "output_len": 1}) == ("1 request x 4 in / 1 out, "
                                                                               "concurrency all, seed 0")


def test_a_launch_that_is_prefilling_shows_its_prompt_tokens() -> None:
    """A launch of long prompts sat at "RUNNING [....] 0/8 tokens" for minutes while its prompts
    were prefilled chunk by chunk: the bar shows the prompt tokens until the first token is out."""
    from cgsvc_client.launch_commands import progress_line, tokens_cell

    prefilling = launch_pb2.Launch(state="RUNNING", tokens_done=0, tokens_total=8, prompt_tokens_done=4096,
                                   prompt_tokens_total=8192)
    assert progress_line(prefilling) == "RUNNING    [###############...............] 4096/8192 prompt tokens prefilled"
    assert tokens_cell(prefilling) == "0/8 (prefill 4096/8192)"  # launches list
    generating = launch_pb2.Launch(state="RUNNING", tokens_done=2, tokens_total=8, prompt_tokens_done=8192,
                                   prompt_tokens_total=8192)
    assert progress_line(generating) == "RUNNING    [#######.......................] 2/8 tokens"
    assert tokens_cell(generating) == "2/8"
    earlier = launch_pb2.Launch(state="LOADING", tokens_total=8)  # no prompt counts (a server before them)
    assert progress_line(earlier) == "LOADING    [..............................] 0/8 tokens"


def test_a_launch_that_is_capturing_shows_the_sizes_captured() -> None:
    """A capture of hundreds of CUDA graphs (or a cold compile cache on a CPU) sat at "CAPTURING
    [....] 0/8 tokens" for minutes: the bar counts the sizes captured or compiled."""
    from cgsvc_client.launch_commands import progress_line, report_table, tokens_cell

    capturing = launch_pb2.Launch(name="launches/x", state="CAPTURING", tokens_total=8, capture_done=13,
                                  capture_total=52)
    assert progress_line(capturing) == "CAPTURING  [#######.......................] 13/52 sizes captured"
    assert tokens_cell(capturing) == "0/8 (capture 13/52)"
    assert "progress       0/8 tokens; 13/52 sizes captured" in report_table(capturing)
    nothing = launch_pb2.Launch(state="CAPTURING", tokens_total=8)  # nothing to capture, or a worker before counts
    assert progress_line(nothing) == "CAPTURING  [..............................] 0/8 tokens"
    ran = launch_pb2.Launch(state="RUNNING", tokens_done=2, tokens_total=8, capture_done=52, capture_total=52)
    assert progress_line(ran) == "RUNNING    [#######.......................] 2/8 tokens" and tokens_cell(ran) == "2/8"


def test_a_wait_off_a_terminal_says_how_far_a_long_phase_has_got_every_few_seconds() -> None:
    """`launch --wait` in a CI log printed a line per state change only: a capture or a run of
    minutes left the log silent until it ended. Off a terminal a changed bar is printed at most
    every `every` seconds, and at once on a state change, a new kind of count, or the end."""
    import io

    from cgsvc_client.launch_commands import Progress

    now = [0.0]
    out = io.StringIO()
    bar = Progress(tty=False, out=out, every=10.0, clock=lambda: now[0])

    def step(at: float, **fields: Any) -> None:
        now[0] = at
        bar.update(launch_pb2.Launch(tokens_total=8, **fields))

    step(0, state="LOADING")
    step(1, state="CAPTURING", capture_total=52)
    step(5, state="CAPTURING", capture_done=3, capture_total=52)  # 4 s after the last line: not yet
    step(12, state="CAPTURING", capture_done=13, capture_total=52)
    step(14, state="CAPTURING", capture_done=13, capture_total=52)  # unchanged: nothing
    step(30, state="CAPTURING", capture_done=13, capture_total=52)  # unchanged, however long: nothing
    step(31, state="RUNNING", capture_done=52, capture_total=52, prompt_tokens_total=16)
    step(32, state="RUNNING", tokens_done=1, prompt_tokens_done=16, prompt_tokens_total=16)  # tokens now
    step(33, state="RUNNING", tokens_done=2, prompt_tokens_done=16, prompt_tokens_total=16)
    step(34, state="RUNNING", tokens_done=8, prompt_tokens_done=16, prompt_tokens_total=16)  # all done: at once
    step(35, state="SUCCEEDED", tokens_done=8, prompt_tokens_done=16, prompt_tokens_total=16)
    assert out.getvalue().splitlines() == [
        "LOADING    [..............................] 0/8 tokens",
        "CAPTURING  [..............................] 0/52 sizes captured",
        "CAPTURING  [#######.......................] 13/52 sizes captured",
        "RUNNING    [..............................] 0/16 prompt tokens prefilled",
        "RUNNING    [###" + "." * 27 + "] 1/8 tokens",
        "RUNNING    [##############################] 8/8 tokens",
        "SUCCEEDED  [##############################] 8/8 tokens",
    ]


def test_a_launch_report_counts_its_plan_fields_by_how_they_ran() -> None:
    """`launches show` said "6 of 10 plan fields honoured as planned" of a launch whose other 4
    fields had nothing to act on (an eager phase has no sizes): a reader took 4 for dishonoured.
    The line counts each status, the substitutions first."""
    from cgsvc_client.launch_commands import report_table

    def shown(*statuses: str) -> str:
        fidelity = [launch_pb2.PlanFidelity(field=f"f{i}", status=s, requested="1", effective="2", reason="why")
                    for i, s in enumerate(statuses)]
        table = report_table(launch_pb2.Launch(name="launches/x", state="SUCCEEDED",
                                               report=launch_pb2.LaunchReport(plan_fidelity=fidelity)))
        return next(line for line in table.splitlines() if line.startswith("plan fidelity")).split("  ", 1)[1].strip()

    assert shown("honoured", "not_applicable", "honoured", "not_applicable") == (
        "2 of 4 plan fields honoured as planned, 2 not applicable (nothing to act on)")
    assert shown("honoured", "substituted", "not_applicable") == (
        "1 of 3 plan fields honoured as planned, 1 substituted, 1 not applicable (nothing to act on)")
    assert shown("honoured", "honoured") == "all 2 plan fields honoured as planned"
    assert shown() == "not reported (workers of a release before plan fidelity)"  # it read "0 of 0 ..."


class _Terminal:
    """A stderr that says it is a terminal, keeping what is written to it."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_a_listing_of_many_pages_counts_them_on_one_line_that_it_clears_when_done(monkeypatch: Any) -> None:
    """`launches summary` on a terminal left "1 launches so far ..." under its table: a count
    that read as unfinished, in bad grammar, of a listing already whole. The count is shown
    while pages are still to come, and its line is cleared after the last."""
    import argparse
    import sys

    from cgsvc_client.args import pages

    def fetch(pages_of: list[int]) -> Any:
        def page(query: str, size: int, token: str) -> Any:
            at = int(token or 0)
            more = str(at + 1) if at + 1 < len(pages_of) else ""
            return argparse.Namespace(launches=[object()] * pages_of[at], next_page_token=more)
        return page

    def shown(pages_of: list[int], every: bool = True) -> str:
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        ns = argparse.Namespace(all=every, filter="", since=None, time_field="create_time", page_size=1000,
                                page_token=None)
        assert sum(len(items) for items, _ in pages(ns, fetch(pages_of), "launches")) == sum(pages_of[:None if every else 1])
        return terminal.text

    assert shown([1]) == ""  # one page: nothing to wait for
    assert shown([1000, 1000, 1]) == "\r1000 launches read ...\x1b[K\r2000 launches read ...\x1b[K\r\x1b[K"
    assert shown([1000, 1], every=False) == ""  # one page asked for


def test_a_count_takes_its_nouns_plural_as_english_does() -> None:
    """`experiment run` printed "2 launchs per arm"."""
    from cgsvc.text import counted

    assert [counted(n, "launch") for n in (0, 1, 2)] == ["0 launches", "1 launch", "2 launches"]
    assert counted(3, "record") == "3 records" and counted(2, "process") == "2 processes"
    assert counted(2, "box") == "2 boxes" and counted(2, "mouse", "mice") == "2 mice"
    assert counted(2, "policy") == "2 policies" and counted(2, "key") == "2 keys"
