"""The HTTP API's routes, one module per concern, each an ``APIRouter`` whose handlers find the
process's ``ServiceHolder`` on ``request.app.state.holder``:

- ``errors``: every error in OpenAI's shape (``APIError``, HTTP errors, validation, the unexpected);
- ``probes``: ``GET /health``, ``/ready``, ``/metrics``, ``/v1/models``;
- ``voices``: ``POST /v1/audio/voices`` (a speaker from a voice sample);
- ``speech``: ``POST /v1/audio/speech`` (streamed or whole, raw audio or SSE).

``build_app`` assembles them with the API-key middleware; ``server.py`` owns start-up and shutdown.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from chattts_runtime.auth import APIKeys, BearerAuth
from chattts_runtime.routes import errors, probes, speech, voices

if TYPE_CHECKING:
    from chattts_runtime.server import ServiceHolder


def build_app(holder: "ServiceHolder") -> FastAPI:
    app = FastAPI(title="chattts-runtime", lifespan=holder.lifespan)
    app.state.holder = holder
    limits = holder.config.server
    if limits.api_keys_path:
        keys = APIKeys(limits.api_keys_path, limits.api_keys_reload_seconds)
        app.add_middleware(BearerAuth, keys=keys, on_refused=holder.count_refused)
    errors.install(app)
    for module in (probes, voices, speech):
        app.include_router(module.router)
    return app
