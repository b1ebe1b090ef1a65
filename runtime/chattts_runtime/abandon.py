"""Stopping work nobody will receive: a client that left, a shutdown grace that ran out.

A whole (non-streamed) response is produced by one awaitable; :func:`unless` runs it
and cancels it as soon as one of the stop conditions happens, so its engine slot is
freed at once instead of generating to the end.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """The work was cancelled because the named stop condition happened first."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


async def client_disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the ASGI server reports the client gone (call after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless(work: Awaitable[T], stops: dict[str, Awaitable]) -> T:
    """``work``'s result, unless one of ``stops`` completes first: then ``work`` is cancelled
    (and has finished cleaning up) and :class:`Stopped` names the condition."""
    work_task = asyncio.ensure_future(work)
    stop_tasks = {asyncio.ensure_future(stop): name for name, stop in stops.items()}
    try:
        done, _ = await asyncio.wait([work_task, *stop_tasks], return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return work_task.result()
        work_task.cancel()
        await asyncio.wait([work_task])
        raise Stopped(next(stop_tasks[t] for t in done if t in stop_tasks))
    finally:
        for task in (work_task, *stop_tasks):
            task.cancel()
