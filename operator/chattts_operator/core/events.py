"""core/v1 Events: the one builder every feature posts through (``Kube.post_event``)."""
from __future__ import annotations

from typing import Any, Mapping

from chattts_operator.core.clock import rfc3339
from chattts_operator.core.labels import FIELD_MANAGER

MAX_REASON = 128
MAX_MESSAGE = 1024
# Where core/v1 accepts Events about cluster-scoped objects (besides no namespace at all).
CLUSTER_SCOPED_EVENT_NAMESPACE = "default"


def event_manifest(involved: Mapping[str, Any], event_type: str, reason: str, message: str, *,
                   component: str = FIELD_MANAGER, now: str | None = None) -> dict[str, Any]:
    """An Event about ``involved`` (a whole object: apiVersion, kind, metadata). A cluster-scoped
    object's Events go to ``default``, as kubectl's do: the API server refuses (422) a core/v1
    Event whose namespace is neither the involved object's nor, for a cluster-scoped one,
    ``default`` (the operator's own namespace included)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or CLUSTER_SCOPED_EVENT_NAMESPACE
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
