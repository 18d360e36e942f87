"""The launch lifecycle: admission, dispatch, monitoring, cancellation and recovery.

    PLACING -> LOADING -> CAPTURING -> RUNNING (tokens done) -> SUCCEEDED | FAILED | CANCELLED
    (LOST: a group this server started is gone and left no report)

Launch state lives in the service's database; every state change is appended to the audit
log (linked to the plan by plan_id and to the launch by launch_id). One asyncio task per
active launch follows the worker's events file and its supervisor process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from cgsvc import __version__
from cgsvc.audit.records import AuditEntry
from cgsvc.audit.store import AuditStore, utc_now
from cgsvc.errors import CODE_NUMBERS, FieldViolation, ResolveError
from cgsvc.launch.dispatch import DispatchError, LocalDispatcher, RunHandle, Workload
from cgsvc.resolve import policy_version

log = structlog.get_logger("cgsvc.launch")

ACTIVE = ("PLACING", "LOADING", "CAPTURING", "RUNNING")
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "LOST")
WORKER_STATES = {"loading": "LOADING", "capturing": "CAPTURING", "running": "RUNNING"}
STATE_METHOD = "launch.state"


@dataclass
class Watched:
    """In-memory companion of an active launch: who waits on it, and cancellation."""

    version: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    cancel: bool = False
    cancel_principal: str = ""
    events_offset: int = 0
    task: asyncio.Task[None] | None = None


def tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else text


class LaunchManager:
    def __init__(self, store: AuditStore, auditor: Any, run_root: Path, dispatchers: list[LocalDispatcher],
                 instance: str = "") -> None:
        self.store, self.auditor = store, auditor
        self.run_root = run_root
        self.dispatchers: dict[str, Any] = {d.name: d for d in dispatchers}
        self.instance = instance or uuid.uuid4().hex[:12]
        self.watched: dict[str, Watched] = {}
        self.poll_seconds = 0.1

    # ------------------------------------------------------------------ audit and state
    async def audit(self, launch_id: str, plan_id: str, principal: str, method: str, code: str, message: str,
                    peer: str = "", request_id: str = "", spec_json: str = "", model: str = "", gpu: str = "") -> str:
        entry = AuditEntry(principal=principal, peer=peer, method=method, request_id=request_id,
                           launch_id=launch_id, plan_id=plan_id, policy_version=policy_version(),
                           service_version=__version__, outcome_code=CODE_NUMBERS[code], outcome_message=message,
                           spec_json=spec_json, model=model, gpu=gpu)
        return str((await self.auditor.append(entry)).record.name)

    async def transition(self, row: dict[str, Any], state: str, reason: str = "", principal: str = "cgsvc",
                         **values: Any) -> dict[str, Any]:
        """Persist, audit and announce a state change."""
        if row["state"] == state and not values:
            return row
        await asyncio.to_thread(self.store.update_launch, row["launch_id"], state=state, **values)
        if row["state"] != state:
            await self.audit(row["launch_id"], row["plan_id"], principal, STATE_METHOD, "OK",
                             f"{row['state']} -> {state}" + (f": {reason}" if reason else ""))
            log.info("launch state", launch_id=row["launch_id"], state=state, reason=reason)
        new = await asyncio.to_thread(self.store.get_launch, row["launch_id"])
        assert new is not None
        await self.announce(row["launch_id"])
        return new

    async def announce(self, launch_id: str) -> None:
        w = self.watched.setdefault(launch_id, Watched())
        async with w.changed:
            w.version += 1
            w.changed.notify_all()

    # ------------------------------------------------------------------ create
    def busy_slots(self, rows: list[dict[str, Any]]) -> int:
        return sum(r["tp"] for r in rows if r["state"] in ("LOADING", "CAPTURING", "RUNNING"))

    async def create(self, *, plan_id: str, plan_json: str, spec_json: str, plan_audit: str, tp: int,
                     model_path: str, workload: Workload, dispatcher: str, wait: bool, principal: str,
                     peer: str, request_id: str) -> dict[str, Any]:
        disp = self.dispatchers.get(dispatcher)
        if disp is None:
            raise ResolveError("FAILED_PRECONDITION", f"dispatcher {dispatcher!r} is not configured on this server; "
                               f"available: {', '.join(self.dispatchers)}",
                               [FieldViolation("dispatcher", f"one of {', '.join(self.dispatchers)}")])
        problem = await asyncio.to_thread(disp.check)
        if problem:
            raise ResolveError("FAILED_PRECONDITION", problem, [FieldViolation("dispatcher", problem)])
        if tp > disp.slots:
            raise ResolveError("FAILED_PRECONDITION", f"the plan needs {tp} devices, the {dispatcher} dispatcher has "
                               f"{disp.slots} in all", [FieldViolation("plan", f"tp={tp} > {disp.slots} devices")])
        active = await asyncio.to_thread(self.store.launches_in_states, ACTIVE)
        free = disp.slots - self.busy_slots(active)
        if free < tp and not wait:
            raise ResolveError("RESOURCE_EXHAUSTED", f"the plan needs {tp} devices and {free} of {disp.slots} are "
                               "free; retry later or set wait_for_resources to queue")
        launch_id = uuid.uuid4().hex[:20]
        run_dir = self.run_root / launch_id
        run_dir.mkdir(parents=True)
        (run_dir / "plan.json").write_text(json.dumps({"plan": json.loads(plan_json), "spec": json.loads(spec_json)}))
        now = utc_now()
        row = {"launch_id": launch_id, "plan_id": plan_id, "state": "PLACING", "principal": principal,
               "dispatcher": dispatcher, "tp": tp, "model_path": model_path,
               "workload_json": json.dumps(asdict(workload)), "create_time": now, "update_time": now,
               "tokens_done": 0, "tokens_total": workload.requests * workload.output_len, "error": "",
               "report_json": "", "run_dir": str(run_dir), "handle_json": "", "owner": self.instance}
        await asyncio.to_thread(self.store.put_launch, row)
        await self.audit(launch_id, plan_id, principal, "/cgsvc.v1.LaunchService/CreateLaunch", "OK",
                         f"launch of {plan_audit} on {tp} {dispatcher} ranks", peer=peer, request_id=request_id,
                         spec_json=spec_json)
        self.watched[launch_id] = Watched()
        await self.schedule()
        got = await asyncio.to_thread(self.store.get_launch, launch_id)
        assert got is not None
        return got

    async def schedule(self) -> None:
        """Start placing launches, oldest first, while devices are free."""
        active = await asyncio.to_thread(self.store.launches_in_states, ACTIVE)
        for row in [r for r in active if r["state"] == "PLACING" and r["owner"] == self.instance]:
            disp = self.dispatchers[row["dispatcher"]]
            busy = self.busy_slots(await asyncio.to_thread(self.store.launches_in_states, ACTIVE))
            if disp.slots - busy < row["tp"]:
                return  # FIFO: later launches wait behind this one
            w = self.watched.setdefault(row["launch_id"], Watched())
            if w.cancel:
                continue
            wl = Workload(**json.loads(row["workload_json"]))
            try:
                handle = await asyncio.to_thread(disp.start, row["launch_id"], Path(row["run_dir"]),
                                                 row["model_path"], row["tp"], wl)
            except DispatchError as exc:
                await self.transition(row, "FAILED", str(exc), error=str(exc))
                continue
            row = await self.transition(row, "LOADING", f"supervisor pid {handle.pid}", handle_json=handle.to_json())
            w.task = asyncio.create_task(self.monitor(row["launch_id"]))

    # ------------------------------------------------------------------ monitor
    async def monitor(self, launch_id: str) -> None:
        w = self.watched.setdefault(launch_id, Watched())
        row = await asyncio.to_thread(self.store.get_launch, launch_id)
        assert row is not None
        disp = self.dispatchers[row["dispatcher"]]
        handle = RunHandle.from_json(row["handle_json"])
        run_dir = Path(row["run_dir"])
        while True:
            row = await self.follow_events(row, run_dir / "events.jsonl", w)
            if w.cancel:
                await asyncio.to_thread(disp.stop, handle)
                await self.transition(row, "CANCELLED", f"cancelled by {w.cancel_principal}",
                                      principal=w.cancel_principal, error=f"cancelled by {w.cancel_principal}")
                break
            code = disp.exit_code(handle)
            if code is not None:
                row = await self.follow_events(row, run_dir / "events.jsonl", w)
                await self.finish(row, run_dir, code)
                break
            await asyncio.sleep(self.poll_seconds)
        await self.schedule()

    async def follow_events(self, row: dict[str, Any], path: Path, w: Watched) -> dict[str, Any]:
        try:
            with open(path, encoding="utf-8") as fh:
                fh.seek(w.events_offset)
                chunk = fh.read()
        except FileNotFoundError:
            return row
        complete = chunk[: chunk.rfind("\n") + 1]
        w.events_offset += len(complete.encode())
        for line in complete.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "state" and ev.get("state") in WORKER_STATES:
                row = await self.transition(row, WORKER_STATES[ev["state"]])
            elif ev.get("event") == "progress":
                await asyncio.to_thread(self.store.update_launch, row["launch_id"],
                                        tokens_done=int(ev["tokens_done"]), tokens_total=int(ev["tokens_total"]))
                row = {**row, "tokens_done": int(ev["tokens_done"]), "tokens_total": int(ev["tokens_total"])}
                await self.announce(row["launch_id"])
        return row

    async def finish(self, row: dict[str, Any], run_dir: Path, code: int) -> None:
        report_path = run_dir / "report.json"
        report: dict[str, Any] = {}
        if report_path.exists():
            try:
                report = json.loads(report_path.read_text())
            except ValueError:
                report = {}
        if report.get("status") == "ok" and code in (0, -1):
            done = report.get("aggregate", {}).get("output_tokens", row["tokens_done"])
            await self.transition(row, "SUCCEEDED", report_json=json.dumps(report), tokens_done=done)
            return
        if not report and code == -1:
            await self.transition(row, "LOST", "the worker group is gone and left no report",
                                  error="the worker group is gone and left no report (killed, or the machine "
                                        "restarted)")
            return
        error = report.get("error") or f"the worker supervisor exited with code {code}"
        ranks = report.get("rank_errors", [])
        for r in ranks:
            last = tail(run_dir / "logs" / f"rank{r['rank']}.log", 5)
            error += f"\nrank {r['rank']} exited with code {r['exit_code']}" + (f"; last log lines:\n{last}" if last else "")
        if not ranks:
            last = tail(run_dir / "logs" / "rank0.log", 5) or tail(run_dir / "logs" / "supervisor.log", 5)
            if last:
                error += f"\nlast log lines:\n{last}"
        await self.transition(row, "FAILED", error.splitlines()[0], error=error, report_json=json.dumps(report))

    # ------------------------------------------------------------------ cancel, watch, recover
    async def cancel(self, launch_id: str, principal: str) -> dict[str, Any]:
        row = await asyncio.to_thread(self.store.get_launch, launch_id)
        if row is None:
            raise ResolveError("NOT_FOUND", f"launches/{launch_id} does not exist")
        if row["state"] in TERMINAL:
            raise ResolveError("FAILED_PRECONDITION", f"launches/{launch_id} has already ended ({row['state']})")
        w = self.watched.setdefault(launch_id, Watched())
        w.cancel, w.cancel_principal = True, principal
        if row["state"] == "PLACING":
            row = await self.transition(row, "CANCELLED", f"cancelled by {principal} before it started",
                                        principal=principal, error=f"cancelled by {principal}")
            return row
        for _ in range(400):  # the monitor stops the group; wait for it (bounded)
            row = await asyncio.to_thread(self.store.get_launch, launch_id)
            assert row is not None
            if row["state"] in TERMINAL:
                break
            await asyncio.sleep(0.05)
        return row

    async def watch(self, launch_id: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        row = await asyncio.to_thread(self.store.get_launch, launch_id)
        if row is None:
            raise ResolveError("NOT_FOUND", f"launches/{launch_id} does not exist")
        w = self.watched.setdefault(launch_id, Watched())
        yield "state", row
        seen_version, last_state = w.version, row["state"]
        while row["state"] not in TERMINAL:
            async with w.changed:
                # Also re-read every second: another replica may own this launch.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.changed.wait_for(functools.partial(self._moved, w, seen_version)),
                                           timeout=1.0)
            seen_version = w.version
            new = await asyncio.to_thread(self.store.get_launch, launch_id)
            assert new is not None
            if new["state"] != last_state or new["tokens_done"] != row["tokens_done"]:
                yield ("state" if new["state"] != last_state else "progress"), new
            row, last_state = new, new["state"]

    @staticmethod
    def _moved(w: Watched, version: int) -> bool:
        return w.version != version

    async def recover(self) -> list[str]:
        """At start-up: re-attach to groups that still run, settle those that ended, never forget one."""
        notes = []
        for row in await asyncio.to_thread(self.store.launches_in_states, ACTIVE):
            disp = self.dispatchers.get(row["dispatcher"])
            w = self.watched.setdefault(row["launch_id"], Watched())
            await asyncio.to_thread(self.store.update_launch, row["launch_id"], owner=self.instance)
            row["owner"] = self.instance
            if row["state"] == "PLACING" or disp is None:
                if disp is None:
                    await self.transition(row, "LOST", f"dispatcher {row['dispatcher']!r} is not configured here",
                                          error=f"dispatcher {row['dispatcher']!r} is not configured on this server")
                continue
            handle = RunHandle.from_json(row["handle_json"])
            if disp.alive(handle):
                notes.append(f"re-attached launches/{row['launch_id']} (pid {handle.pid})")
                await self.audit(row["launch_id"], row["plan_id"], "cgsvc", STATE_METHOD, "OK",
                                 f"re-attached after a server restart (pid {handle.pid})")
                w.task = asyncio.create_task(self.monitor(row["launch_id"]))
            else:
                await self.finish(row, Path(row["run_dir"]), -1)
                notes.append(f"settled launches/{row['launch_id']} that ended while the server was down")
        await self.schedule()
        return notes

    async def close(self) -> None:
        """Stop following launches (they keep running; a restarted server re-attaches)."""
        for w in self.watched.values():
            if w.task is not None:
                w.task.cancel()
