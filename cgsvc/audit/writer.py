"""Group commit: one writer thread drains a queue of appends into shared transactions.

Callers get a future that resolves only after the transaction holding their record has
committed, so every answer is durable; concurrent requests share one commit (one fsync),
which is where the throughput under load comes from.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

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

    def submit(self, item: PendingAppend) -> Future[AppendResult]:
        fut: Future[AppendResult] = Future()
        self._queue.put((item, fut))
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
            futures: list[Future[AppendResult]] = [b[1] for b in batch]  # type: ignore[index]
            # A caller that gave up (cancelled) is still audited; it just gets no answer.
            live = [f.set_running_or_notify_cancel() for f in futures]
            t0 = time.perf_counter()
            try:
                results = self.store.append_batch(items)
            except Exception as exc:  # noqa: BLE001 - every waiter must learn the batch failed
                for fut, ok in zip(futures, live, strict=True):
                    if ok:
                        fut.set_exception(exc)
                continue
            if self.observe is not None:
                self.observe(len(items), time.perf_counter() - t0)
            for fut, ok, res in zip(futures, live, results, strict=True):
                if ok:
                    fut.set_result(res)
