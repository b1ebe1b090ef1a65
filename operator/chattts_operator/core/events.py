"""core/v1 Events: the one builder every feature posts through (``Kube.post_event``)."""
from __future__ import annotations

from typing import Any, Mapping

from chattts_operator.core.clock import rfc3339
from chattts_operator.core.labels import FIELD_MANAGER

MAX_REASON = 128
MAX_MESSAGE = 1024


def event_manifest(involved: Mapping[str, Any], event_type: str, reason: str, message: str, *,
                   component: str = FIELD_MANAGER, now: str | None = None,
                   namespace: str = "default") -> dict[str, Any]:
    """An Event about ``involved`` (a whole object: apiVersion, kind, metadata). A cluster-scoped
    object's Events go to ``namespace`` (the operator's own, as kopf does)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or namespace
    stamp = now or rfc3339()
    prefix = f"{meta['name']}." if component == FIELD_MANAGER else f"{meta['name']}-{component.removeprefix('chattts-')}-"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": prefix, "namespace": namespace},
        "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                           "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "reason": reason[:MAX_REASON],
        "message": (message or "")[:MAX_MESSAGE],
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
