"""What every route shares: the holder, readiness, and work moved off the event loop when costly."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import Request

from chattts_runtime.errors import APIError

if TYPE_CHECKING:
    from chattts_runtime.server import ServiceHolder


def holder_of(request: Request) -> "ServiceHolder":
    return request.app.state.holder


def ready_service(request: Request):
    """The loaded speech service, else a 503 that says when to retry."""
    service = holder_of(request).service
    if service is None or not service.ready:
        raise APIError(503, "model is loading; retry when /ready answers 200", err_type="server_error",
                       code="not_ready", headers={"Retry-After": "5"})
    return service


async def off_loop_if(condition: bool, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread when ``condition`` (costly work), else right here on the loop."""
    if condition:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)
