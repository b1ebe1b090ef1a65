"""The operator with at most BENCH_MAX_IN_FLIGHT (default 32) API requests in flight: an
experiment variant (``python -m bench.operator_scale --operator-module ...``) that measures
the design change of findings F1 before it is made in chattts_operator/kube.py.

As is, kopf runs one handler per object at once and each sends its requests, so a burst of N
new objects puts up to N requests in flight (kubernetes_asyncio's pool allows 100); Service
creations then time out (504) and every failed handler retries 5 s later, all together.
"""
from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from chattts_operator.core import kube

MAX_IN_FLIGHT = int(os.environ.get("BENCH_MAX_IN_FLIGHT", "32"))
_unbounded_call = kube.Kube._call


async def _bounded_call(self: kube.Kube, *args: Any, **kwargs: Any) -> Any:
    semaphore = self.__dict__.get("_in_flight")
    if semaphore is None:
        semaphore = self.__dict__["_in_flight"] = asyncio.Semaphore(MAX_IN_FLIGHT)
    async with semaphore:
        return await _unbounded_call(self, *args, **kwargs)


kube.Kube._call = _bounded_call  # type: ignore[method-assign]

if __name__ == "__main__":
    from chattts_operator.cli import main

    raise SystemExit(main(sys.argv[1:]))
