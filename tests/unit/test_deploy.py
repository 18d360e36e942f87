"""deploy/ validated offline: the manifests' structure and cross-references, the config the
ConfigMap carries (through the server's own config loader), and the images' entry points."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

from cgsvc.server.config import load_config
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for d in docs(path):
            for key in ("apiVersion", "kind", "metadata"):
                assert key in d, f"{path.name}: a document lacks {key}"
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    cs = pod_spec["containers"]
    for c in cs:
        assert c.get("name") and c.get("image"), c
    return list(cs)


def test_service_deployment_is_consistent(tmp_path: Path) -> None:
    objs = all_docs()
    dep = objs[("Deployment", "cgsvc")]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod = dep["spec"]["template"]["spec"]
    (c,) = containers(pod)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], "probes use the gRPC health service on the gRPC port"
    env = {e["name"]: e for e in c["env"]}
    ref = env["CGSVC_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] in objs[("Secret", ref["name"])]["stringData"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for m in c["volumeMounts"]:
        assert m["name"] in volumes
    cm_name = volumes["config"]["configMap"]["name"]
    toml_text = objs[("ConfigMap", cm_name)]["data"]["cgsvc.toml"]
    (tmp_path / "cgsvc.toml").write_text(toml_text)
    cfg = load_config(str(tmp_path / "cgsvc.toml"), env={})  # unknown keys would raise
    assert cfg.address.endswith(f":{ports['grpc']}") and cfg.metrics_address.endswith(f":{ports['metrics']}")
    assert cfg.secure and cfg.authenticated, "the cluster config must not run in insecure local mode"
    svc = objs[("Service", "cgsvc")]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)
    mon = objs[("ServiceMonitor", "cgsvc")]
    assert mon["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert pod["terminationGracePeriodSeconds"] > cfg.shutdown_grace_seconds
    # replicas of one log sign with one key: a Secret every pod mounts, not the data dir (an
    # emptyDir: a new key at every pod start, which the log's key check would refuse)
    assert dep["spec"]["replicas"] > 1 and cfg.signing_key, "replicas need the log's key given (signing_key)"
    mount = next(m for m in c["volumeMounts"] if cfg.signing_key.startswith(m["mountPath"].rstrip("/") + "/"))
    assert "secret" in volumes[mount["name"]], f"signing_key must come from a Secret, not {volumes[mount['name']]}"


def test_raycluster_fits_tp4_groups() -> None:
    rc = all_docs()[("RayCluster", "cgsvc-workers")]
    assert rc["apiVersion"] == "ray.io/v1"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = next(d for d in project["optional-dependencies"]["ray"] if d.startswith("ray"))
    assert rc["spec"]["rayVersion"] == pinned.split("==")[1]
    containers(rc["spec"]["headGroupSpec"]["template"]["spec"])
    for group in rc["spec"]["workerGroupSpecs"]:
        (c,) = containers(group["template"]["spec"])
        gpus = int(group["rayStartParams"]["num-gpus"])
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus >= 4, "a TP4 group must fit on one node"
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_images_run_the_project_commands() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    service = (DEPLOY / "docker" / "Dockerfile.service").read_text()
    worker = (DEPLOY / "docker" / "Dockerfile.worker").read_text()
    assert 'ENTRYPOINT ["cgsvc", "serve"]' in service and "cgsvc" in scripts
    assert "torch==" not in service and "[worker" not in service, "the control-plane image carries no torch"
    assert 'ENTRYPOINT ["cgsvc-worker"]' in worker and "cgsvc-worker" in scripts
    assert "torch==2.13.0" in worker
