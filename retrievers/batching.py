"""The micro-batcher both servers share (`kbrouter serve`, `kbrouter serve-retrieval`).

Items submitted close together are gathered for up to `max_wait_s` (or `max_batch` items) and run as one blocking
`fn(payloads, key)` call per distinct key, in a worker thread. One item never takes others down with it:

- when a batched call raises, its items are retried one at a time, so only the culprit's future gets the error;
- the gathering loop catches every per-batch failure, and if the loop task ends anyway a supervisor restarts it
  (`healthy` is False while it is down, so `/health` can say so);
- an item whose future was cancelled (its client went away, see `wait_or_cancel`) is dropped before its call;
- during a call, `fn` may ask `abandoned_items()` which of its items nobody awaits any more (the client left, or the
  server is stopping) and end their work early: the transformers backends stop generating those rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

RESTART_DELAY_S = 0.05
STOP_GRACE_S = 0.5  # how long `stop` waits for a running call to see its items abandoned and return

# the items of the batched call running in this worker thread (set by `MicroBatcher._call`, read by `fn`)
_running_items: contextvars.ContextVar[list | None] = contextvars.ContextVar("running_items", default=None)


def abandoned_items() -> list[bool] | None:
    """Inside a `MicroBatcher` call: for each of its payloads, whether nobody awaits its result any more (its client
    disconnected or the server is shutting down), so `fn` may stop working on it. None outside a batcher call."""
    items = _running_items.get()
    return None if items is None else [it.future.done() for it in items]


class QueueFull(Exception):
    """More items are queued than `max_pending`; the caller should answer 503 (retry later)."""


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its pending items were cancelled."""


@dataclass
class _Item:
    payload: Any
    key: Hashable
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    """Gathers items and answers them with as few `fn(payloads, key) -> results` calls as possible.

    Args:
        fn: blocking batched call; returns one result per payload, in order. Runs in a worker thread.
        name: for logs and task names.
        max_batch: most items in one call.
        max_wait_s: how long the first item of a batch waits for company.
        max_pending: queued items before `submit` raises `QueueFull` (None: unbounded).
        on_batch: called with the size of every successful call (for metrics).
    """

    def __init__(
        self,
        fn: Callable[[list, Hashable], Sequence],
        *,
        name: str = "batcher",
        max_batch: int = 32,
        max_wait_s: float = 0.01,
        max_pending: int | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending
        self.on_batch = on_batch
        self.restarts = 0
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._running: list[_Item] = []  # the items of the call in progress (failed by `stop`, so it can end early)
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._idle = threading.Event()  # clear while a call runs in its thread
        self._idle.set()

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop on the running event loop (a fresh queue: a queue binds to the loop that first uses it)."""
        self._stopping = False
        self.queue = asyncio.Queue()
        self._spawn()

    def _spawn(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)
        self._task.add_done_callback(self._supervise)

    def _supervise(self, task: asyncio.Task) -> None:
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        logger.error("%s: batching loop ended (%r); restarting", self.name, error, exc_info=error)
        self.restarts += 1
        # a short pause, so a loop that dies at once does not spin; `healthy` is False meanwhile
        asyncio.get_running_loop().call_later(RESTART_DELAY_S, lambda: None if self._stopping else self._spawn())

    async def stop(self) -> None:
        self._stopping = True
        running = list(self._running)  # cancelling the loop task clears `_running` (its `finally`)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        stopping = RuntimeError(f"{self.name} is shutting down")
        for item in running:  # a call still running in its thread sees them abandoned and can end early
            _fail(item, stopping)
        while not self.queue.empty():  # nobody will answer these now
            _fail(self.queue.get_nowait(), stopping)
        if running:  # give it the moment to notice, so the process does not end under it
            await asyncio.to_thread(self._idle.wait, STOP_GRACE_S)

    def submit(self, payload: Any, key: Hashable) -> asyncio.Future:
        """Queue one item; its future gets `fn`'s result for it, or the exception its own call raised."""
        hash(key)  # an unhashable key is the caller's error, raised here and not inside the loop
        if self.max_pending is not None and self.queue.qsize() >= self.max_pending:
            raise QueueFull(f"{self.name} has {self.queue.qsize()} items queued; retry later")
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Item(payload, key, future))
        return future

    async def _gather(self) -> list[_Item]:
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        deadline = loop.time() + self.max_wait_s
        while len(batch) < self.max_batch:
            timeout = deadline - loop.time()
            try:
                batch.append(
                    self.queue.get_nowait() if timeout <= 0 else await asyncio.wait_for(self.queue.get(), timeout)
                )
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._gather()
            groups: dict[Hashable, list[_Item]] = {}
            for item in batch:
                if not item.future.done():  # dropped: its client went away
                    groups.setdefault(item.key, []).append(item)
            for key, items in groups.items():
                try:
                    await self._answer(key, items)
                except Exception as e:  # a bug here fails these items, never the loop
                    logger.exception("%s: answering a batch failed", self.name)
                    for item in items:
                        _fail(item, e)

    def _call_in_thread(self, items: list[_Item], key: Hashable) -> Sequence:
        _running_items.set(items)  # this thread's context is a copy: the setting ends with the call
        try:
            return self.fn([it.payload for it in items], key)
        finally:
            self._idle.set()

    async def _call(self, items: list[_Item], key: Hashable) -> Sequence:
        self._running = items
        self._idle.clear()
        try:
            outs = await asyncio.to_thread(self._call_in_thread, items, key)
        finally:
            self._running = []
        if len(outs) != len(items):
            raise RuntimeError(f"{self.name}: {len(outs)} results for {len(items)} items")
        if self.on_batch is not None:
            self.on_batch(len(items))
        return outs

    async def _answer(self, key: Hashable, items: list[_Item]) -> None:
        try:
            outs = await self._call(items, key)
        except Exception as e:
            if len(items) == 1:
                _fail(items[0], e)
                return
            logger.warning("%s: a batch of %d failed (%s); retrying its items one by one", self.name, len(items), e)
            for item in items:
                if item.future.done():
                    continue
                try:
                    (out,) = await self._call([item], key)
                except Exception as e1:
                    _fail(item, e1)
                else:
                    _succeed(item, out)
            return
        for item, out in zip(items, outs, strict=True):
            _succeed(item, out)


def _succeed(item: _Item, out: Any) -> None:
    if not item.future.done():
        item.future.set_result(out)


def _fail(item: _Item, error: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(error)


async def wait_or_cancel(futures: list[asyncio.Future], request: Any, poll_s: float = 0.1) -> list:
    """Each future's result or exception, in order; if `request` (a Starlette request) disconnects first, the
    futures are cancelled and `ClientGone` is raised.

    Cancelled items that are still queued are dropped by the batcher, so a client that leaves costs no more work.
    """
    gathered = asyncio.gather(*futures, return_exceptions=True)
    try:
        while True:
            done, _ = await asyncio.wait({gathered}, timeout=poll_s)
            if done:
                return gathered.result()
            if await request.is_disconnected():
                raise ClientGone("client disconnected")
    except BaseException:  # disconnected, or the handler itself was cancelled
        for f in futures:
            f.cancel()
        gathered.cancel()
        raise
