"""Pieces shared by every kind: the condition type, the description of a CRD kind, and
quantities as live objects carry them."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    """Every kind's spec models: camelCase in the CRD, snake_case in Python, unknown fields rejected,
    immutable once parsed."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class StatusModel(BaseModel):
    """Every kind's status models: camelCase; unknown fields (from an older operator) ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(BaseModel):
    """A condition, following the Kubernetes API conventions (metav1.Condition)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    type: str = Field(description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", description="CamelCase machine-readable reason for the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str = Field("", description="RFC 3339 time the status last changed.")
    observed_generation: int | None = Field(None, description="The generation this condition was computed from.")


@dataclass(frozen=True)
class CrdKind:
    """Everything crdgen needs to write one CustomResourceDefinition."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    scope: Literal["Namespaced", "Cluster"]
    model: type[BaseModel]  # the whole object: fields `spec` and `status`
    short_names: list[str] = field(default_factory=list)
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    scale: dict[str, str] | None = None  # the scale subresource's paths, or None
    categories: list[str] = field(default_factory=lambda: ["chattts"])

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    @classmethod
    def from_module(cls, module: ModuleType, model: type[BaseModel]) -> "CrdKind":
        """Read the GROUP/VERSION/KIND/... constants an api module defines."""
        return cls(
            group=module.GROUP,
            version=module.VERSION,
            kind=module.KIND,
            plural=module.PLURAL,
            singular=module.SINGULAR,
            scope=module.SCOPE,
            model=model,
            short_names=list(getattr(module, "SHORT_NAMES", [])),
            printer_columns=list(getattr(module, "PRINTER_COLUMNS", [])),
            scale=getattr(module, "SCALE_SUBRESOURCE", None),
        )


# Kubernetes quantities: one suffix table for the spec's strict form and for live objects' values.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
_SUFFIXES = {"Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
             "Pi": Decimal(2**50), "Ei": Decimal(2**60),
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
             "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
             "P": Decimal(10**15), "E": Decimal(10**18)}
_PARTS = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
MIB = 2**20


def _value(text: str, original: Any) -> Decimal:
    match = _PARTS.match(text)
    if not match:
        raise ValueError(f"invalid quantity {original!r}: expected a number with an optional suffix such as Mi or Gi")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number) * (Decimal(10) ** int(exponent[1:]) if exponent else 1)
    except InvalidOperation:
        raise ValueError(f"invalid quantity {original!r}") from None
    return value * _SUFFIXES[suffix or ""]


def parse_quantity(text: str) -> Decimal:
    """A quantity as a spec must write it (the CRD's pattern: ``8Gi`` -> 8589934592); ValueError if not."""
    if not isinstance(text, str) or not re.fullmatch(QUANTITY_PATTERN, text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity: write e.g. 8Gi, 8192Mi or 24G")
    return _value(text, text)


def parse_live_quantity(value: Any) -> Decimal:
    """A quantity as a live object carries it ('24Gi', '1500M', '3', 3, '100m', '-1') as a Decimal;
    ValueError if malformed. Lenient where ``parse_quantity`` (a spec's) is strict."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    return _value(str(value).strip(), value)


def _whole_mib(value: Decimal) -> int:
    return int(math.ceil(value / MIB))  # rounded up: memory is never under-counted


def quantity_to_mib(text: str) -> int:
    """A spec's quantity in whole MiB, rounded up (extended resources and the GFD label are MiB integers)."""
    return _whole_mib(parse_quantity(text))


def bytes_to_mib(quantity: Any) -> int:
    """A live object's memory quantity in bytes ('24Gi') -> whole MiB, rounded up."""
    return _whole_mib(parse_live_quantity(quantity))


def format_time(instant: datetime | float) -> str:
    """The API's timestamp (RFC 3339, UTC, to the second) of an aware datetime or epoch seconds: the one
    formatter for status and Events (``core.clock.rfc3339`` gives it the operator's clock)."""
    if not isinstance(instant, datetime):
        instant = datetime.fromtimestamp(instant, tz=timezone.utc)
    elif instant.tzinfo is None:
        raise ValueError("format_time needs an aware datetime (UTC)")
    return instant.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp (``Z`` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
