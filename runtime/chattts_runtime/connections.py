"""The connection layer in front of the speech app: what one socket may hold, and for how long.

uvicorn's httptools protocol (the fast parser the runtime installs) enforces none of this: header
size and count are unbounded (an unfinished header of megabytes is re-concatenated at every read,
stalling the event loop for everyone), a connection that sends nothing or half a header is kept
forever, a stream whose reader stopped is held without end, connections are accepted until the
file descriptors run out (then every accept, probes included, fails unlogged), and framing errors
get a text/plain 400. :func:`guarded_protocol` subclasses that protocol, so the limits hold before
any byte reaches the app (or the API-key check):

* request line + header fields over ``max_header_bytes`` or more than ``max_header_count`` fields:
  431, counted as the bytes arrive (an unfinished header is cut at the limit, not parsed further);
* the head not complete ``header_timeout_seconds`` after its first byte: 408; a new connection
  with no byte in ``idle_timeout_seconds``, or a kept-alive one in ``keep_alive_timeout_seconds``:
  closed;
* a response that cannot be written for ``send_timeout_seconds`` (the client reads nothing): the
  connection is aborted, the app sees a disconnect and the stream's engine work stops;
* more than ``max_connections`` open: answered 503 at once (Retry-After) and closed, logged;
* RFC 9112 framing: versions other than HTTP/1.0 and 1.1 get 505, an HTTP/1.1 request without a
  Host or with two gets 400, as does a request with two Authorization headers (a proxy that checks
  the first and a server that reads the last would disagree about who is calling);
* every one of these, and the parser's own framing errors, in OpenAI's error shape and counted in
  ``chattts_http_refused_total{reason}``.
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import socket
import sys
import time
from typing import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from chattts_runtime.config import ServerSettings
from chattts_runtime.errors import APIError

log = logging.getLogger(__name__)

FD_HEADROOM = 128  # descriptors kept free below the soft limit: model files, engine pipes, logs
REFUSED_LINGER_SECONDS = 1.0  # a refused connection reads (and drops) the request this long before closing
CAP_LOG_SECONDS = 10.0  # at most one log line per this many seconds while connections are refused


def default_max_connections(headroom: int = FD_HEADROOM) -> int:
    """The file-descriptor soft limit minus ``headroom`` (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft - headroom)


class PortInUse(OSError):
    """The configured address is taken (the runner exits with ``EXIT_PORT_IN_USE``)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now (before the model loads): a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise PortInUse(err.errno, f"{host}:{port} is already in use") from None
        raise
    return sock


def error_bytes(err: APIError, *, close: bool = True) -> bytes:
    """``err`` as a whole HTTP/1.1 response in OpenAI's error shape."""
    body = json.dumps(err.body()).encode()
    phrase = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
              503: "Service Unavailable", 505: "HTTP Version Not Supported"}.get(err.status, "Error")
    lines = [f"HTTP/1.1 {err.status} {phrase}", "content-type: application/json",
             f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in err.headers.items()]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Refusal(Exception):
    """Raised from a parser callback: answer ``error`` and close."""

    def __init__(self, reason: str, error: APIError):
        super().__init__(reason)
        self.reason, self.error = reason, error


