"""The connection layer's pure parts (``chattts_runtime.connections``): the default cap, the refusal's
bytes, the throttled log line. The limits themselves are proven on sockets in tests/runtime/test_connections.py."""
from __future__ import annotations

import json
import logging
import resource

import pytest

pytest.importorskip("uvicorn")

from chattts_runtime.config import ServerSettings  # noqa: E402
from chattts_runtime.connections import (  # noqa: E402
    CAP_LOG_SECONDS, FD_HEADROOM, ConnectionGuard, default_max_connections, error_bytes)
from chattts_runtime.errors import APIError  # noqa: E402


def test_default_cap_is_the_fd_soft_limit_minus_the_headroom():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert default_max_connections() == max(16, soft - FD_HEADROOM)
    assert ConnectionGuard(ServerSettings()).max_connections == default_max_connections()
    assert ConnectionGuard(ServerSettings(max_connections=7)).max_connections == 7


def test_refusal_is_a_whole_response_in_openai_shape():
    raw = error_bytes(APIError(431, "too large", code="header_too_large", headers={"Retry-After": "1"}))
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert b"connection: close" in lines and b"Retry-After: 1" in lines
    assert f"content-length: {len(body)}".encode() in lines
    assert json.loads(body) == {"error": {"message": "too large", "type": "invalid_request_error",
                                          "param": None, "code": "header_too_large"}}


def test_refused_connections_are_counted_each_and_logged_at_most_every_few_seconds(caplog):
    now = [100.0]
    counted: list[str] = []
    guard = ConnectionGuard(ServerSettings(max_connections=2), count=counted.append, clock=lambda: now[0])
    guard.open = 2
    with caplog.at_level(logging.WARNING, logger="chattts_runtime.connections"):
        for _ in range(5):
            guard.refuse_connection()
        now[0] += CAP_LOG_SECONDS
        guard.refuse_connection()
    assert counted == ["connection_limit"] * 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("refused 1 connection(s): 2 open connections reach server.max_connections 2")
    assert lines[1].startswith("refused 5 connection(s)")  # the four unlogged since, and this one
