"""The launch path's promises, end to end: an idempotent CreateLaunch (across a restart),
devices of their own for every rank, launches from two replicas on one PostgreSQL, and
log lines that carry the request they serve."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cgsvc_client.client import Client
from cgsvc_worker.checkpoint import make_checkpoint

from cgsvc.contract import RunDir, read_report
from cgsvc.errors import ServiceError
from cgsvc.launch.dispatch import HOST, session_members
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess
from tests.e2e.test_launches import KIMI, SHORT, no_processes_left, wait_state
from tests.integration.pg import pg_url_or_skip

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "LOST")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_checkpoint(str(tmp_path_factory.mktemp("kimi") / "tiny-kimi"), "tiny-kimi")


def run_dirs(srv: ServerProcess) -> list[Path]:
    root = srv.data_dir / "launches"
    return sorted(root.iterdir()) if root.exists() else []


def test_a_retried_create_launch_is_one_launch_even_after_a_restart(ckpt: str, tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "srv").start()
    try:
        with Client(srv.address) as c:
            first = c.create_launch(ckpt, SHORT, spec=KIMI, request_id="retry-1").metadata
            again = c.create_launch(ckpt, SHORT, spec=KIMI, request_id="retry-1").metadata  # a lost answer, retried
            assert again.name == first.name and again.request_id == "retry-1"
            wait_state(c, first.name, TERMINAL)
            with pytest.raises(ServiceError) as err:  # the same id for another request
                c.create_launch(ckpt, {**SHORT, "requests": 3}, spec=KIMI, request_id="retry-1")
            assert err.value.code == "INVALID_ARGUMENT" and err.value.violations[0].field == "request_id"
            assert first.name.split("/")[1] in err.value.message
            with pytest.raises(ServiceError) as err:  # the service's own ids for experiments' runs
                c.create_launch(ckpt, SHORT, spec=KIMI, request_id="experiments/01abc/runs/1")
            assert err.value.code == "INVALID_ARGUMENT" and err.value.violations[0].field == "request_id"
            assert "experiments/ID/runs/N" in err.value.violations[0].description, err.value
        srv.stop()
        srv.start()  # the retry arrives at a restarted server
        with Client(srv.address) as c:
            assert c.create_launch(ckpt, SHORT, spec=KIMI, request_id="retry-1").metadata.name == first.name
            assert [x.name for x in c.list_launches().launches] == [first.name]
            methods = [r.outcome_message for r in c.list_audit_records('method = "/cgsvc.v1.LaunchService/'
                                                                        'CreateLaunch"').records]
            assert sum("replay of request_id 'retry-1'" in m for m in methods) == 2
        assert len(run_dirs(srv)) == 1  # one worker group was ever started
    finally:
        srv.stop()


def state_records(c: Client, name: str) -> list[str]:
    """A launch's state changes, as its audit records say them."""
    lid = name.removeprefix("launches/")
    return [r.outcome_message for r in c.list_audit_records(f'launch_id = "{lid}"', page_size=100).records
            if r.method == "launch.state"]


def assert_started_once(c: Client, name: str) -> None:
    """One group was started for the launch: creates that arrived together used to schedule at
    once, and each started every launch still PLACING (a second supervisor on the same devices,
    the first one orphaned)."""
    states = state_records(c, name)
    assert sum(m.startswith("PLACING -> LOADING") for m in states) == 1, states


