"""Shared test fixtures and paths."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from tests.integration.pg import Proxy

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CASES = ROOT / "tests" / "cases"
# The smallest config.json the catalog reads as a (non-MLA) Llama.
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4}


# The CLI's and the client's own environment: a developer's shell may point them at a server or
# carry a token; the suite starts every server it talks to and says so itself. GRPC_VERBOSITY is
# left to the programs' own default (errors only), which a test of their logs relies on.
for _name in ("CGSVC_SERVER", "CGSVC_TOKEN", "GRPC_VERBOSITY"):
    os.environ.pop(_name, None)


# No example has a deadline: a deadline is a wall-clock assertion, and the suite runs in two
# processes on cores other tests are compiling on (Makefile PYTEST_ARGS).
settings.register_profile("cgsvc", deadline=None)
settings.load_profile("cgsvc")


def llama_dir(path: Path) -> Path:
    """`path` (made if missing) holding LLAMA_CONFIG as its config.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    return path


@pytest.fixture(scope="session", autouse=True)
def _drop_postgres_schemas() -> Iterator[None]:
    """Leave the shared PostgreSQL database as we found it."""
    yield
    from tests.integration.pg import drop_created

    drop_created()


@pytest.fixture()
def away() -> Iterator[tuple[Proxy, str]]:
    """A PostgreSQL URL of a fresh schema that reaches the server through a Proxy, and the proxy:
    stopping it is the database going away, starting it again its return."""
    import uuid
    from urllib.parse import urlsplit

    from tests.e2e.server import quiet_port
    from tests.integration.pg import PG_BASE, Proxy, pg_url_or_skip

    url = pg_url_or_skip(f"away_{uuid.uuid4().hex[:10]}")
    real = urlsplit(PG_BASE)
    proxy = Proxy(quiet_port(), (real.hostname or "127.0.0.1", real.port or 5432))
    proxy.start()
    yield proxy, url.replace(f"{real.hostname}:{real.port}", f"127.0.0.1:{proxy.port}")
    if proxy.listener is not None and proxy.listener.fileno() != -1:
        proxy.stop()
