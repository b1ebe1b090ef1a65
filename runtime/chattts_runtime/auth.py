"""API keys for the speech API: ``Authorization: Bearer <key>`` against keys in mounted files.

``server.api_keys_path`` names a file or a directory. A file holds one key per line
(blank lines and ``#`` comments skipped); a directory is read as a Kubernetes Secret
volume: every regular file whose name does not start with ``.`` (the kubelet's
``..data`` links are skipped, the key files themselves are links into it) is such a
file. So a Secret with one or more entries (``key``, ``team-a``, ...) mounted at
``/etc/chattts/api-keys`` works unchanged.

The kubelet swaps a Secret volume's contents atomically when the Secret changes;
the keys are re-read when any file's size or modification time changes, checked at most
every ``server.api_keys_reload_seconds``, so a rotation takes effect without a restart.
A path that is configured but unreadable or empty lets no request through (fail closed).

Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, against every
configured key without stopping at the first match, so the time taken says nothing
about a key's length or how much of it matched. No key is ever logged.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})  # the kubelet and Prometheus send no key
PROTECTED_PREFIX = "/v1/"
MAX_KEY_FILE_BYTES = 64 * 1024


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def parse_keys(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


class APIKeys:
    """The accepted keys, re-read from ``path`` when its files change."""

    def __init__(self, path: str | Path, reload_seconds: float = 2.0, clock=time.monotonic):
        self.path = Path(path)
        self.reload_seconds = reload_seconds
        self._clock = clock
        self._digests: list[bytes] = []
        self._signature: tuple | None = None
        self._checked = float("-inf")
        self.refresh()

    def _files(self) -> list[Path]:
        if self.path.is_dir():
            return sorted(p for p in self.path.iterdir() if not p.name.startswith(".") and p.is_file())
        return [self.path] if self.path.is_file() else []

    def _current_signature(self, files: list[Path]) -> tuple:
        out = []
        for file in files:
            st = file.stat()  # follows the Secret volume's links to the current data
            out.append((file.name, st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(out)

    def refresh(self) -> None:
        """Re-read the keys if the files changed (a few stat calls otherwise)."""
        self._checked = self._clock()
        try:
            files = self._files()
            signature = self._current_signature(files)
            if signature == self._signature:
                return
            keys: list[str] = []
            for file in files:
                with file.open("rb") as fh:
                    keys.extend(parse_keys(fh.read(MAX_KEY_FILE_BYTES).decode("utf-8", "replace")))
        except OSError as err:
            log.error("API keys at %s cannot be read (%s): every /v1 request is refused", self.path,
                      type(err).__name__)
            self._digests, self._signature = [], None
            return
        self._digests = [_digest(k) for k in keys]
        self._signature = signature
        if keys:
            log.info("API keys loaded from %s: %d key(s) in %d file(s)", self.path, len(keys), len(files))
        else:
            log.error("no API keys found at %s: every /v1 request is refused", self.path)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, presented: str | None) -> bool:
        if self._clock() - self._checked >= self.reload_seconds:
            self.refresh()
        if presented is None:
            return False
        candidate = _digest(presented)
        matched = False
        for digest in self._digests:  # no early exit: every key is compared
            matched |= hmac.compare_digest(candidate, digest)
        return matched


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# The API's description: what a caller without a key has no business reading when keys are on.
DOC_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def needs_key(path: str) -> bool:
    return (path.startswith(PROTECTED_PREFIX) or path in DOC_PATHS) and path not in OPEN_PATHS


class BearerAuth:
    """ASGI middleware: requests under ``/v1/`` and the API docs need a valid key; others pass untouched."""

    def __init__(self, app, keys: APIKeys, on_refused=None):
        self.app, self.keys, self.on_refused = app, keys, on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not needs_key(scope["path"]):
            return await self.app(scope, receive, send)
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []))
        raw = headers.get(b"authorization")
        token = bearer_token(raw.decode("latin-1")) if raw is not None else None
        if self.keys.accepts(token):
            return await self.app(scope, receive, send)
        from fastapi.responses import JSONResponse  # noqa: PLC0415

        from chattts_runtime.errors import APIError  # noqa: PLC0415

        if token is None:
            err = APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")
        else:  # never echo the key, not even a prefix
            err = APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        if self.on_refused is not None:
            self.on_refused(scope["path"])
        response = JSONResponse(err.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