@contextlib.contextmanager
def pg_replicas(tmp_path: Path, schema: str, slots: int, *args: str,
                apart: bool = False) -> Iterator[tuple[list[ServerProcess], str, dict[str, Any]]]:
    """Two servers on one PostgreSQL schema, `slots` CPU slots each (and `args`): (servers, a tiny
    checkpoint, a TP1 spec of it); skips where no PostgreSQL answers. `apart`: the second cannot
    see the first's data directory, as if on another machine (elsewhere())."""
    url = pg_url_or_skip(f"{schema}_{uuid.uuid4().hex[:10]}")
    tiny = make_checkpoint(str(tmp_path / "tiny"), "tiny")
    spec = {"model": {"path": tiny}, "hardware": {"gpu": "cpu"}, "parallelism": {"tp": 1}}
    key = str(tmp_path / "log-key.pem")  # replicas of one log share its signing key; the first start creates it
    prefixes = [(), elsewhere(tmp_path / "srv0") if apart else ()]
    servers = [ServerProcess(tmp_path / f"srv{i}", "--database-url", url, "--local-slots", str(slots),
                             "--signing-key", key, *args, prefix=prefixes[i]).start()
               for i in range(2)]
    try:
        yield servers, tiny, spec
    finally:
        for srv in servers:
            srv.stop()


LONG_TP1 = {"input_len": 4, "output_len": 4000, "requests": 1, "concurrency": 1}  # runs until cancelled


