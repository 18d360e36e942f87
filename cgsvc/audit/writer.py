"""Group commit: one writer drains a queue of appends into shared transactions.

Callers get a future that resolves only after the transaction holding their record has
committed, so every answer is durable; concurrent requests share one commit (one fsync),
which is where the throughput under load comes from. Asyncio callers (`submit_async`) are
woken once per batch and event loop, not once per record: one cross-thread call settles
every future the commit answered.

    AuditWriter         the writer is a thread of this process
    ProcessAuditWriter  the thread hands each batch to a writer process with its own
                        interpreter, so hashing and SQL no longer share the event loop's GIL
                        (the server's default; docs/decisions.md)
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cgsvc.audit.store import AppendResult, AuditStore, PendingAppend

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


class ProcessAuditWriter(AuditWriter):
    """Group commit in a separate process. This process's writer thread pickles each batch to
    the child, which appends it to its own store (the same database) and answers after the
    commit; the thread then settles the callers. A child that dies fails the batch in flight
    and is started again for the next one."""

    def __init__(self, store: AuditStore, max_batch: int = 256,
                 observe: Callable[[int, float], None] | None = None) -> None:
        self._ctx = mp.get_context("spawn")  # never fork a process that runs gRPC
        self._conn: Any = None
        self._proc: Any = None
        self._start_child(store.url)
        super().__init__(store, max_batch, observe)

    def _start_child(self, url: str) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_writer_process, args=(url, child), name="cgsvc-audit-writer",
                                       daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if parent.recv() != "ready":  # the child opened the database
            raise WriterProcessError("the audit writer process did not start")

    def _append(self, items: list[PendingAppend]) -> list[AppendResult]:
        try:
            self._conn.send(items)
            status, payload = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._proc.join(1)
            self._start_child(self.store.url)
            raise WriterProcessError(f"the audit writer process died ({exc}); the batch may not be committed") \
                from None
        if status != "ok":
            raise WriterProcessError(payload)
        return payload  # type: ignore[no-any-return]

    def close(self, timeout: float = 30.0) -> None:
        super().close(timeout)
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(timeout)


def _writer_process(url: str, conn: Any) -> None:
    """The child: append each batch it is sent and answer after the commit. Answers leave out
    the records' spec and plan JSON (the parent has them) to keep the pipe short."""
    store = AuditStore(url)
    conn.send("ready")
    while True:
        try:
            items = conn.recv()
        except EOFError:  # the parent is gone (stopped, or killed): nothing more will come
            break
        if items is None:
            break
        try:
            results = [r.slim() for r in store.append_batch(items)]
        except Exception as exc:  # noqa: BLE001 - the parent reports it to every caller of the batch
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        try:
            conn.send(("ok", results))
        except OSError:  # the parent died after the commit: the records are durable regardless
            break
    store.close()
