"""What a launch keeps of its worker report: all of it while it is small, and within REPORT_BYTES
when a large workload would make it more than one message could carry (GetLaunch, WatchLaunch)."""

from __future__ import annotations

import json
from typing import Any

from cgsvc.domain.launches import REPORT_BYTES, stored_report


def report(requests: int, output_len: int) -> dict[str, Any]:
    return {"status": "ok", "aggregate": {"requests": requests}, "notes": ["a note of the worker's"],
            "requests": [{"id": i, "prompt_tokens": 128, "prefill_chunks": 1, "tokens": output_len,
                          "output_tokens": list(range(1000, 1000 + output_len)), "ttft_ms": 12.5, "tpot_ms": 3.25}
                         for i in range(requests)]}


def test_a_small_report_is_kept_whole() -> None:
    small = report(4, 16)
    assert stored_report(small) == small


def test_a_large_report_drops_token_ids_then_requests_and_says_so() -> None:
    """10,000 requests of 256 tokens: 13 MB of token ids, where one message carries 4 MiB. The
    token ids go first (the run directory's report.json keeps them), then requests past what
    fits; the aggregate, computed by the workers over every request, is untouched."""
    big = report(10_000, 256)
    kept = stored_report(big)
    assert len(json.dumps(kept)) <= REPORT_BYTES
    assert kept["aggregate"] == big["aggregate"]
    assert all("output_tokens" not in r and r["tokens"] == 256 for r in kept["requests"])
    assert kept["requests"] == [{k: v for k, v in r.items() if k != "output_tokens"}
                                for r in big["requests"][:len(kept["requests"])]]
    omitted = 10_000 - len(kept["requests"])
    assert kept.get("requests_omitted", 0) == omitted
    assert any("output_tokens" in n and "report.json" in n for n in kept["notes"]), kept["notes"]
    huge = stored_report(report(100_000, 8))
    assert len(json.dumps(huge)) <= REPORT_BYTES and huge["requests_omitted"] > 0
    assert any(f"{huge['requests_omitted']} requests" in n for n in huge["notes"]), huge["notes"]