def test_concurrent_launches_get_disjoint_devices_and_each_rank_sees_only_its_groups(ckpt: str,
                                                                                     tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv", "--local-devices", "0,1,2,3,4,5,6,7") as srv, Client(srv.address) as c:
        assert "local devices: 0, 1, 2, 3, 4, 5, 6, 7 (--local-devices)" in "".join(srv.output)
        names: list[str] = []

        def launch() -> None:
            names.append(c.create_launch(ckpt, SHORT, spec=KIMI).metadata.name)

        threads = [threading.Thread(target=launch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        launches = [wait_state(c, n, TERMINAL, timeout=300) for n in names]
        assert [x.state for x in launches] == ["SUCCEEDED", "SUCCEEDED"], [x.error for x in launches]
        devices = [list(x.devices) for x in launches]
        assert all(len(d) == 4 for d in devices) and not set(devices[0]) & set(devices[1])
        for launch in launches:
            report = json.loads(launch.report_json)
            seen = [(p["visible_devices"], p["local_rank"]) for p in report["placement"]]
            # every rank sees its group's devices (NCCL's P2P needs its peers visible), none of the
            # other launch's, and takes the r-th as its own
            assert seen == [(",".join(launch.devices), r) for r in range(4)], seen
            assert "local devices" in launch.placement and "substituted" not in launch.placement
            assert_started_once(c, launch.name)
        # the same plan and workload on other devices: shown by launches diff, not counted as running differently
        diff = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "diff", *names, "--exit-code",
                               "--server", srv.address, "-o", "json"], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
        assert diff.returncode == 0, diff.stdout + diff.stderr
        assert [r["field"] for r in json.loads(diff.stdout)["diff"]["ran"]] == ["devices"], diff.stdout


def test_an_experiment_is_cancelled_from_a_replica_that_does_not_run_it(tmp_path: Path) -> None:
    """CancelExperiment asked of replica 1 stops an experiment replica 0 runs: the ask is stored
    with the experiment, replica 1 cancels the launch running now, and replica 0 starts no other
    and ends the experiment CANCELLED."""
    with pg_replicas(tmp_path, "experiment_cancel", 1) as (servers, tiny, spec), \
            Client(servers[0].address) as c0, Client(servers[1].address) as c1:
        plan = c0.resolve_proto(spec).name
        exp = c0.create_experiment([plan, plan], tiny, {"input_len": 4, "output_len": 2000, "requests": 1,
                                                        "concurrency": 1}, repeats=3)
        wait_for("the first launch running", lambda: any(r.state == "RUNNING" for r in c1.get_experiment(exp.name).runs))
        assert c1.cancel_experiment(exp.name).state == "RUNNING"  # asked; replica 0 ends it
        wait_for("the experiment ended", lambda: c0.get_experiment(exp.name).state != "RUNNING", timeout=60)
        done = c0.get_experiment(exp.name)
        assert done.state == "CANCELLED" and done.error == "cancelled by local; nothing was measured before", done
        assert [r.state for r in done.runs] == ["CANCELLED"]
        assert c0.get_launch(done.runs[0].launch).owner == f"replicas/{instance_of(servers[0])}"


def test_two_replicas_create_launches_concurrently_on_postgres(tmp_path: Path) -> None:
    work = {"input_len": 4, "output_len": 2, "requests": 1, "concurrency": 1}
    made: list[str] = []
    errors: list[BaseException] = []
    with pg_replicas(tmp_path, "launch_replicas", 2) as (servers, tiny, spec):
        def create(srv: ServerProcess) -> None:
            try:
                with Client(srv.address) as c:
                    for _ in range(2):
                        made.append(c.create_launch(tiny, work, spec=spec, wait_for_resources=True).metadata.name)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=create, args=(s,)) for s in servers for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        with Client(servers[0].address) as c:
            for name in made:
                assert wait_state(c, name, TERMINAL, timeout=300).state == "SUCCEEDED"
                assert_started_once(c, name)
            listed = [x.name for x in c.list_launches(page_size=100).launches]
            assert sorted(listed) == sorted(made) and len(set(made)) == 8
            assert c.verify_audit_log().ok


def test_a_cancel_asked_of_another_replica_stops_the_launch_and_its_queue(tmp_path: Path) -> None:
    """Behind a load balancer a cancel reaches any replica. Replica 0 (one slot) runs launch A and
    queues B; replica 1 is asked to cancel both: B never starts, A's group is stopped by the
    replica that supervises it."""
    with pg_replicas(tmp_path, "launch_cancel", 1) as (servers, tiny, spec), \
            Client(servers[0].address) as c0, Client(servers[1].address) as c1:
        a = c0.create_launch(tiny, LONG_TP1, spec=spec).metadata.name
        wait_state(c0, a, ("RUNNING",), timeout=120)
        b = c0.create_launch(tiny, LONG_TP1, spec=spec, wait_for_resources=True).metadata.name
        assert c0.get_launch(b).state == "PLACING"
        assert c1.cancel_launch(b).state == "CANCELLED"
        cancelled = c1.cancel_launch(a)
        assert cancelled.state == "CANCELLED"  # stopped by replica 0 within about a second
        # its record was committed before the state was stored (and so before this answer)
        record = next(r for r in c1.list_audit_records(f'launch_id = "{a.split("/")[1]}"', page_size=100).records
                      if r.outcome_message.startswith("RUNNING -> CANCELLED"))
        assert record.time.ToDatetime() <= cancelled.update_time.ToDatetime(), (record.time, cancelled.update_time)
        records = {n: state_records(c1, n) for n in (a, b)}
        assert any(m.startswith("RUNNING -> CANCELLED: cancelled by local") for m in records[a]), records[a]
        assert records[b] == ["PLACING -> CANCELLED: cancelled by local before it started"], records[b]
        pid = supervisor_pid(records[a])
        assert no_processes_left(pid, timeout=10), f"launch A's group (supervisor pid {pid}) still runs"
        assert c0.get_launch(b).state == "CANCELLED"  # and replica 0, its slot free again, did not start it


def supervisor_pid(states: list[str]) -> int:
    """The pid of the supervisor a launch's group was started with, from its state records."""
    started = next(m for m in states if m.startswith("PLACING -> LOADING"))
    return int(started.split("supervisor pid ")[1].split(";")[0])


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def unfollowed_group_stops(srv: ServerProcess, ckpt: str, dispatcher: str = "local") -> None:
    """`srv` runs with a short --unfollowed-group-seconds: a long launch is started, the server
    is killed and stays down, and the group's supervisor stops the group, reporting why; the
    server, restarted, settles the launch FAILED with that reason."""
    srv.start()
    try:
        with Client(srv.address) as c:
            launch = c.create_launch(ckpt, {**SHORT, "output_len": 4000, "requests": 1}, spec=KIMI,
                                     dispatcher=dispatcher).metadata
            wait_state(c, launch.name, ("RUNNING",))
            pid = supervisor_pid(state_records(c, launch.name))
            run = RunDir(run_dirs(srv)[0])
            assert time.time() - run.followed.stat().st_mtime < 3  # followed while the server runs
        srv.kill9()
        assert no_processes_left(pid, timeout=60), f"the group (supervisor pid {pid}) still runs"
        report = read_report(run.report)
        assert report.error_kind == "Unfollowed" and "no cgsvc server followed this group" in report.error, report
        srv.start()
        with Client(srv.address) as c:
            done = wait_state(c, launch.name, TERMINAL)
            assert done.state == "FAILED" and "no cgsvc server followed this group" in done.error, done
    finally:
        srv.stop()


def test_a_group_no_server_follows_is_stopped_by_its_supervisor(ckpt: str, tmp_path: Path) -> None:
    """The server is killed and does not come back within --unfollowed-group-seconds: the group's
    supervisor stops it and reports why, so it does not hold its devices for ever."""
    unfollowed_group_stops(ServerProcess(tmp_path / "srv", "--unfollowed-group-seconds", "3"), ckpt)


def test_a_replica_whose_lease_lapses_has_its_launches_taken_over(tmp_path: Path) -> None:
    """Replica 0 runs launches A and B and queues C, then stalls (SIGSTOP) past its 2 s lease.
    Replica 1 takes all three over: B's group runs on this machine and is followed from there;
    A's is made, in the store, to have run on another machine, so it is settled LOST; C is
    placed on replica 1's devices. Replica 0, resumed, lets B and C go and stops A's group,
    which it alone can reach. Nothing is left running after B and C are cancelled."""
    with pg_replicas(tmp_path, "launch_lease", 2, "--lease-seconds", "2") as (servers, tiny, spec), \
            Client(servers[0].address) as c0, Client(servers[1].address) as c1:
        a, b = (c0.create_launch(tiny, LONG_TP1, spec=spec).metadata.name for _ in range(2))
        for name in (a, b):
            wait_state(c0, name, ("RUNNING",), timeout=120)
        c = c0.create_launch(tiny, LONG_TP1, spec=spec, wait_for_resources=True).metadata.name
        assert c0.get_launch(c).state == "PLACING"  # replica 0's two slots are taken
        pids = {name: supervisor_pid(state_records(c0, name)) for name in (a, b)}
        url = servers[0].args[servers[0].args.index("--database-url") + 1]
        engine = sa.create_engine(url)
        with engine.begin() as conn:  # as if A's group ran on another machine
            launch_id = a.split("/")[1]
            handle = json.loads(conn.execute(sa.text("SELECT handle_json FROM launches WHERE launch_id = :id"),
                                             {"id": launch_id}).scalar_one())
            assert handle["host"] == HOST
            conn.execute(sa.text("UPDATE launches SET handle_json = :h WHERE launch_id = :id"),
                         {"h": json.dumps({**handle, "host": "elsewhere"}), "id": launch_id})
        engine.dispose()
        owner0 = (servers[0].data_dir / "instance").read_text().strip()
        assert servers[0].proc is not None
        servers[0].proc.send_signal(signal.SIGSTOP)
        try:
            # as long as C's wait below: a loaded machine (two pytest processes, a slow day) took over 30 s
            wait_for("A settled LOST by replica 1", lambda: c1.get_launch(a).state == "LOST", timeout=120)
            wait_for("C placed by replica 1", lambda: c1.get_launch(c).state == "RUNNING", timeout=120)
            wait_for("B followed by replica 1", lambda: any(m.startswith("re-attached") for m in state_records(c1, b)))
            owner1 = (servers[1].data_dir / "instance").read_text().strip()
            replicas = {r.name: r for r in c1.list_replicas().replicas}
            gone, live = replicas[f"replicas/{owner0}"], replicas[f"replicas/{owner1}"]
            assert gone.lapsed and gone.seconds_since_renewal >= 2 and gone.active_launches == 0 and not gone.answering
            assert not live.lapsed and live.active_launches == 2 and live.answering and live.host == HOST
            assert {c1.get_launch(n).owner for n in (a, b, c)} == {f"replicas/{owner1}"}
            taken = servers[1].metrics_text()
            assert 'cgsvc_replica_takeovers_total{kind="launch"} 3.0' in taken, taken
            assert 'cgsvc_replica_lease_lapses_total 0.0' in taken, taken
        finally:
            servers[0].proc.send_signal(signal.SIGCONT)
        # resumed, replica 0 finds its own lease lapsed (and says how long it went unrenewed)
        wait_for("replica 0's lapse counted", lambda: "cgsvc_replica_lease_lapses_total 1.0" in servers[0].metrics_text())
        gap = re.search(r"^cgsvc_replica_lease_renewal_gap_seconds (\S+)$", servers[0].metrics_text(), re.M)
        assert gap is not None and float(gap.group(1)) >= 2, gap
        lost = c1.get_launch(a)
        assert f"replica {owner0} on {HOST} stopped renewing its lease" in lost.error, lost.error
        assert "ran on elsewhere and cannot be followed" in lost.error, lost.error
        assert "taken over by replica" in state_records(c1, c)[0], state_records(c1, c)
        assert c1.get_launch(b).state == "RUNNING" and session_members(pids[b])
        # resumed, replica 0 stops the group only it can reach, and leaves B to replica 1
        assert no_processes_left(pids[a], timeout=15), f"A's group (supervisor pid {pids[a]}) still runs"
        wait_for("replica 0's record of stopping A", lambda: any(m.startswith("stopped the group") and "settled it LOST"
                                                                 in m for m in state_records(c1, a)))
        time.sleep(2)  # replica 0's monitors have read the store again (about once a second)
        assert c0.get_launch(b).state == "RUNNING" and session_members(pids[b])
        for name in (b, c):  # asked of replica 0, done by replica 1, which owns them now
            assert c0.cancel_launch(name).state == "CANCELLED"
        for name in (b, c):
            pid = supervisor_pid(state_records(c1, name))
            assert no_processes_left(pid, timeout=15), f"{name}'s group (supervisor pid {pid}) still runs"
        for name in (a, b, c):
            assert_started_once(c1, name)


def test_a_restarted_replica_leaves_the_other_replicas_launches_alone(tmp_path: Path) -> None:
    """Replica 1 restarting must not take over (re-attach, or settle as ended) the launch replica 0
    supervises; replica 0 restarted from its data directory knows the launch as its own again."""
    with pg_replicas(tmp_path, "launch_restart", 1) as (servers, tiny, spec):
        with Client(servers[0].address) as c0:
            a = c0.create_launch(tiny, LONG_TP1, spec=spec).metadata.name
            wait_state(c0, a, ("RUNNING",), timeout=120)

        def states() -> list[str]:
            with Client(servers[1].address) as c:
                return state_records(c, a)

        servers[1].stop()
        servers[1].start()  # its launch recovery has run when it answers
        assert not any("re-attached" in m for m in states()), states()
        servers[0].kill9()
        servers[0].start()  # the same data directory: the same owner
        assert sum("re-attached" in m for m in states()) == 1, states()
        with Client(servers[1].address) as c1:
            assert c1.get_launch(a).state == "RUNNING"
            # re-attached, it read the group's events from the start without moving the launch back
            assert not any(m.startswith("RUNNING -> ") for m in states()), states()
            assert c1.cancel_launch(a).state == "CANCELLED"


def test_log_lines_carry_the_request_they_serve(ckpt: str, tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv", "--log-level", "info") as srv, Client(srv.address) as c:
        name = c.create_launch(ckpt, SHORT, spec=KIMI, request_id="bound-request").metadata.name
        wait_state(c, name, TERMINAL)
    lines = [json.loads(x) for x in srv.log_path.read_text().splitlines() if x.startswith("{")]
    states: list[dict[str, Any]] = [x for x in lines if x.get("event") == "launch state"
                                    and x.get("launch_id") == name.split("/")[1]]
    assert states and all(x.get("request_id") == "bound-request" for x in states), states
    assert all(x.get("method") == "/cgsvc.v1.LaunchService/CreateLaunch" for x in states)


def test_logs_kept_on_another_replicas_machine_name_that_replica(tmp_path: Path) -> None:
    """A replica asked for logs it does not hold (the group ran on another replica's machine)
    names the replica and host that hold them, rather than answering an empty list that reads as
    'the ranks wrote nothing'."""
    with pg_replicas(tmp_path, "launch_logs", 1) as (servers, tiny, spec), \
            Client(servers[0].address) as c0, Client(servers[1].address) as c1:
        name = c0.create_launch(tiny, {"input_len": 4, "output_len": 4, "requests": 1, "concurrency": 1},
                                spec=spec).metadata.name
        done = wait_state(c0, name, TERMINAL, timeout=120)
        assert done.state == "SUCCEEDED" and c1.launch_logs(name).logs  # one machine: replica 1 reads them too
        (run,) = run_dirs(servers[0])
        run.rename(run.with_name(run.name + ".elsewhere"))  # as if on replica 0's own disk, on another machine
        with pytest.raises(ServiceError) as e:
            c1.launch_logs(name)
        assert e.value.code == "FAILED_PRECONDITION", e.value.message
        assert done.owner in e.value.message and f"on {HOST}" in e.value.message, e.value.message
        assert c0.launch_logs(name).logs == []  # its own replica: nothing there (and it says no more)


def elsewhere(hidden: Path) -> list[str]:
    """A command prefix under which a server cannot see `hidden` (an empty tmpfs is mounted over it
    in a user and mount namespace of the server's own): a replica on another machine, whose disk
    it does not share, though it shares this one's network and database. Skips where this kernel
    lets no unprivileged user make such a namespace."""
    try:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                               text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("needs util-linux's unshare to run a replica that cannot see the other's disk")
    if probe.returncode != 0:
        pytest.skip(f"this kernel refuses an unprivileged user namespace ({probe.stderr.strip()}), which the test "
                    "needs to run a replica that cannot see the other's disk")
    hidden.mkdir(parents=True, exist_ok=True)
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            'mount -t tmpfs elsewhere "$0" && exec "$@"', str(hidden)]


def test_logs_on_another_replicas_disk_are_asked_of_that_replica(tmp_path: Path) -> None:
    """Replica 1 cannot see replica 0's disk. Asked for a launch's logs that replica 0 keeps, it
    answers LOGS_ELSEWHERE with replica 0's address; `cgsvc-cli launches logs` (and --follow)
    given replica 1 asks replica 0 there itself and prints what replica 0 holds."""
    with pg_replicas(tmp_path, "logs_elsewhere", 1, apart=True) as (servers, tiny, spec), \
            Client(servers[0].address) as c0, Client(servers[1].address) as c1:
        name = c0.create_launch(tiny, {"input_len": 4, "output_len": 4, "requests": 1, "concurrency": 1},
                                spec=spec).metadata.name
        done = wait_state(c0, name, TERMINAL, timeout=120)
        held = {x.name: x.text for x in c0.launch_logs(name).logs}
        assert done.state == "SUCCEEDED" and "rank0.log" in held and held["rank0.log"]
        with pytest.raises(ServiceError) as e:
            c1.launch_logs(name)
        assert (e.value.code, e.value.reason) == ("FAILED_PRECONDITION", "LOGS_ELSEWHERE"), e.value
        assert e.value.info == {"replica": done.owner, "host": HOST, "address": servers[0].address}, e.value.info
        assert f"at {servers[0].address}" in e.value.message, e.value.message

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "logs", name, "--tail", "0",
                                   "--server", servers[1].address, "-o", "json", *args],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT)
        said = f"{name}'s logs are kept by {done.owner} on {HOST}: asking it at {servers[0].address}"
        plain = cli()
        assert plain.returncode == 0 and said in plain.stderr, plain.stderr
        assert {x["name"]: x["text"] for x in json.loads(plain.stdout)["logs"]} == held
        followed = cli("--follow", "--interval", "0.2")
        assert followed.returncode == 0 and said in followed.stderr, followed.stderr
        joined: dict[str, str] = {}
        for piece in map(json.loads, followed.stdout.splitlines()):
            joined[piece["log"]] = joined.get(piece["log"], "") + piece["text"]
        assert joined == {n: t for n, t in held.items() if t}
        said_at_start = f"replica {done.owner} on {HOST}, reached at {servers[0].address} (the bound address"
        assert any(line.startswith(said_at_start) for line in servers[0].output), servers[0].output
        replicas = {r.name: r.address for r in c1.list_replicas().replicas}
        assert replicas == {done.owner: servers[0].address, f"replicas/{instance_of(servers[1])}": servers[1].address}


