"""The one HTTP client of the serving pods' own endpoints: the autoscaler's /metrics scrapes and
the deployment controller's /health question share its aiohttp session (opened on first use;
aiohttp comes with the async Kubernetes client) and its idea of a pod's address.

A pod's address is its IP. For tests and development only, with ``allow_annotation``
(CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION=1) the pod annotation ``tts.chattts.io/metrics-url``
names it instead: its scheme and host:port replace the pod's, the endpoint's path is kept (the
cluster tests map kwok pods, which serve nothing, to processes on loopback this way). Off by
default: anyone who may annotate pods could otherwise point the operator at any URL.
"""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from chattts_operator.core.labels import METRICS_URL_ANNOTATION


class PodHttpError(RuntimeError):
    """A pod's endpoint could not be read; the message says which and why."""


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_url(pod: dict[str, Any], path: str, *, scheme: str, port: int, allow_annotation: bool) -> str | None:
    """The URL of ``path`` on ``pod``; None while it has no IP (and no honoured annotation)."""
    override = (pod.get("metadata", {}).get("annotations") or {}).get(METRICS_URL_ANNOTATION)
    if allow_annotation and override:
        parts = urlsplit(override)
        return f"{parts.scheme}://{parts.netloc}{path}"
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"{scheme}://{host}:{port}{path}"


class PodHttp:
    def __init__(self, allow_annotation: bool) -> None:
        self.allow_annotation = allow_annotation
        self._session = None

    def url(self, pod: dict[str, Any], path: str, *, scheme: str = "http", port: int) -> str | None:
        return pod_url(pod, path, scheme=scheme, port=port, allow_annotation=self.allow_annotation)

    async def session(self):
        if self._session is None or self._session.closed:
            import aiohttp  # noqa: PLC0415 - only the I/O path needs it

            self._session = aiohttp.ClientSession()
        return self._session

    async def get_json(self, url: str, timeout: float) -> Any:
        """GET ``url`` and decode its JSON; PodHttpError on any failure (never blocks the loop)."""
        import aiohttp  # noqa: PLC0415

        session = await self.session()
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                if response.status != 200:
                    raise PodHttpError(f"{url}: HTTP {response.status}")
                return await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
            raise PodHttpError(f"{url}: {type(err).__name__} {err}".strip()) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
