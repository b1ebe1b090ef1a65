"""The kubelet's and Prometheus's routes (open even when API keys are on) and the model list."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chattts_runtime.routes.common import holder_of

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    service = holder_of(request).service  # upstream_data: what start-up found (None while loading)
    return {"status": "ok", "upstream_data": None if service is None else service.upstream_data}


@router.get("/ready")
async def ready(request: Request):
    holder = holder_of(request)
    service = holder.service
    if holder.failed:
        return JSONResponse({"status": "failed", "reason": holder.failed}, status_code=503)
    if service is None or not service.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    if service.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return {"status": "ready", **service.engine.describe()}


@router.get("/metrics")
async def metrics(request: Request):
    return Response(generate_latest(holder_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request):
    holder = holder_of(request)
    return {"object": "list", "data": [{"id": holder.config.model.served_name, "object": "model",
                                         "created": holder.started, "owned_by": "chattts-runtime"}]}
