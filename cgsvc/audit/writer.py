"""Group commit: one writer drains a queue of appends into shared transactions.

Callers get a future that resolves only after the transaction holding their record has
committed, so every answer is durable; concurrent requests share one commit (one fsync),
which is where the throughput under load comes from. Asyncio callers (`submit_async`) are
woken once per batch and event loop, not once per record: one cross-thread call settles
every future the commit answered.

    AuditWriter         the writer is a thread of this process
    ProcessAuditWriter  a writer process with its own interpreter does the hashing and the SQL;
                        the event loop itself streams appends to it over a socket and settles
                        its answers, with no thread in between (the server's default;
                        docs/decisions.md)

Both answer `submit_async(item)` and `await aclose()` (finish what was submitted, then stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import multiprocessing as mp
import operator
import os
import pickle
import queue
import select
import socket
import struct
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cgsvc.audit.records import AuditEntry, chained
from cgsvc.audit.store import (
    AppendResult,
    AuditStore,
    PendingAppend,
    PlanListing,
    database_unavailable,
)

_STOP = object()


class AuditWriter:
    """Serialises appends to the store, batching whatever is waiting (up to max_batch)."""

    def __init__(self, store: AuditStore, max_batch: int = 256,
                 observe: Callable[[int, float], None] | None = None) -> None:
        self.store = store
        self.max_batch = max_batch
        self.observe = observe
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    def _append(self, items: list[PendingAppend]) -> list[AppendResult]:
        """Commit one batch; durable when this returns."""
        return self.store.append_batch(items)

    def submit(self, item: PendingAppend) -> Future[AppendResult]:
        fut: Future[AppendResult] = Future()
        self._queue.put((item, fut))
        return fut

    def submit_async(self, item: PendingAppend) -> asyncio.Future[AppendResult]:
        """The same, for a caller on an event loop (settled on that loop, batch by batch)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[AppendResult] = loop.create_future()
        self._queue.put((item, (loop, fut)))
        return fut

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is queued, then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    async def aclose(self, timeout: float = 30.0) -> None:
        await asyncio.to_thread(self.close, timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                batch.append(nxt)
            items = [b[0] for b in batch]  # type: ignore[index]
            waiters: list[Any] = [b[1] for b in batch]  # type: ignore[index]
            # A caller that gave up (cancelled) is still audited; it just gets no answer.
            live = [w.set_running_or_notify_cancel() if isinstance(w, Future) else True for w in waiters]
            t0 = time.perf_counter()
            try:
                results: list[Any] = self._append(items)
            except Exception as exc:  # noqa: BLE001 - every waiter must learn the batch failed
                self._settle(waiters, live, [exc] * len(waiters))
                continue
            if self.observe is not None:
                self.observe(len(items), time.perf_counter() - t0)
            self._settle(waiters, live, results)

    @staticmethod
    def _settle(waiters: list[Any], live: list[bool], outcomes: list[Any]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[AppendResult], Any]]] = defaultdict(list)
        for waiter, ok, outcome in zip(waiters, live, outcomes, strict=True):
            if isinstance(waiter, Future):
                if ok:
                    if isinstance(outcome, BaseException):
                        waiter.set_exception(outcome)
                    else:
                        waiter.set_result(outcome)
            else:
                by_loop[waiter[0]].append((waiter[1], outcome))
        for loop, pairs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to answer
                loop.call_soon_threadsafe(_settle_on_loop, pairs)


def _settle_on_loop(pairs: list[tuple[asyncio.Future[AppendResult], Any]]) -> None:
    for fut, outcome in pairs:
        if fut.done():  # its caller was cancelled
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


class WriterProcessError(RuntimeError):
    """The writer process failed a batch or died; the batch's callers get this."""


class AuditDatabaseUnavailable(WriterProcessError):
    """The writer process failed a batch because the database did not do its part (store.database_unavailable)."""


_FRAME = struct.Struct("!i")  # multiprocessing.Connection's framing: a 4-byte length, then the pickle
log = logging.getLogger("cgsvc.audit.writer")


