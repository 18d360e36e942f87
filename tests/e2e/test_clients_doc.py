"""docs/clients.md, as a program's author reads it: its Python example runs as written against a
real server and prints what the page says it prints; each grpcurl call it shows names a method
the server has and a request body that method takes, and the server answers it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cgsvc_worker.checkpoint import make_checkpoint
from google.protobuf import descriptor_pool, json_format
from google.protobuf.message_factory import GetMessageClass

from tests.conftest import ROOT
from tests.e2e.server import ServerProcess

DOC = (ROOT / "docs" / "clients.md").read_text()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(Path(tmp_path_factory.mktemp("srv"))) as s:
        yield s


def _blocks(kind: str) -> list[str]:
    """The page's code blocks fenced as ```kind (kind "": those with no language named)."""
    blocks, open_as, lines = [], None, []
    for line in DOC.splitlines():
        if open_as is None and line.startswith("```"):
            open_as, lines = line[3:].strip(), []
        elif open_as is not None and line.strip() == "```":
            if open_as == kind:
                blocks.append("\n".join(lines) + "\n")
            open_as = None
        elif open_as is not None:
            lines.append(line)
    return blocks


def test_the_python_example_runs_as_written_and_prints_what_the_page_shows(srv: ServerProcess,
                                                                             tmp_path: Path) -> None:
    (program,) = _blocks("python")
    ckpt = make_checkpoint(str(tmp_path / "tiny-kimi"), "tiny-kimi")
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "CGSVC_SERVER": srv.address, "CHECKPOINT": ckpt})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    printed = ran.stdout.splitlines()
    shown = [line for line in _blocks("")[0].splitlines() if line.strip() not in ("", "...")]
    assert len(shown) >= 10, "the page's printed lines were not found"
    # each line the page shows is printed, `...` standing for what differs from run to run
    missing = [line for line in shown
               if not any(re.fullmatch(".*?".join(map(re.escape, line.split("..."))), out) for out in printed)]
    assert not missing, "\n".join(["not printed:", *missing, "printed:", *printed])
    # run again, it makes nothing twice: the request ids answer with the plan and launch made first
    again = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "CGSVC_SERVER": srv.address, "CHECKPOINT": ckpt})
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0] == printed[0] and printed[-1] == again.stdout.splitlines()[-1]


def _grpcurl_calls() -> list[tuple[str, dict[str, object]]]:
    """(method, request body) of each grpcurl call the page makes with -d."""
    calls = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" # ")[0]) if line.startswith("grpcurl") else []
            if "-d" in words:
                calls.append((words[-1], json.loads(words[words.index("-d") + 1])))
    return calls


def test_each_grpcurl_call_on_the_page_is_one_the_server_answers(srv: ServerProcess) -> None:
    import cgsvc.v1.launch_pb2  # noqa: F401 - the messages, in the default pool
    import cgsvc.v1.plan_service_pb2  # noqa: F401

    pool = descriptor_pool.Default()
    described = [line.split(" # ")[0].split()[-1] for block in _blocks("bash") for line in block.splitlines()
                 if line.startswith("grpcurl") and " describe " in line]
    assert described, "the page's describe was not found"
    for name in described:
        pool.FindMessageTypeByName(name)  # KeyError: the page names a message the protos lack
    calls = _grpcurl_calls()
    assert len(calls) >= 2, "the page's grpcurl calls were not found"
    with grpc.insecure_channel(srv.address) as channel:
        for method, body in calls:
            service, name = method.split("/")
            rpc = pool.FindServiceByName(service).FindMethodByName(name)
            request = json_format.ParseDict(body, GetMessageClass(rpc.input_type)())  # a field it lacks raises
            answer = channel.unary_unary(f"/{method}", request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=GetMessageClass(rpc.output_type).FromString)(
                request, timeout=30)
            assert answer.ByteSize() > 0 or name.startswith("List"), (method, answer)
