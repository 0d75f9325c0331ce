"""asyncio integration: await ucxpy operations while the event loop progresses.

::

    import asyncio, ucxpy, ucxpy.aio as aio

    async def main(world):
        await aio.wait(world.isend(b"ping", 1, tag=7))
        info = await aio.tag_recv(world.worker, buf, tag=7, source=1, timeout=5)
        async with aio.progress(world.worker):      # e.g. serve AM handlers / RMA
            await asyncio.sleep(10)

Theory of operation
-------------------
Explicit progress stays the rule; this module only decides *who* calls
``worker.progress()``: one :class:`AsyncProgress` driver task per (event
loop, worker), running while something awaits that worker (or an
``async with progress(worker)`` block is open) and ending when nothing does.
After a pass that handled events, and for ``UCXPY_BUSY_POLL`` seconds after
the last one, the driver only yields to the loop (``sleep(0)``), so other
coroutines run between passes.  Then it arms the transports
(``Interface.wait_fds``, exactly as the blocking calls do before they
sleep), registers their descriptors with ``loop.add_reader`` and sleeps
until one is readable, a new waiter arrives, or a nap (20 µs doubling to
2 ms) ends, which also drives the transports' timers.  Launcher failure
notices are checked as in :meth:`ucxpy.Worker.wait_until`.

Requests complete through their done-callbacks (no polling per request);
conditions (flush, fence) are tested after each progress pass.

Timeouts and cancellation: ``timeout=None`` means ``UCXPY_TIMEOUT`` (0 =
none) and raises :class:`ucxpy.TimeoutError`, like the blocking calls.
:func:`wait` leaves a request it did not post alone (it stays valid and may
be awaited again); the helpers that post their own request (``tag_recv``,
``tag_send``, ...) cancel it when their await ends early (timeout or task
cancellation), so an abandoned receive cannot swallow a later message.  A
receive that already matched cannot be cancelled; its data still lands in
the abandoned buffer.

All of this runs in the event loop's thread.  A worker with a progress
thread (``UCXPY_PROGRESS_THREAD``) works too; its lock serializes the calls.
"""
from __future__ import annotations

import asyncio
import time
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Iterable, Optional

from .errors import ConnectionLost, TimeoutError
from .request import Request, TagInfo
from .tag import ANY_SOURCE, FULL_MASK

NAP_MIN, NAP_MAX = 20e-6, 2e-3
CHECK_PEERS_EVERY = 64            # progress passes between launcher-notice checks


class AsyncProgress:
    """Progresses one worker from one event loop (see the module docstring).
    Obtain it with :func:`driver`; do not create two for one worker."""

    def __init__(self, worker, loop: asyncio.AbstractEventLoop):
        self.worker = worker
        self.loop = loop
        self._waiters = 0            # requests and conditions being awaited
        self._futs = set()           # their futures: failed if the driver cannot go on
        self._conds = []             # [cond, future]
        self._holds = 0              # open `async with progress(worker)` blocks
        self._task: Optional[asyncio.Task] = None
        self._nap: Optional[asyncio.Future] = None

    def __repr__(self) -> str:
        state = "running" if self._task and not self._task.done() else "idle"
        return f"<AsyncProgress {self.worker!r} {state} waiters={self._waiters}>"

    # -- demand ---------------------------------------------------------------
    def _demand(self, delta: int) -> None:
        self._waiters += delta
        if delta > 0:
            self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._run(), name=f"ucxpy-progress-{self.worker.id}")
        self._wake()

    def _wake(self) -> None:
        nap = self._nap
        if nap is not None and not nap.done():
            nap.set_result(None)

    def _busy(self) -> bool:
        return (self._waiters > 0 or self._holds > 0) and not self.worker.closed

    # -- the driver task --------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._drive()
        except asyncio.CancelledError:
            self._fail_all(ConnectionLost("ucxpy progress task cancelled"))
            raise
        except Exception as e:      # e.g. an active-message handler raised
            self._fail_all(e)
            return
        if self.worker.closed:
            self._fail_all(ConnectionLost("worker closed"))

    def _fail_all(self, exc: BaseException) -> None:
        for fut in self._futs:
            if not fut.done():
                fut.set_exception(exc)

    async def _drive(self) -> None:
        w = self.worker
        busy_for = w.config.busy_poll
        last_event = time.monotonic()
        nap, passes = NAP_MIN, 0
        while self._busy():
            n = w.progress()
            passes += 1
            if passes % CHECK_PEERS_EVERY == 0:
                w.check_peers()
            if self._conds:
                self._test_conds()
            if n:
                last_event = time.monotonic()
                nap = NAP_MIN
                await asyncio.sleep(0)
            elif time.monotonic() - last_event < busy_for:
                await asyncio.sleep(0)
            else:
                w.check_peers()
                await self._sleep(nap)
                nap = min(2 * nap, NAP_MAX)

    async def _sleep(self, seconds: float) -> None:
        """Sleep until a transport descriptor is readable, a new waiter
        arrives or ``seconds`` pass."""
        fds = [fd for iface in self.worker.ifaces for fd in iface.wait_fds()]
        loop = self.loop
        nap = self._nap = loop.create_future()

        def wake():
            if not nap.done():
                nap.set_result(None)
        for fd in fds:
            loop.add_reader(fd, wake)
        timer = loop.call_later(seconds, wake)
        try:
            await nap
        finally:
            timer.cancel()
            for fd in fds:
                loop.remove_reader(fd)
            self._nap = None

    def _test_conds(self) -> None:
        keep = []
        for cond, fut in self._conds:
            if fut.done():
                continue
            try:
                ok = cond()
            except BaseException as e:  # the condition reports a failure (flush of a dead peer)
                fut.set_exception(e)
                continue
            if ok:
                fut.set_result(None)
            else:
                keep.append((cond, fut))
        self._conds = keep

    # -- awaiting ------------------------------------------------------------------
    async def wait_request(self, req: Request, timeout: Optional[float], cancel: bool):
        if not req.done:
            fut = self.loop.create_future()

            def done(_req):
                if not fut.done():
                    fut.set_result(None)
            req.add_done_callback(done)
            await self._await(fut, timeout, repr(req), req if cancel else None)
        if req.exc is not None:
            raise req.exc
        return req.result

    async def wait_until(self, cond: Callable[[], bool], timeout: Optional[float],
                         what: str) -> None:
        if cond():
            return
        fut = self.loop.create_future()
        self._conds.append((cond, fut))
        await self._await(fut, timeout, what, None)

    async def _await(self, fut, timeout, what, owned: Optional[Request]) -> None:
        if self.worker.closed:
            raise ConnectionLost("worker closed")
        t = self.worker.config.timeout if timeout is None else timeout
        self._futs.add(fut)
        self._demand(+1)
        try:
            if t and t > 0:
                try:
                    await asyncio.wait_for(fut, t)
                except asyncio.TimeoutError:
                    raise TimeoutError(f"{what} did not complete within {t:g} s") from None
            else:
                await fut
        except BaseException:
            if owned is not None and not owned.done:
                owned.cancel()
            raise
        finally:
            self._futs.discard(fut)
            self._demand(-1)


