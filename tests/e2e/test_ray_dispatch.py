"""The Ray dispatcher on a local Ray cluster: the same end-to-end launch. The cluster declares
four (fake) GPUs: a GPU plan asks Ray for one per rank, Ray gives each actor its own
CUDA_VISIBLE_DEVICES, and the ranks (on this CPU) report the devices they were given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgsvc_client.client import Client
from cgsvc_worker.checkpoint import make_checkpoint
from cgsvc_worker.supervisor import free_port

from cgsvc.errors import ServiceError
from tests.e2e.server import ServerProcess
from tests.e2e.test_launch_path import unfollowed_group_stops

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}
WORK = {"input_len": 12, "output_len": 5, "requests": 2, "concurrency": 1, "seed": 11}
RAY_ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    subprocess.run([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "4", "--num-gpus", "4",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, env=RAY_ENV,
                   capture_output=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], env=RAY_ENV, capture_output=True, timeout=120)


def test_ray_launch_succeeds_like_the_local_one(ray_cluster: str, tmp_path: Path) -> None:
    ckpt = make_checkpoint(str(tmp_path / "kimi"), "tiny-kimi")
    with ServerProcess(tmp_path / "srv", "--ray-address", ray_cluster, env=RAY_ENV) as srv, Client(srv.address) as c:
        ray_op = c.create_launch(ckpt, WORK, spec=KIMI, dispatcher="ray")
        states = [e.launch.state for e in c.watch_launch(ray_op.metadata.name) if e.kind == "state"]
        ray_launch = c.get_launch(ray_op.metadata.name)
        assert states[-1] == "SUCCEEDED", ray_launch.error
        assert ray_launch.dispatcher == "ray" and ray_launch.report.decode_effective == "static_eager"
        assert sorted(ray_launch.devices) == ["0", "1", "2", "3"]  # Ray's assignment, one GPU per rank
        placement = json.loads(ray_launch.report_json)["placement"]
        # every rank sees the group's GPUs (Ray assigned one each) and takes its own
        assert [(p["visible_devices"], p["local_rank"]) for p in placement] == [
            (",".join(ray_launch.devices), r) for r in range(4)], placement
        assert "1 GPU per rank" in ray_launch.placement and "substituted" not in ray_launch.placement
        local_op = c.create_launch(ckpt, WORK, plan=ray_launch.plan)
        for _ in c.watch_launch(local_op.metadata.name):
            pass
        local = c.get_launch(local_op.metadata.name)
        tokens = [[r["output_tokens"] for r in json.loads(x.report_json)["requests"]] for x in (ray_launch, local)]
        assert tokens[0] == tokens[1]
        assert c.verify_audit_log().ok


def test_ray_cpu_bundles_for_a_gpu_plan_are_a_reported_substitution(ray_cluster: str, tmp_path: Path) -> None:
    ckpt = make_checkpoint(str(tmp_path / "kimi"), "tiny-kimi")
    with ServerProcess(tmp_path / "srv", "--ray-address", ray_cluster, "--ray-gpus-per-rank", "0",
                       env=RAY_ENV) as srv, Client(srv.address) as c:
        op = c.create_launch(ckpt, WORK, spec=KIMI, dispatcher="ray")
        states = [e.launch.state for e in c.watch_launch(op.metadata.name) if e.kind == "state"]
        launch = c.get_launch(op.metadata.name)
        assert states[-1] == "SUCCEEDED", launch.error
        assert list(launch.devices) == ["cpu"] * 4
        assert "substituted: the plan is for GPUs, the ranks run on CPU bundles" in launch.placement


def test_a_ray_group_no_server_follows_is_stopped_by_its_driver(ray_cluster: str, tmp_path: Path) -> None:
    ckpt = make_checkpoint(str(tmp_path / "kimi"), "tiny-kimi")
    unfollowed_group_stops(ServerProcess(tmp_path / "srv", "--ray-address", ray_cluster, "--ray-gpus-per-rank", "0",
                                         "--unfollowed-group-seconds", "3", env=RAY_ENV), ckpt, dispatcher="ray")


def test_unreachable_ray_cluster_starts_nothing(tmp_path: Path) -> None:
    ckpt = make_checkpoint(str(tmp_path / "kimi"), "tiny-kimi")
    dead = f"127.0.0.1:{free_port()}"
    with ServerProcess(tmp_path / "srv", "--ray-address", dead) as srv, Client(srv.address) as c:
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, WORK, spec=KIMI, dispatcher="ray")
        assert e.value.code == "FAILED_PRECONDITION" and "not reachable" in e.value.message
        assert list(c.list_launches().launches) == []
        recs = c.list_audit_records('method = "/cgsvc.v1.LaunchService/CreateLaunch"').records
        assert len(recs) == 1 and recs[0].outcome_code == 9