def test_logs_whose_replica_stops_answering_say_so_and_a_follow_ends_with_the_launch(tmp_path: Path) -> None:
    """Replica 0 keeps a running launch's logs on a disk replica 1 cannot see; a `--follow` given
    replica 1 reads them from replica 0. Replica 0 is killed: a plain `launches logs` now names the
    replica that does not answer and the state replica 1 has (RUNNING, until the lease lapses); once
    replica 1 has taken the launch over and settled it LOST (its group ran on another machine), the
    follow stops, exit 1, saying its last lines could not be read, and replica 1 itself answers that
    the logs are on that machine rather than an empty list."""
    with pg_replicas(tmp_path, "logs_keeper_gone", 1, "--lease-seconds", "8", "--unfollowed-group-seconds", "3",
                     apart=True) as (servers, tiny, spec), \
            Client(servers[0].address) as c0, Client(servers[1].address) as c1:
        name = c0.create_launch(tiny, LONG_TP1, spec=spec).metadata.name
        wait_state(c0, name, ("RUNNING",), timeout=120)
        pid = supervisor_pid(state_records(c0, name))
        url = servers[0].args[servers[0].args.index("--database-url") + 1]
        engine = sa.create_engine(url)
        with engine.begin() as conn:  # as if the group ran on another machine: a takeover settles it LOST
            handle = json.loads(conn.execute(sa.text("SELECT handle_json FROM launches WHERE launch_id = :id"),
                                             {"id": name.split("/")[1]}).scalar_one())
            conn.execute(sa.text("UPDATE launches SET handle_json = :h WHERE launch_id = :id"),
                         {"h": json.dumps({**handle, "host": "elsewhere"}), "id": name.split("/")[1]})
        engine.dispose()
        owner0 = f"replicas/{instance_of(servers[0])}"
        command = [sys.executable, "-m", "cgsvc_client.cli", "launches", "logs", name, "--server", servers[1].address,
                   "-o", "json"]
        out, err = tmp_path / "follow.out", tmp_path / "follow.err"
        with open(out, "w") as o, open(err, "w") as e:
            follower = subprocess.Popen([*command, "--follow", "--interval", "0.2"], stdout=o, stderr=e, cwd=ROOT,
                                        text=True)
        try:
            wait_for("the follow reading replica 0", lambda: "asking it at" in err.read_text() and out.read_text())
            servers[0].kill9()
            plain = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert plain.returncode == 1, plain.stderr
            error = json.loads(plain.stdout)["error"]
            assert error["code"] == "UNAVAILABLE", error
            assert (f"{name}'s logs are kept by {owner0} on {HOST}, whose address {servers[0].address} does not "
                    f"answer") in error["message"], error
            assert f"{servers[1].address} has the launch RUNNING" in error["message"], error
            assert follower.wait(timeout=60) == 1, err.read_text()
        finally:
            follower.kill()
        said = err.read_text()  # each poll that got no answer, while the launch still ran
        assert f"whose address {servers[0].address} does not answer" in said, said
        *_, last = out.read_text().splitlines()  # with -o json the error ends standard output
        ended = json.loads(last)["error"]
        assert ended["code"] == "UNAVAILABLE" and ended["info"]["state"] == "LOST", ended
        assert "has the launch ended LOST" in ended["message"], ended
        assert "once that replica answers again" in ended["message"], ended
        assert c1.get_launch(name).state == "LOST"
        with pytest.raises(ServiceError) as gone:
            c1.launch_logs(name)
        assert (gone.value.code, gone.value.reason) == ("FAILED_PRECONDITION", "LOGS_ELSEWHERE"), gone.value
        assert f"{name}'s logs are kept on elsewhere, where its group ran" in gone.value.message, gone.value.message
        assert gone.value.info == {"replica": "", "host": "elsewhere", "address": ""}, gone.value.info
        assert no_processes_left(pid, timeout=30), f"the group (supervisor pid {pid}) still runs"


