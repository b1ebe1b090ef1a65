"""kopf handlers. Importing this package registers all of them with kopf's default registry.

Each feature keeps its handlers in its own module here (autoscaling and GPU rebalancing
add theirs); this file imports every module that exists.
"""
from __future__ import annotations

import importlib
import pkgutil

from . import chattts  # noqa: F401  (the core: must register first: it owns startup/cleanup)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "chattts":
        importlib.import_module(f"{__name__}.{_module.name}")