def _frame(message: Any) -> bytes:
    """A message as it crosses the writer's socket, either way."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME.pack(len(data)) + data


class _Reader:
    """Reads a socket into a buffer through one scratch area made once: `sock.recv(n)` makes a
    fresh n-byte object per call, and at the 1 MiB either end asks for that cost ~20 us a read
    here against ~3 us (every append the child reads, every answer the parent reads)."""

    def __init__(self, size: int = 1 << 20) -> None:
        self._scratch = bytearray(size)
        self._view = memoryview(self._scratch)

    def read(self, sock: socket.socket, into: bytearray) -> int:
        """Append what the socket has to `into`; the count read (0: end of file)."""
        n = sock.recv_into(self._scratch)
        into += self._view[:n]
        return n


def _frame_end(buf: bytearray, pos: int = 0) -> int:
    """The end of the frame that starts at `pos` in `buf`, or 0 while only part of it is there."""
    if len(buf) - pos < 4:
        return 0
    end = pos + 4 + _FRAME.unpack_from(buf, pos)[0]
    return end if len(buf) >= end else 0


class ProcessAuditWriter:
    """Group commit in a separate process, driven by the event loop that submits.

    Appends submitted in one turn of the loop go to the child as one message, at once: the
    loop does not wait for the previous commit. The child, when it finishes a commit, takes
    every message that arrived meanwhile into its next transaction (up to max_batch records),
    so batches grow with the load and the child never waits for a round trip. It answers each
    message, in order, after the commit; the loop reads the answers from the same socket and
    settles their callers. A child that dies fails the messages it had not answered (their
    records may or may not be committed) and is started again, off the loop, for the next ones.

    Callers of one commit are answered together and come back together: under load they move
    as cohorts. Each message carries how many appends the parent has waiting for an answer,
    its own included, and the child holds a commit open (up to `cohort_wait` seconds, and no
    longer than `cohort_gap` after the last append) until it holds half of the most that were
    waiting lately: two cohorts then take turns, one committing while the server works on the
    other, so neither the disk nor the server waits for the other, and a commit is still several
    records, not one or two (every stage's per-commit and per-wake-up work then costs less per
    request). The child chains each append into the open commit as it arrives, so the wait is
    not idle (AuditStore.open_batch). A lone caller never waits.
    """

    def __init__(self, store: AuditStore, max_batch: int = 256,
                 observe: Callable[[int, float], None] | None = None, cohort_wait: float = 0.005,
                 cohort_gap: float = 0.002) -> None:
        self.store = store
        self.max_batch = max_batch
        self.observe = observe
        self.cohort_wait = cohort_wait
        self.cohort_gap = cohort_gap
        self._loop = asyncio.get_running_loop()
        self._ctx = mp.get_context("spawn")  # never fork a process that runs gRPC
        self._unsent: list[tuple[PendingAppend, asyncio.Future[AppendResult]]] = []
        # one entry per message sent: its appends and their callers
        self._inflight: deque[list[tuple[PendingAppend, asyncio.Future[AppendResult]]]] = deque()
        self._out = bytearray()  # framed messages the socket has not taken yet
        self._in = bytearray()  # answer bytes not yet a whole frame
        self._reader = _Reader()
        self._flush_scheduled = False
        self._closing = False
        self._drained: asyncio.Future[None] | None = None
        self._proc: Any = None
        self._sock: socket.socket | None = None
        self.child_frozen_objects = 0  # what the child froze out of its garbage collector at start
        self._attach(self._spawn())

    # ------------------------------------------------------------------ child
    def _spawn(self) -> tuple[Any, socket.socket, int]:
        """Start a child and wait until it has opened the database (blocking): (process, socket,
        objects it froze out of its garbage collector)."""
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_writer_process, args=(self.store.url, child, self.max_batch, self.cohort_wait,
                                                                     self.cohort_gap),
                                 name="cgsvc-audit-writer", daemon=True)
        proc.start()
        child.close()
        try:
            ready = parent.recv()
        except EOFError:
            ready = None
        if not (isinstance(ready, tuple) and ready[0] == "ready"):
            parent.close()
            raise WriterProcessError("the audit writer process did not start")
        sock = socket.socket(fileno=os.dup(parent.fileno()))
        parent.close()
        sock.setblocking(False)
        return proc, sock, int(ready[1])

    def _attach(self, spawned: tuple[Any, socket.socket, int]) -> None:
        self._proc, self._sock, self.child_frozen_objects = spawned
        self._loop.add_reader(self._sock.fileno(), self._on_readable)
        self._flush()  # what was submitted while there was no child

    def _child_lost(self, why: str) -> None:
        """The child died (or its socket failed): fail what it had not answered, start another."""
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
            sock.close()
        if self._proc is not None:
            self._proc.join(0)
        self._out.clear()
        self._in.clear()
        error = WriterProcessError(f"the audit writer process died ({why}); the batch may not be committed")
        while self._inflight:
            for _item, fut in self._inflight.popleft():
                if not fut.done():
                    fut.set_exception(error)
        self._check_drained()
        if not self._closing:
            log.error("audit writer process lost (%s); starting another", why)
            self._respawn()

    def _respawn(self) -> None:
        def done(task: asyncio.Future[tuple[Any, socket.socket, int]]) -> None:
            exc = task.exception()
            if exc is None and self._closing:  # closed while it started: nothing more to write
                _, sock, _ = task.result()
                sock.close()  # the child sees end of file and exits
                return
            if exc is None:
                self._attach(task.result())
                return
            unsent, self._unsent = self._unsent, []
            for _item, fut in unsent:
                if not fut.done():
                    fut.set_exception(WriterProcessError(f"the audit writer process cannot start: {exc}"))
            if not self._closing:
                self._loop.call_later(1.0, self._respawn)
        self._loop.run_in_executor(None, self._spawn).add_done_callback(done)

    # ------------------------------------------------------------------ submit and send
    def submit_async(self, item: PendingAppend) -> asyncio.Future[AppendResult]:
        """Queue an append; the future resolves after the commit that holds it."""
        fut: asyncio.Future[AppendResult] = self._loop.create_future()
        self._unsent.append((item, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._sock is None or not self._unsent:
            return
        unsent, self._unsent = self._unsent, []
        waiting = sum(map(len, self._inflight))  # appends sent before and not answered yet
        for i in range(0, len(unsent), self.max_batch):
            part = unsent[i:i + self.max_batch]
            self._inflight.append(part)
            waiting += len(part)
            self._write(_frame((waiting, [_to_wire(item) for item, _ in part])))

    def _write(self, data: bytes) -> None:
        assert self._sock is not None
        if not self._out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the child is gone: the reader sees EOF and fails what was in flight
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._loop.add_writer(self._sock.fileno(), self._on_writable)
        self._out += data

    def _on_writable(self) -> None:
        assert self._sock is not None
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._loop.remove_writer(self._sock.fileno())
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._sock.fileno())

    # ------------------------------------------------------------------ answers
    def _on_readable(self) -> None:
        assert self._sock is not None
        try:
            read = self._reader.read(self._sock, self._in)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._child_lost(str(exc))
            return
        if not read:
            self._child_lost("end of file")
            return
        pos = 0
        while end := _frame_end(self._in, pos):
            answer = pickle.loads(self._in[pos + 4:end])
            pos = end
            self._settle(self._inflight.popleft(), answer)
        del self._in[:pos]
        self._check_drained()

    def _settle(self, part: list[tuple[PendingAppend, asyncio.Future[AppendResult]]],
                answer: tuple[str, Any, Any]) -> None:
        status, payload, stats = answer
        if stats is not None and self.observe is not None:
            self.observe(*stats)
        if status != "ok":
            error = (AuditDatabaseUnavailable if status == "unavailable" else WriterProcessError)(payload)
        for i, (item, fut) in enumerate(part):
            if fut.done():  # its caller was cancelled (it is audited all the same)
                continue
            if status == "ok":
                fut.set_result(_result_from_wire(item, payload[i]))
            else:
                fut.set_exception(error)

    # ------------------------------------------------------------------ close
    def _check_drained(self) -> None:
        if self._drained is not None and not self._inflight and not self._unsent and not self._drained.done():
            self._drained.set_result(None)

    async def aclose(self, timeout: float = 30.0) -> None:
        """Finish what was submitted, then stop the child."""
        self._closing = True
        self._flush()
        if self._inflight or self._unsent:
            self._drained = self._loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained, timeout)
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
            with contextlib.suppress(OSError):
                sock.setblocking(True)
                sock.sendall(_frame(None))
            sock.close()
        if self._proc is not None:
            await asyncio.to_thread(self._proc.join, timeout)


# Either writer: both answer submit_async(item) and await aclose().
Writer = AuditWriter | ProcessAuditWriter


# What crosses the socket: appends as tuples of their fields' values, and results as the four
# values the chain gave a record — its sequence, time, previous hash and hash — from which the
# parent rebuilds the record of the entry it sent (records.chained). Pickled dataclasses carry
# every field's name and cost several times as much to encode and decode, on both sides. A
# result whose record is not that entry's (a replay, a reused request id, a NUL recorded as
# `\u0000`) crosses whole: those are rare, and the parent could not rebuild them.
_entry_values = operator.attrgetter(*(f.name for f in dataclasses.fields(AuditEntry)))
_listing_values = operator.attrgetter(*(f.name for f in dataclasses.fields(PlanListing)))
WireAppend = tuple[tuple[Any, ...], tuple[str, ...] | None, str]
WireResult = tuple[int, str, str, str] | AppendResult


def _to_wire(item: PendingAppend) -> WireAppend:
    return _entry_values(item.entry), None if item.plan is None else _listing_values(item.plan), item.request_id


def _from_wire(values: WireAppend) -> PendingAppend:
    entry, listing, request_id = values
    return PendingAppend(AuditEntry(*entry), None if listing is None else PlanListing(*listing), request_id)


def _result_to_wire(sent: PendingAppend, appended: PendingAppend, result: AppendResult) -> WireResult:
    """`appended`: the append as the batch chained it (the one sent, unless it was rewritten)."""
    record = result.record
    if appended is sent and result.replay_of is None and not result.conflict:
        return record.sequence, record.time, record.prev_hash, record.record_hash
    return result


def _result_from_wire(item: PendingAppend, result: WireResult) -> AppendResult:
    if isinstance(result, AppendResult):
        return result
    return AppendResult(chained(item.entry, *result))


class _Channel:
    """The child's end of the socket, in the parent's framing (a 4-byte length, then the pickle),
    with few system calls: whatever has arrived is taken in one read and parsed from a buffer, and
    every answer of a commit leaves in one write, so the parent wakes once per commit, not once per
    message (multiprocessing.Connection reads a frame in two calls after a poll, and writes each
    frame on its own)."""

    def __init__(self, fileno: int) -> None:
        self.sock = socket.socket(fileno=os.dup(fileno))
        self.sock.setblocking(True)
        self._poller = select.poll()
        self._poller.register(self.sock.fileno(), select.POLLIN)
        self._buf = bytearray()
        self._reader = _Reader()
        self._eof = False

    def _fill(self, timeout: float | None) -> bool:
        """Read what has arrived, waiting up to `timeout` seconds (None: until something does);
        False when nothing came in time. End of file counts as something."""
        if timeout is not None and not self._poller.poll(max(0.0, timeout) * 1000):
            return False
        if not self._reader.read(self.sock, self._buf):
            self._eof = True
        return True

    def poll(self, timeout: float) -> bool:
        """Whether a whole message (or end of file) is there to take within `timeout` seconds."""
        deadline = time.perf_counter() + timeout
        while not _frame_end(self._buf) and not self._eof:
            if not self._fill(deadline - time.perf_counter()):
                return False
        return True

    def recv(self) -> Any:
        """The next message, waiting for it; EOFError when the parent has gone."""
        while not (end := _frame_end(self._buf)):
            if self._eof:
                raise EOFError("the parent closed the socket")
            self._fill(None)
        message = pickle.loads(self._buf[4:end])
        del self._buf[:end]
        return message

    def send_all(self, messages: list[Any]) -> None:
        """Frame every message and write them all at once."""
        self.sock.sendall(b"".join(map(_frame, messages)))

    def close(self) -> None:
        self.sock.close()


def _writer_process(url: str, conn: Any, max_batch: int, cohort_wait: float, cohort_gap: float) -> None:
    """The child: append what it is sent, answering each message after the commit that holds
    it. The first message opens a batch (AuditStore.open_batch) and each message that arrives
    while it is open is chained into it at once, so the hashing and the rows are done while
    the rest of the cohort arrives; while the batch holds fewer than half of the most appends
    the parent had waiting (in this batch's messages and the last eight batches') it stays
    open, up to `cohort_wait` seconds in all and `cohort_gap` after the last append (a lone
    caller never waits). A message is (appends waiting in the parent, appends) or None (stop);
    appends arrive and results leave in the wire form (_to_wire, _result_to_wire), every answer
    of a commit in one write."""
    store = AuditStore(url)
    gc.collect()
    gc.freeze()  # as the server does after start-up: a full collection stalled a commit ~45 ms
    conn.send(("ready", gc.get_freeze_count()))
    chan = _Channel(conn.fileno())
    conn.close()
    recent: deque[int] = deque(maxlen=8)  # the most appends the parent had waiting, in each of the last batches
    stopping = False
    while not stopping:
        try:
            message = chan.recv()
        except EOFError:  # the parent is gone (stopped, or killed): nothing more will come
            break
        if message is None:
            break
        most, wires = message  # the parent's count of appends waiting for an answer, and these
        sent = [_from_wire(values) for values in wires]  # every append of the batch, as received
        sizes = [len(sent)]
        t0 = time.perf_counter()
        busy = 0.0  # seconds spent appending, not waiting
        failure, away = "", False
        batch = None
        try:
            batch = store.open_batch()
            batch.add(sent)
            deadline = time.perf_counter() + cohort_wait
            lately = max(recent, default=0)  # fixed while this batch is open
            while len(batch) < max_batch:
                if not chan.poll(0):
                    left = deadline - time.perf_counter()
                    if 2 * len(batch) >= max(most, lately) or left <= 0:
                        break
                    busy += time.perf_counter() - t0
                    ready = chan.poll(min(left, cohort_gap))
                    t0 = time.perf_counter()
                    if not ready:
                        break
                message = chan.recv()
                if message is None:
                    stopping = True
                    break
                waiting, wires = message
                most = max(most, waiting)
                nxt = [_from_wire(values) for values in wires]
                sent += nxt
                sizes.append(len(nxt))
                batch.add(nxt)
            committed = batch.commit()
            results = [_result_to_wire(*r) for r in zip(sent, batch.items, committed, strict=True)]
        except Exception as exc:  # noqa: BLE001 - the parent reports it to every caller of the batch
            failure, away = f"{type(exc).__name__}: {exc}", database_unavailable(exc)
            if batch is not None:
                batch.abort()  # rolled back (a no-op when the store already did)
                try:  # a lost connection: the log says whether the batch is in it, or it goes again
                    committed = store.append_again(sent, batch, exc)
                    results = [_result_to_wire(*r) for r in zip(sent, batch.items, committed, strict=True)]
                    failure = ""
                except Exception as again:  # noqa: BLE001 - as above
                    failure, away = f"{type(again).__name__}: {again}", database_unavailable(again)
        busy += time.perf_counter() - t0
        recent.append(most)
        answers: list[tuple[str, Any, Any]] = []
        if failure:
            answers = [("unavailable" if away else "error", failure, None)] * len(sizes)
        else:
            stats = (len(results), busy)
            k = 0
            for j, size in enumerate(sizes):
                answers.append(("ok", results[k:k + size], stats if j == 0 else None))
                k += size
        try:
            chan.send_all(answers)
        except OSError:  # the parent died after the commit: the records are durable regardless
            break
        store.after_commit()  # off the answered callers' path
    chan.close()
    store.close()