def driver(worker) -> AsyncProgress:
    """The :class:`AsyncProgress` of ``worker`` on the running event loop
    (kept in ``worker.aio_drivers``, one per loop)."""
    loop = asyncio.get_running_loop()
    drivers = worker.aio_drivers
    d = drivers.get(loop)
    if d is None:
        for old in [lp for lp in drivers if lp.is_closed()]:
            del drivers[old]
        d = drivers[loop] = AsyncProgress(worker, loop)
    return d


class progress:
    """``async with progress(worker):`` keeps ``worker`` progressed by the
    event loop for the block's duration, e.g. while a process serves active
    messages or RMA as a target and awaits nothing of its own."""

    def __init__(self, worker):
        self.worker = worker
        self._driver: Optional[AsyncProgress] = None

    async def __aenter__(self):
        self._driver = driver(self.worker)
        self._driver._holds += 1
        self._driver._start()
        return self._driver

    async def __aexit__(self, *exc):
        self._driver._holds -= 1
        self._driver._wake()


# -- awaiting requests -----------------------------------------------------------------
async def wait(req: Request, timeout: Optional[float] = None, cancel: bool = False):
    """Await ``req`` and return its result (or raise its error).  With
    ``cancel=True`` the request is cancelled if the await ends early."""
    if req.done:
        if req.exc is not None:
            raise req.exc
        return req.result
    return await driver(req.worker).wait_request(req, timeout, cancel)


async def wait_all(reqs: Iterable[Request], timeout: Optional[float] = None) -> list:
    """Await every request; returns their results in order (first error raised)."""
    return list(await asyncio.gather(*(wait(r, timeout) for r in reqs)))


async def wait_until(worker, cond: Callable[[], bool], timeout: Optional[float] = None,
                     what: str = "operation") -> None:
    """Await ``cond()`` becoming true (tested after each progress pass; an
    exception it raises is raised here)."""
    await driver(worker).wait_until(cond, timeout, what)


# -- operations ---------------------------------------------------------------------------
async def tag_send(ep, buf, tag: int, timeout: Optional[float] = None) -> None:
    await wait(ep.tag_send_nb(buf, tag), timeout, cancel=True)


async def tag_recv(worker, buf, tag: int = 0, tag_mask: int = FULL_MASK, source=ANY_SOURCE,
                   timeout: Optional[float] = None) -> TagInfo:
    """Receive into ``buf``; the posted receive is cancelled if the await
    ends early (timeout, task cancelled)."""
    return await wait(worker.tag_recv_nb(buf, tag, tag_mask, source), timeout, cancel=True)


async def am_send(ep, am_id: int, header=b"", data=b"", timeout: Optional[float] = None) -> None:
    await wait(ep.am_send_nb(am_id, header, data), timeout, cancel=True)


async def put(ep, buf, remote_addr: int, rkey, timeout: Optional[float] = None) -> None:
    await wait(ep.put_nb(buf, remote_addr, rkey), timeout)


async def get(ep, buf, remote_addr: int, rkey, timeout: Optional[float] = None) -> None:
    await wait(ep.get_nb(buf, remote_addr, rkey), timeout)


async def atomic_fetch(ep, op: str, value: int, remote_addr: int, rkey, size: int = 8,
                       compare: int = 0, timeout: Optional[float] = None) -> int:
    return await wait(ep.atomic_fetch_nb(op, value, remote_addr, rkey, size, compare), timeout)


async def flush(target, timeout: Optional[float] = None) -> None:
    """Await :meth:`ucxpy.Endpoint.flush` semantics for an endpoint, or for every
    live endpoint of a worker."""
    if hasattr(target, "flushed"):
        await wait_until(target.worker, target.flushed, timeout, f"flush of {target!r}")
        return
    eps = [ep for ep in list(target.endpoints.values()) if ep.failed is None and not ep.closed]
    await wait_until(target, lambda: all(ep.flushed() for ep in eps), timeout, "worker flush")