class ConnectionGuard:
    """What every connection shares: the settings, the open count, the refusal counter, a throttled log."""

    def __init__(self, settings: ServerSettings, count: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.max_connections = settings.max_connections or default_max_connections()
        self.count = count
        self.open = 0
        self._clock = clock
        self._refused_unlogged = 0
        self._logged_at = float("-inf")

    def refuse_connection(self) -> None:
        self.count("connection_limit")
        self._refused_unlogged += 1
        now = self._clock()
        if now - self._logged_at >= CAP_LOG_SECONDS:
            log.warning("refused %d connection(s): %d open connections reach server.max_connections %d "
                        "(answered 503)", self._refused_unlogged, self.open, self.max_connections)
            self._refused_unlogged = 0
            self._logged_at = now


def guarded_protocol(guard: ConnectionGuard) -> type:
    """uvicorn's httptools protocol with ``guard``'s limits (pass it as ``uvicorn.Config(http=...)``)."""
    s = guard.settings

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:  # noqa: ANN001
            self._refused = guard.open >= guard.max_connections
            if self._refused:  # nothing of ours is set up: answer, drop what comes, close
                self.transport = transport
                guard.refuse_connection()
                transport.write(error_bytes(APIError(
                    503, f"server is at its connection limit ({guard.max_connections}); retry",
                    err_type="server_error", code="too_many_connections", headers={"Retry-After": "1"})))
                self._linger = asyncio.get_running_loop().call_later(REFUSED_LINGER_SECONDS, transport.abort)
                return
            guard.open += 1
            super().connection_made(transport)
            self._in_head = False  # bytes of a request line / headers have arrived, the head is not complete
            self._in_body = False
            self._head_bytes = 0  # bytes received while the head was incomplete
            self._head_size = 0  # exact size of the parsed head so far
            self._hosts = self._authorizations = 0
            self._timer = self.loop.call_later(s.idle_timeout_seconds, self._idle_expired)
            self._send_timer = None

        def connection_lost(self, exc) -> None:  # noqa: ANN001
            if self._refused:
                self._linger.cancel()
                return
            guard.open -= 1
            self._cancel(self._timer)
            self._cancel(self._send_timer)
            self._gone()  # uvicorn marks only the last parsed cycle, not a pipelined one still writing
            super().connection_lost(exc)

        @staticmethod
        def _cancel(timer) -> None:  # noqa: ANN001
            if timer is not None:
                timer.cancel()

        # -- reading -------------------------------------------------------------------------------

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if not self._in_body:
                if not self._in_head:  # the first byte of a request: its head has header_timeout_seconds
                    self._in_head = True
                    self._cancel(self._timer)
                    self._timer = self.loop.call_later(s.header_timeout_seconds, self._head_expired)
                self._head_bytes += len(data)
            super().data_received(data)
            if self.parser is not None and self._in_head and self._head_bytes > s.max_header_bytes \
                    and not self.transport.is_closing():
                self._refuse(self._too_large(f"more than {s.max_header_bytes} bytes"))

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to the parser's errors (called where it catches them): a refusal raised by a
            callback below comes as httptools' error whose context it is; any other is a framing error."""
            raised = sys.exc_info()[1]
            refusal = raised.__context__ if raised is not None else None
            if not isinstance(refusal, Refusal):
                detail = str(raised) if raised is not None else msg
                refusal = Refusal("bad_request", APIError(400, f"malformed HTTP request: {detail}",
                                                          code="bad_request"))
            self._refuse(refusal)

        def _refuse(self, refusal: Refusal) -> None:
            if self.transport.is_closing():
                return
            guard.count(refusal.reason)
            self.transport.write(error_bytes(refusal.error))
            self.transport.close()

        @staticmethod
        def _too_large(what: str) -> Refusal:
            return Refusal("header_too_large", APIError(
                431, f"request header fields too large: {what} (server.max_header_bytes / max_header_count)",
                code="header_too_large"))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_size = 0
            self._hosts = self._authorizations = 0
            self._in_head = True

        def on_url(self, url: bytes) -> None:
            self._grow(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._grow(len(name) + len(value) + 4)
            if len(self.headers) >= s.max_header_count:
                self._stop(self._too_large(f"more than {s.max_header_count} fields"))
            lowered = name.lower()
            if lowered == b"host":
                self._hosts += 1
            elif lowered == b"authorization":
                self._authorizations += 1
            super().on_header(name, value)

        def _grow(self, n: int) -> None:
            self._head_size += n
            if self._head_size > s.max_header_bytes:
                self._stop(self._too_large(f"more than {s.max_header_bytes} bytes"))

        @staticmethod
        def _stop(refusal: Refusal) -> None:
            """Stop the parser: httptools raises its own error from ours, uvicorn answers it with
            ``send_400_response`` (above), which finds ours."""
            raise refusal

        def on_headers_complete(self) -> None:
            version = self.parser.get_http_version()
            if version not in ("1.0", "1.1"):
                self._stop(Refusal("http_version", APIError(
                    505, f"HTTP/{version} is not supported here: speak HTTP/1.1", code="http_version_not_supported")))
            if self._hosts > 1 or (self._hosts == 0 and version == "1.1"):
                self._stop(Refusal("host", APIError(
                    400, "an HTTP/1.1 request needs exactly one Host header (RFC 9112, section 3.2); got "
                    f"{self._hosts}", code="bad_host")))
            if self._authorizations > 1:
                self._stop(Refusal("authorization", APIError(
                    400, "more than one Authorization header", code="duplicate_authorization")))
            self._in_head, self._in_body, self._head_bytes = False, True, 0
            self._cancel(self._timer)
            self._timer = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_body = False
            super().on_message_complete()

        # -- timers --------------------------------------------------------------------------------

        def _idle_expired(self) -> None:
            if not self._in_head and not self.transport.is_closing():
                guard.count("idle_timeout")
                self.transport.close()

        def _head_expired(self) -> None:
            if self._in_head:
                self._refuse(Refusal("header_timeout", APIError(
                    408, f"request headers not received within {s.header_timeout_seconds:g} s "
                    "(server.header_timeout_seconds)", code="header_timeout")))

        def timeout_keep_alive_handler(self) -> None:  # a normal end: not counted
            if not self._in_head:
                super().timeout_keep_alive_handler()

        # -- writing: a reader that stalls -----------------------------------------------------------

        def pause_writing(self) -> None:
            if self._refused:
                return
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(s.send_timeout_seconds, self._send_expired)

        def resume_writing(self) -> None:
            if self._refused:
                return
            super().resume_writing()
            self._cancel(self._send_timer)
            self._send_timer = None

        def _send_expired(self) -> None:
            self._send_timer = None
            guard.count("send_timeout")
            log.warning("aborted a response to %s: its client read nothing for %g s (server.send_timeout_seconds)",
                        "%s:%d" % self.client if self.client else "a client", s.send_timeout_seconds)
            # Gone for the app at once (the transport may resume writing while it closes, and a send
            # then would write to a closed handle): its stream stops at the next chunk.
            self._gone()
            self.transport.abort()

        def _start_asgi_task(self, cycle, app) -> None:  # noqa: ANN001
            self._active = cycle  # the cycle writing now (self.cycle is the last one parsed: pipelining)
            super()._start_asgi_task(cycle, app)

        def _gone(self) -> None:
            active = getattr(self, "_active", None)
            if active is not None and not active.response_complete:
                active.disconnected = True
                active.message_event.set()

    return GuardedHttpToolsProtocol
