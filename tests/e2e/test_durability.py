"""Durability under kill -9, and several replicas appending to one PostgreSQL chain."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from cgsvc_client.client import Client

from cgsvc.audit.store import AuditStore
from cgsvc.errors import ServiceError
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess
from tests.integration.pg import Proxy, pg_url_or_skip

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4}, "parallelism": {"tp": 4}}


def load(address: str, acked: list[tuple[str, str]], stop: threading.Event, errors: list[str]) -> None:
    with Client(address, timeout=5) as c:
        while not stop.is_set():
            try:
                p = c.resolve_proto(KIMI)
                acked.append((p.name, p.audit_record))
            except ServiceError as exc:
                errors.append(exc.code)
                return


class Load:
    """Eight client threads calling ResolvePlan on the given addresses until stopped."""

    def __init__(self, *addresses: str) -> None:
        self.acked: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=load, args=(addresses[i % len(addresses)], self.acked,
                                                            self.stop_event, self.errors)) for i in range(8)]
        for t in self.threads:
            t.start()

    def wait_for(self, acks: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < acks and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(10)


def test_kill_9_loses_no_acknowledged_plan(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "srv").start()
    run = Load(srv.address)
    run.wait_for(300)
    srv.kill9()
    run.stop()
    acked, errors = run.acked, run.errors
    assert len(acked) >= 300, f"load too slow: {len(acked)} acknowledged, errors {errors[:3]}"
    srv.start()  # same data dir and port
    try:
        with Client(srv.address) as c:
            assert c.verify_audit_log().ok
            for name, record in acked:
                assert c.get_plan(name).audit_record == record
                assert c.get_audit_record(record).plan_id == name.split("/")[1]
            assert c.resolve(KIMI).prefill_backend == "disabled"  # the restarted server keeps appending
            assert c.verify_audit_log().ok
    finally:
        srv.stop()


def test_a_killed_writer_process_is_replaced_and_the_log_stays_whole(tmp_path: Path) -> None:
    """kill -9 of the audit writer process (not the server): the calls it had not answered fail
    (INTERNAL, their records may or may not be committed), a new writer takes over, every call
    acknowledged before and after is in the log, and the log verifies."""
    import os
    import signal
    import subprocess

    srv = ServerProcess(tmp_path / "srv").start()
    try:
        assert srv.proc is not None
        run = Load(srv.address)
        run.wait_for(100)
        children = subprocess.run(["pgrep", "-f", "-P", str(srv.proc.pid), "multiprocessing"], capture_output=True,
                                  text=True).stdout.split()
        assert children, "no writer process found"
        for pid in children:
            os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.5)
        run.stop()
        assert set(run.errors) <= {"INTERNAL"}
        with Client(srv.address) as c:
            after = [c.resolve_proto(KIMI) for _ in range(3)]
            assert all(p.audit_record for p in after)
            assert c.verify_audit_log().ok
            for name, record in [*run.acked, *((p.name, p.audit_record) for p in after)]:
                assert c.get_plan(name).audit_record == record
        assert srv.alive()
        assert "audit writer process lost" in srv.log_path.read_text()
    finally:
        srv.stop()


def test_two_replicas_share_one_linear_chain_on_postgres(tmp_path: Path) -> None:
    url = pg_url_or_skip(f"replicas_{uuid.uuid4().hex[:10]}")
    key = ("--signing-key", str(tmp_path / "log-key.pem"))  # one log, one key: the first start creates it
    a = ServerProcess(tmp_path / "a", "--database-url", url, *key).start()
    b = ServerProcess(tmp_path / "b", "--database-url", url, *key).start()
    try:
        run = Load(a.address, b.address)
        run.wait_for(400)
        run.stop()
        acked, errors = run.acked, run.errors
        assert not errors and len(acked) >= 400
        store = AuditStore(url)
        try:
            v = store.verify()
            assert v.ok, v.reason
            with store.read_engine.begin() as conn:
                seqs = [r[0] for r in conn.execute(sa.text("SELECT sequence FROM audit_records ORDER BY sequence"))]
                peers = conn.execute(sa.text("SELECT count(DISTINCT prev_hash), count(*) FROM audit_records")).one()
            assert seqs == list(range(1, len(seqs) + 1))  # no gaps, no duplicates
            assert peers[0] == peers[1]  # no forks: every record has its own predecessor
            assert {rec for _, rec in acked} <= {f"auditRecords/{s}" for s in seqs}
        finally:
            store.close()
    finally:
        a.stop()
        b.stop()


def test_sigterm_finishes_in_flight_calls(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "srv").start()
    run = Load(srv.address)
    run.wait_for(100)
    assert srv.stop() == 0  # graceful: exit status 0
    run.stop()
    acked, errors = run.acked, run.errors
    # Calls that raced the shutdown are refused (UNAVAILABLE, or CANCELLED when the transport
    # closed before dispatch), or, rarely, one that reached gRPC's core just as it stopped taking
    # calls is never handed to a handler and waits out its deadline (DEADLINE_EXCEEDED; the
    # server's stop then waits for it too: seen once on a slow 2-core machine). None of these
    # was acknowledged, and every call whose handler started finished OK.
    assert set(errors) <= {"UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED"}
    import json
    rpc_lines = [json.loads(x) for x in srv.log_path.read_text().splitlines()
                 if x.startswith("{") and '"event": "rpc"' in x]
    assert rpc_lines and all(x["outcome"] == "OK" for x in rpc_lines)
    srv.start()
    try:
        with Client(srv.address) as c:
            assert c.verify_audit_log().ok
            for name, _record in acked:
                c.get_plan(name)
    finally:
        srv.stop()


def test_cli_verify_exits_non_zero_on_a_tampered_log(tmp_path: Path) -> None:
    import sqlite3
    import subprocess
    import sys

    from tests.conftest import ROOT

    with ServerProcess(tmp_path / "srv") as srv:
        with Client(srv.address) as c:
            for _ in range(5):
                c.resolve(KIMI)
        db = sqlite3.connect(srv.data_dir / "cgsvc.db")
        db.execute("UPDATE audit_records SET principal = 'mallory' WHERE sequence = 3")
        db.commit()
        db.close()
        proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "verify", "--server", srv.address,
                               "-o", "table"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 3
        assert "BROKEN at auditRecords/3" in proc.stdout and "modified" in proc.stdout


def test_a_database_that_goes_away_is_unavailable_to_callers_and_its_return_is_served(
        tmp_path: Path, away: tuple[Proxy, str]) -> None:
    """Regression: while PostgreSQL did not answer, every call that needed it failed INTERNAL
    ("internal error: WriterProcessError", "OperationalError"), which reads as a bug in the server
    and which no client retries. It is UNAVAILABLE, saying the database does not answer, which
    clients retry; once the database is back the server serves again, its log whole."""
    proxy, through = away
    with ServerProcess(tmp_path / "srv", "--database-url", through) as srv, Client(srv.address) as c:
        c.resolve_proto(KIMI)
        proxy.stop()
        for what, call in (("ResolvePlan", lambda: c.resolve_proto(KIMI)), ("ListPlans", lambda: c.list_plans()),
                           ("VerifyAuditLog", lambda: c.verify_audit_log())):
            with pytest.raises(ServiceError) as e:
                call()
            assert e.value.code == "UNAVAILABLE" and e.value.reason == "DATABASE_UNAVAILABLE", (what, e.value)
            assert "the database does not answer" in e.value.message, e.value.message
        said = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "plans", "list", "--server", srv.address,
                               "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        error = json.loads(said.stdout)["error"]  # the server's words, not a hint that nothing listens there
        assert said.returncode == 1 and error["reason"] == "DATABASE_UNAVAILABLE", said.stdout
        assert "nothing answers at" not in error["message"], error["message"]
        proxy.start()
        deadline = time.monotonic() + 30
        while True:  # the writer's and the readers' next connections find it
            try:
                back = c.resolve_proto(KIMI)
                break
            except ServiceError as exc:
                assert exc.code == "UNAVAILABLE" and time.monotonic() < deadline, exc
                time.sleep(0.5)
        assert c.get_plan(back.name).name == back.name
        verified = c.verify_audit_log()
        assert verified.ok and verified.records_checked >= 2


def test_a_launch_followed_through_a_database_outage_ends_as_it_ran(
        tmp_path: Path, away: tuple[Proxy, str]) -> None:
    """Regression: the server's task following a running launch died at the first write the
    database did not take (a progress count, a state), so the launch stayed RUNNING after its
    group had finished, until a restart. It keeps following, and writes what happened once the
    database is back: one end, recorded once."""
    from cgsvc_worker.checkpoint import make_checkpoint

    ckpt = make_checkpoint(str(tmp_path / "tiny-kimi"), "tiny-kimi")
    work = {"input_len": 12, "output_len": 48, "requests": 1, "concurrency": 1, "seed": 3}
    proxy, through = away
    with ServerProcess(tmp_path / "srv", "--database-url", through) as srv, Client(srv.address) as c:
        name = c.create_launch(ckpt, work, spec=KIMI).metadata.name
        deadline = time.monotonic() + 120
        while c.get_launch(name).tokens_done < 2:  # running, its progress being written
            assert time.monotonic() < deadline, c.get_launch(name)
            time.sleep(0.1)
        proxy.stop()
        time.sleep(3)  # progress the server cannot write, and maybe the group's end
        proxy.start()
        while (launch := c.get_launch(name)).state not in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST"):
            assert time.monotonic() < deadline, launch
            time.sleep(0.2)
        assert launch.state == "SUCCEEDED" and launch.tokens_done == 48, launch
        ends = [r.outcome_message for r in c.list_audit_records(f'launch_id = "{name}" AND method = "launch.state"',
                                                                 page_size=100).records if "SUCCEEDED" in r.outcome_message]
        assert len(ends) == 1, ends
        assert c.verify_audit_log().ok


def test_an_experiment_waits_out_a_database_outage_and_ends_as_its_launches_did(
        tmp_path: Path, away: tuple[Proxy, str]) -> None:
    """Regression: an experiment whose database went away while it waited on a launch failed at
    the first read (and, its end not writable either, stayed RUNNING until a restart). It waits
    the outage out, as its launches do, and ends as they did."""
    from cgsvc_worker.checkpoint import make_checkpoint

    ckpt = make_checkpoint(str(tmp_path / "tiny-kimi"), "tiny-kimi")
    work = {"input_len": 12, "output_len": 24, "requests": 1, "concurrency": 1, "seed": 3}
    proxy, through = away
    with ServerProcess(tmp_path / "srv", "--database-url", through) as srv, Client(srv.address) as c:
        plans = [c.resolve_proto(KIMI).name, c.resolve_proto(KIMI, policy="sglang-0.5.18").name]
        name = c.create_experiment(plans, ckpt, work, repeats=1).name
        deadline = time.monotonic() + 180
        while not (exp := c.get_experiment(name)).runs or exp.runs[0].state != "RUNNING":
            assert time.monotonic() < deadline and exp.state == "RUNNING", exp
            time.sleep(0.1)
        proxy.stop()
        time.sleep(3)
        proxy.start()
        while (exp := c.get_experiment(name)).state == "RUNNING":
            assert time.monotonic() < deadline, exp
            time.sleep(0.3)
        assert exp.state == "SUCCEEDED" and [r.state for r in exp.runs] == ["SUCCEEDED", "SUCCEEDED"], exp
        ends = [r for r in c.list_audit_records('method = "experiment.state"', page_size=100).records
                if "SUCCEEDED" in r.outcome_message]
        assert len(ends) == 1 and c.verify_audit_log().ok, ends
