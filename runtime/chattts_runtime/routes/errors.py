"""Every error answered in OpenAI's shape (``{"error": {...}}``) with the status we choose."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from chattts_runtime.routes.common import holder_of
from chattts_runtime.errors import APIError

log = logging.getLogger("chattts_runtime.server")


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def api_error(request: Request, err: APIError) -> JSONResponse:
    holder_of(request).count_error(request.url.path, err)
    return error_response(err)


async def unexpected(request: Request, err: Exception) -> JSONResponse:
    log.exception("unexpected error answering %s", request.url.path)
    return await api_error(request, APIError(500, f"internal error ({type(err).__name__})", err_type="server_error"))


async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    return await api_error(request, APIError(err.status_code, str(err.detail),
                                             code="not_found" if err.status_code == 404 else None))


async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    return await api_error(request, APIError(400, str(err.errors()[0].get("msg", "invalid request"))))


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(Exception, unexpected)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
