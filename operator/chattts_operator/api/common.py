"""Pieces shared by every kind: the condition type and the description of a CRD kind."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


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