def test_an_advertised_address_no_client_can_dial_is_refused_at_start(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "srv", "--advertise-address", "0.0.0.0:50051")
    with pytest.raises(RuntimeError, match="advertise_address: must be HOST:PORT that clients can dial"):
        srv.start()
    assert not (tmp_path / "srv" / "cgsvc.db").exists(), "refused before the database was opened"


def test_a_replica_warns_at_start_when_its_certificate_does_not_carry_its_advertised_name(tmp_path: Path) -> None:
    """With TLS, a client sent to a replica's advertised address checks the certificate against
    that name: a replica whose certificate does not carry it says so at start."""
    from tests.e2e.certs import ThrowawayPKI

    url = pg_url_or_skip(f"advertised_tls_{uuid.uuid4().hex[:10]}")
    cert, key = ThrowawayPKI(tmp_path).issue("server", "localhost", server=True)  # localhost and 127.0.0.1
    tls = ("--database-url", url, "--tls-cert", cert, "--tls-key", key, "--signing-key", str(tmp_path / "log-key.pem"))
    with ServerProcess(tmp_path / "fits", *tls) as fits:  # advertised as 127.0.0.1:PORT, which it carries
        assert any(line.startswith("replica replicas/") for line in fits.output), fits.output
        assert not [line for line in fits.output if "is not valid for" in line], fits.output
    with ServerProcess(tmp_path / "misfit", *tls, "--advertise-address", "cgsvc-1.example:50051") as misfit:
        (warning,) = [line for line in misfit.output if "is not valid for" in line]
        assert warning.startswith("WARNING: tls_cert's certificate is not valid for cgsvc-1.example (it names "
                                  "localhost, 127.0.0.1)"), warning


