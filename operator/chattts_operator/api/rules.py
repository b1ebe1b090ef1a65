"""Validation rules written once: the CEL the CRD carries (the API server refuses a bad spec at
apply time) and the same check on the parsed model (the operator, unit tests), with one message.

A model lists its rules once, ``json_schema_extra=cel(RULE, ...)`` for the CRD and
``enforce(self, RULE, ...)`` in a validator; tests/unit/test_cel_drift.py and
tests/cluster/test_cel_drift_api_server.py feed every CEL rule of both CRDs a good and a bad value through
the models and the real API server and assert they agree.

Label keys and values follow Kubernetes' own rules (apimachinery's IsQualifiedName and
IsValidLabelValue): an optional DNS-subdomain prefix (at most 253) and '/', then a name of at
most 63 characters: alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
MAX_LABEL_KEY = 253 + 1 + 63
MAX_LABEL_VALUE = 63
MAX_LABEL_PREFIX = 253
MAX_SELECTOR_LABELS = 64

LABEL_KEY_MESSAGE = ("a label key must be an optional DNS subdomain prefix (at most 253 characters) and '/', then a "
                     "name of at most 63 characters (alphanumerics, '-', '_', '.'; alphanumeric at both ends)")
LABEL_VALUE_MESSAGE = ("a label value must be empty or at most 63 characters (alphanumerics, '-', '_', '.'; "
                       "alphanumeric at both ends)")


def label_key_cel(var: str) -> str:
    """CEL: ``var`` (a string) is a valid label key."""
    return (f"{var}.size() <= {MAX_LABEL_KEY} && {var}.matches(r'{LABEL_KEY_PATTERN}')"
            f" && {var}.indexOf('/') <= {MAX_LABEL_PREFIX}")


def label_key_ok(key: str) -> bool:
    return (len(key) <= MAX_LABEL_KEY and re.fullmatch(LABEL_KEY_PATTERN, key) is not None
            and key.find("/") <= MAX_LABEL_PREFIX)


def label_value_ok(value: str) -> bool:
    return len(value) <= MAX_LABEL_VALUE and re.fullmatch(LABEL_VALUE_PATTERN, value) is not None


@dataclass(frozen=True)
class Rule:
    """One rule: the CEL (``self`` is the field or object it sits on) and the same check on the
    Python value (``check(value)`` True when it holds)."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    message_expression: str | None = None

    def schema(self) -> dict[str, Any]:
        out = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        return out


def cel(*rules: Rule, **schema: Any) -> dict[str, Any]:
    """``json_schema_extra`` carrying ``rules`` (and any other schema keys)."""
    return {**schema, "x-kubernetes-validations": [r.schema() for r in rules]}


def enforce(value: Any, *rules: Rule) -> None:
    """Raise ValueError with the rule's message for the first rule ``value`` breaks."""
    for rule in rules:
        if not rule.check(value):
            raise ValueError(rule.message)


# Label selectors (metav1.LabelSelector), shared by the NetworkPolicy peers and the share policy's pool.
LABEL_KEY_RULE = Rule(label_key_cel("self"), LABEL_KEY_MESSAGE, label_key_ok)
MATCH_LABEL_KEYS_RULE = Rule(f"self.all(k, {label_key_cel('k')})", f"matchLabels: {LABEL_KEY_MESSAGE}",
                             lambda labels: all(label_key_ok(k) for k in (labels or {})))


def match_labels_schema() -> dict[str, Any]:
    """The schema of a matchLabels map: valid keys (CEL) and values (pattern), 64 at most."""
    return cel(MATCH_LABEL_KEYS_RULE, maxProperties=MAX_SELECTOR_LABELS, additionalProperties={
        "type": "string", "maxLength": MAX_LABEL_VALUE, "pattern": LABEL_VALUE_PATTERN})


LABEL_VALUES_SCHEMA = {"items": {"type": "string", "maxLength": MAX_LABEL_VALUE, "pattern": LABEL_VALUE_PATTERN}}


def check_match_labels(labels: dict[str, str] | None) -> dict[str, str] | None:
    for key, value in (labels or {}).items():
        if not label_key_ok(key):
            raise ValueError(f"matchLabels key {key!r}: {LABEL_KEY_MESSAGE}")
        if not label_value_ok(value):
            raise ValueError(f"matchLabels[{key!r}] value {value!r}: {LABEL_VALUE_MESSAGE}")
    if labels is not None and len(labels) > MAX_SELECTOR_LABELS:
        raise ValueError(f"matchLabels may hold at most {MAX_SELECTOR_LABELS} labels")
    return labels


def check_label_key(key: str) -> str:
    if not label_key_ok(key):
        raise ValueError(f"label key {key!r}: {LABEL_KEY_MESSAGE}")
    return key


def check_label_values(values: Iterable[str] | None) -> None:
    for value in values or ():
        if not label_value_ok(value):
            raise ValueError(f"label value {value!r}: {LABEL_VALUE_MESSAGE}")
