"""cgsvc embedded: two servers started in one process (cgsvc.server.app.start), as a program
that hosts them would, each answering on its own real socket with its own configuration."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cgsvc_client.client import Client

from cgsvc.catalog import ANYWHERE, ModelRoots
from cgsvc.domain.impact import Outcome
from cgsvc.errors import ServiceError
from cgsvc.server import app
from cgsvc.server.config import load_config
from tests.conftest import llama_dir

SPEC = {"hardware": {"gpu": "B200"}}


def _refusal(address: str, path: Path) -> ServiceError:
    with Client(address) as c, pytest.raises(ServiceError) as err:
        c.resolve({**SPEC, "model": {"path": str(path)}})
    return err.value


def _resolves(address: str, path: Path) -> str:
    with Client(address) as c:
        return c.resolve({**SPEC, "model": {"path": str(path)}}).attention_prefill


def test_two_servers_in_one_process_confine_checkpoint_paths_apart(tmp_path: Path) -> None:
    """Each server's --model-roots holds for its own callers only: a path under one server's
    root is refused by the other, naming that other's root (the roots were once one setting of
    the process: the second server's replaced the first's)."""
    ckpt = {name: llama_dir(tmp_path / f"models-{name}" / "llama") for name in "ab"}

    async def main() -> None:
        running = {}
        try:
            for name in "ab":
                cfg = load_config(overrides={"address": "127.0.0.1:0", "data_dir": str(tmp_path / f"srv-{name}"),
                                             "model_roots": str(tmp_path / f"models-{name}")})
                running[name] = await app.start(cfg)
            address = {name: f"127.0.0.1:{r.port}" for name, r in running.items()}
            for mine, other in ("ab", "ba"):
                assert await asyncio.to_thread(_resolves, address[mine], ckpt[mine]) == "trtllm_mha"
                err = await asyncio.to_thread(_refusal, address[mine], ckpt[other])
                assert err.code == "INVALID_ARGUMENT"
                (v,) = err.violations
                assert v.field == "model.path" and str(tmp_path / f"models-{mine}") in v.description, v
        finally:
            for r in running.values():
                await r.stop(1.0)

    asyncio.run(main())


def test_policy_impact_reads_a_recorded_path_only_under_the_roots(tmp_path: Path) -> None:
    """An impact re-resolves recorded specs: one whose model.path lies outside the server's
    roots (a refused request is recorded too) is refused again, not read."""
    outside = llama_dir(tmp_path / "outside")
    root = tmp_path / "models"
    root.mkdir()
    spec_json = json.dumps({**SPEC, "model": {"path": str(outside)}})
    assert Outcome.of(spec_json, "cgsvc", ANYWHERE).plan is not None
    refused = Outcome.of(spec_json, "cgsvc", ModelRoots.of([str(root)])).error
    assert refused is not None and [v.field for v in refused.violations] == ["model.path"]
    assert str(root) in refused.violations[0].description


def test_model_roots_name_what_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nowhere"):
        ModelRoots.of([str(tmp_path / "nowhere")])
    assert ModelRoots.of([]) == ANYWHERE and ANYWHERE.admit("/etc")
