"""Who may use a ChatTTSDeployment's speech API: API keys from a Secret (``spec.auth``) and
an optional NetworkPolicy (``spec.networkPolicy``).

As in api/chattts.py, every rule is both a pydantic validator and a CRD constraint (CEL or
OpenAPI), so the API server refuses a bad spec at apply time.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .common import SpecModel
from .rules import (
    LABEL_KEY_RULE,
    LABEL_VALUES_SCHEMA,
    MAX_LABEL_KEY,
    cel,
    check_label_key,
    check_label_values,
    check_match_labels,
    match_labels_schema,
)

# A Secret's name (DNS-1123 subdomain) and its data keys (what core/v1 allows).
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The runtime skips files whose name starts with '.' (the kubelet's ..data links), so such
# a key would be mounted and never read: refused.
SECRET_KEY_PATTERN = r"^[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
MONITORING_NAMESPACE = "monitoring"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


class AuthSpec(SpecModel):
    """API keys: the runtime answers /v1/* only with 'Authorization: Bearer <key>' (else 401);
    /health, /ready and /metrics stay open for the kubelet and Prometheus."""

    secret_name: str = Field(
        min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN,
        description="Secret in the same namespace holding the API keys, mounted read-only into the serving "
        "pods (the operator never reads its data). Each entry holds one key per line; a rotated Secret "
        "takes effect without a restart.",
    )
    keys: list[str] | None = Field(
        None, min_length=1, max_length=64,
        json_schema_extra={
            "items": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": SECRET_KEY_PATTERN},
            "x-kubernetes-list-type": "set",
        },
        description="Which entries of the Secret hold keys; unset: every entry. Each named entry must exist "
        "in the Secret, or the pods cannot start.",
    )

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        for key in value:
            if len(key) > 253 or not re.fullmatch(SECRET_KEY_PATTERN, key):
                raise ValueError(f"auth.keys item {key!r} must be a Secret key not starting with '.'")
        if len(set(value)) != len(value):
            raise ValueError("auth.keys may not repeat an entry")
        return value


_NEEDS_VALUES = "a selector requirement with operator In or NotIn needs values"
_TAKES_NO_VALUES = "a selector requirement with operator Exists or DoesNotExist takes no values"
_NEEDS_A_SELECTOR = "a networkPolicy peer needs namespaceSelector, podSelector or both"


class SelectorRequirement(SpecModel):
    """A label selector requirement (as in metav1.LabelSelectorRequirement)."""

    key: str = Field(min_length=1, max_length=MAX_LABEL_KEY, json_schema_extra=cel(LABEL_KEY_RULE),
                     description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the key relates to values.")
    values: list[str] | None = Field(None, max_length=64, json_schema_extra=LABEL_VALUES_SCHEMA,
                                     description="With In and NotIn: the values (non-empty).")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
         "message": _NEEDS_VALUES},
        {"rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
         "message": _TAKES_NO_VALUES},
    ]})

    @model_validator(mode="after")
    def _values(self) -> "SelectorRequirement":
        check_label_key(self.key)
        check_label_values(self.values)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(_NEEDS_VALUES)
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(_TAKES_NO_VALUES)
        return self


class LabelSelector(SpecModel):
    """A label selector (as in metav1.LabelSelector); empty selects everything."""

    match_labels: dict[str, str] | None = Field(None, json_schema_extra=match_labels_schema(),
                                                 description="Labels that must all match.")
    match_expressions: list[SelectorRequirement] | None = Field(
        None, max_length=32, description="Requirements that must all hold.")

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_match_labels(value)


class PeerSpec(SpecModel):
    """Clients allowed in: pods chosen by podSelector in namespaces chosen by namespaceSelector.
    Both set: pods matching podSelector in the matching namespaces (one NetworkPolicy peer);
    podSelector alone: pods in this namespace; namespaceSelector alone: every pod there."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.namespaceSelector) || has(self.podSelector)",
         "message": _NEEDS_A_SELECTOR},
    ]})

    namespace_selector: LabelSelector | None = Field(None, description="Namespaces the clients run in.")
    pod_selector: LabelSelector | None = Field(None, description="The client pods' labels.")

    @model_validator(mode="after")
    def _one_selector(self) -> "PeerSpec":
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError(_NEEDS_A_SELECTOR)
        return self


def _monitoring_peers() -> list[PeerSpec]:
    return [PeerSpec(namespace_selector=LabelSelector(match_labels={NAMESPACE_NAME_LABEL: MONITORING_NAMESPACE}))]


class NetworkPolicySpec(SpecModel):
    """A NetworkPolicy on the serving pods (it takes effect only where the cluster's network
    plugin enforces NetworkPolicy). Ingress is then allowed only from the peers below, to
    the runtime's HTTP port; everything else is dropped."""

    enabled: bool = Field(True, description="Render the NetworkPolicy; false (or no networkPolicy) deletes it.")
    allow_from: list[PeerSpec] = Field(
        default_factory=list, max_length=32,
        description="Clients of the speech API. Empty (the default): every pod in this namespace only.",
    )
    metrics_from: list[PeerSpec] = Field(
        default_factory=_monitoring_peers, max_length=32,
        json_schema_extra={"default": [
            {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: MONITORING_NAMESPACE}}}]},
        description="Scrapers of /metrics (default: every pod of the namespace named 'monitoring'). The "
        "runtime serves /metrics on its HTTP port, so these peers reach that port too; with auth set they "
        "get only /health, /ready and /metrics without a key.",
    )


__all__ = ["AuthSpec", "LabelSelector", "NetworkPolicySpec", "PeerSpec", "SelectorRequirement",
           "MONITORING_NAMESPACE", "NAMESPACE_NAME_LABEL"]