def instance_of(srv: ServerProcess) -> str:
    return (srv.data_dir / "instance").read_text().strip()


def test_replicas_list_says_each_replicas_release_and_warns_of_a_mixed_fleet(tmp_path: Path) -> None:
    """During a rolling upgrade replicas on one database run different releases: `replicas list`
    says which runs which (migration 13 keeps it with the lease) and warns while they differ."""
    from cgsvc import __version__

    # a long lease: no renewal rewrites the version the test sets (the first is at start)
    with pg_replicas(tmp_path, "replica_versions", 1, "--lease-seconds", "600") as (servers, _tiny, _spec):
        def listed() -> tuple[dict[str, Any], str]:
            proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "replicas", "list", "--server",
                                   servers[1].address, "-o", "json"], capture_output=True, text=True, timeout=60,
                                  cwd=ROOT)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            return json.loads(proc.stdout), proc.stderr

        page, _ = listed()
        assert [r["version"] for r in page["replicas"]] == [__version__, __version__] and page["warnings"] == []
        owner = page["replicas"][0]["name"].split("/")[1]
        url = next(a for a in servers[0].args if a.startswith("postgresql"))
        engine = sa.create_engine(url)
        with engine.begin() as conn:  # as an older release's replica would have written it
            conn.execute(sa.text("UPDATE replica_leases SET version = '0.0.9' WHERE owner = :o"), {"o": owner})
        engine.dispose()
        page, _ = listed()
        assert sorted(r["version"] for r in page["replicas"]) == ["0.0.9", __version__]
        assert page["warnings"] == [f"the replicas run different releases: 0.0.9 (1), {__version__} (1)"]
