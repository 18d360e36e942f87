from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cgsvc_client.client import Client

from tests.e2e.server import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(Path(tmp_path_factory.mktemp("srv"))) as srv:
        yield srv


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c
