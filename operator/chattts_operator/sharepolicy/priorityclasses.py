"""The two PriorityClasses of a shared GPU pool: online pods may preempt offline pods
(when they need GPUs before a window change frees them); offline pods never preempt."""
from __future__ import annotations

from typing import Any

from chattts_operator.api.sharepolicy import (
    OFFLINE_PRIORITY_CLASS,
    OFFLINE_PRIORITY_VALUE,
    ONLINE_PRIORITY_CLASS,
    ONLINE_PRIORITY_VALUE,
)
from chattts_operator.core.labels import LABEL_MANAGED_BY, LABEL_PART_OF, MANAGED_BY

_LABELS = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_PART_OF: "chattts"}


def priority_class_manifests() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": ONLINE_PRIORITY_CLASS, "labels": dict(_LABELS)},
            "value": ONLINE_PRIORITY_VALUE,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "ChatTTS online serving: may preempt offline GPU work (chattts-offline).",
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": OFFLINE_PRIORITY_CLASS, "labels": dict(_LABELS)},
            "value": OFFLINE_PRIORITY_VALUE,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": "Offline GPU work (AWQ quantization, batch synthesis): never preempts; online pods may preempt it.",
        },
    ]
