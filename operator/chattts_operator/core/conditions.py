"""Status conditions (metav1.Condition as dicts): the one way every feature builds them."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def condition(ctype: str, status: bool | str, reason: str, message: str = "", *,
              generation: int | None = None, now: str | None = None) -> dict[str, Any]:
    """A condition; ``now`` stamps lastTransitionTime (else ``merge_conditions`` does)."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    cond: dict[str, Any] = {"type": ctype, "status": value, "reason": reason, "message": message}
    if now:
        cond["lastTransitionTime"] = now
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def merge_conditions(previous: Sequence[Mapping[str, Any]] | None, new: Sequence[Mapping[str, Any]],
                     now: str) -> list[dict[str, Any]]:
    """``new``, keeping lastTransitionTime where a condition's status did not change."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in new:
        old = before.get(cond["type"])
        stamp = old.get("lastTransitionTime") if old and old.get("status") == cond["status"] else None
        out.append({**cond, "lastTransitionTime": stamp or now})
    return out


def replace_condition(previous: Sequence[Mapping[str, Any]] | None, cond: Mapping[str, Any],
                      now: str) -> list[dict[str, Any]]:
    """``previous`` with ``cond`` merged in place of the condition of its type."""
    kept = [dict(c) for c in previous or [] if c.get("type") != cond["type"]]
    return kept + merge_conditions(previous, [cond], now)
