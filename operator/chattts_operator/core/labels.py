"""Names the operator writes on objects: labels, annotations, field managers (fixed: changing
one later orphans what existing objects carry)."""
from __future__ import annotations

# Field managers of server-side apply and of every patch: `kubectl get --show-managed-fields`
# tells which part of the operator set a field.
FIELD_MANAGER = "chattts-operator"
AUTOSCALER_FIELD_MANAGER = "chattts-autoscaler"  # spec.replicas through the scale subresource

# kopf's own state (progress, diff base) and our hashes live under this prefix.
ANNOTATION_PREFIX = "chattts.io"
PERSISTENCE_PREFIX = ANNOTATION_PREFIX
INTENT_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/intent-hash"
CONFIG_HASH_ANNOTATION = f"{ANNOTATION_PREFIX}/config-hash"
# Tests and development only (off unless settings.autoscaler.metrics_url_annotation): a pod's
# metrics address for the autoscaler.
METRICS_URL_ANNOTATION = "tts.chattts.io/metrics-url"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "chattts-operator"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


def selector_labels(name: str) -> dict[str, str]:
    """The labels that select a ChatTTSDeployment's serving pods."""
    return {LABEL_NAME: "chattts", LABEL_INSTANCE: name, LABEL_COMPONENT: "tts-server"}


def child_labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY, LABEL_PART_OF: "chattts"}


def label_selector(labels: dict[str, str]) -> str:
    """Labels as the API's ``labelSelector`` query (equality terms, sorted)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_string(name: str) -> str:
    """The serving pods' selector of ChatTTSDeployment ``name`` (status.selector, pod lists)."""
    return label_selector(selector_labels(name))
