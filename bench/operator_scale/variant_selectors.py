"""The operator with server-side label selectors on its Deployment watch: an experiment
variant for the benchmark (``OperatorProcess(module=...)``), so the design change can be
measured before it is made in chattts_operator itself.

kopf's ``labels=`` filter on a handler is applied on the client: the watch still lists and
streams every Deployment of the cluster. ``settings.watching.label_selectors`` (kopf 1.45)
puts the selector into the list and watch requests instead.
"""
from __future__ import annotations

import sys
from typing import Any

import kopf

from chattts_operator.core.labels import LABEL_MANAGED_BY, MANAGED_BY


@kopf.on.startup()
async def server_side_selectors(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.watching.label_selectors["apps", "deployments"] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


if __name__ == "__main__":
    from chattts_operator.cli import main

    raise SystemExit(main(sys.argv[1:]))
