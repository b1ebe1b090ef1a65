"""Count API requests from the API server's own ``apiserver_request_total`` (pure parts).

The counter has no client label, so requests are attributed by what only the operator
does on this cluster (see ``operator_request``): every other client's requests on the same
resources (the controller-manager's status updates, kwok's node heartbeats, the
benchmark's own creates and watches) use other verbs or subresources. Long-running WATCH
requests are counted when they end, so they are left out of per-reconcile figures.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

WRITE_VERBS = frozenset({"CREATE", "UPDATE", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST"})


@dataclass(frozen=True, order=True)
class RequestKey:
    verb: str
    resource: str
    subresource: str


def parse_request_totals(text: str) -> Counter[RequestKey]:
    """apiserver_request_total summed over code/scope/component/version, by verb/resource/subresource."""
    totals: Counter[RequestKey] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":  # the parser drops the _total suffix of counters
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            if labels.get("dry_run"):
                continue
            key = RequestKey(labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
            totals[key] += int(sample.value)
    return totals


def parse_request_seconds(text: str) -> dict[str, list[float]]:
    """apiserver_request_duration_seconds by "VERB resource[/subresource]": [sum, count]
    (summed over scope/component/version; what the API server itself spent on them)."""
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request_duration_seconds":
            continue
        for sample in family.samples:
            field = {"apiserver_request_duration_seconds_sum": 0, "apiserver_request_duration_seconds_count": 1}.get(
                sample.name)
            if field is None or sample.labels.get("dry_run"):
                continue
            labels = sample.labels
            key = f"{labels.get('verb', '')} {labels.get('resource', '')}" + (
                f"/{labels['subresource']}" if labels.get("subresource") else "")
            out.setdefault(key, [0.0, 0.0])[field] += sample.value
    return out


def mean_ms_between(after: dict[str, list[float]], before: dict[str, list[float]], keys: tuple[str, ...]) -> dict:
    """The mean API server time (ms) of each of ``keys`` between two ``parse_request_seconds``."""
    out = {}
    for key in keys:
        total = after.get(key, [0.0, 0.0])[0] - before.get(key, [0.0, 0.0])[0]
        count = after.get(key, [0.0, 0.0])[1] - before.get(key, [0.0, 0.0])[1]
        out[key] = round(1000 * total / count, 1) if count else None
    return out


def delta(after: Counter[RequestKey], before: Counter[RequestKey]) -> Counter[RequestKey]:
    out: Counter[RequestKey] = Counter()
    for key, value in after.items():
        diff = value - before.get(key, 0)
        if diff > 0:
            out[key] = diff
    return out


# What the operator does, and no other client of the benchmark cluster does in the window:
CHILD_RESOURCES = ("configmaps", "services", "deployments", "poddisruptionbudgets")


def operator_request(key: RequestKey) -> bool:
    """Whether a request of this kind can only come from the operator during a benchmark phase.

    - ChatTTSDeployments: GET/LIST and PATCH (kopf's annotations, our status subresource);
      the benchmark itself creates them with POST and changes specs with a PATCH that it
      counts and subtracts (``Attribution.bench_patches``).
    - children: GET, LIST (kopf lists whole kinds it watches), APPLY; the controllers use
      UPDATE on the status subresource, the root-CA publisher CREATEs one ConfigMap per
      namespace.
    - Jobs (LIST: quantization lookup), Nodes (LIST: GPU sizes; kwok uses GET/PATCH).
    """
    if key.resource == "chattsdeployments":
        return key.verb in ("GET", "LIST", "PATCH", "APPLY", "UPDATE")
    if key.resource in CHILD_RESOURCES:
        return key.subresource == "" and key.verb in ("GET", "LIST", "APPLY", "PATCH")
    if key.resource in ("jobs", "gpusharepolicies"):
        return key.verb in ("GET", "LIST", "APPLY", "PATCH", "CREATE", "DELETE")
    if key.resource == "nodes":
        return key.verb == "LIST"
    return False


@dataclass
class Attribution:
    reads: int
    writes: int
    by_key: dict[str, int]
    events_all_clients: int  # Events are created by the operator and the controllers alike

    @property
    def total(self) -> int:
        return self.reads + self.writes


def attribute(window: Counter[RequestKey], bench_patches: int = 0) -> Attribution:
    """The operator's share of a window's requests; ``bench_patches`` of the benchmark's own
    PATCHes of ChatTTSDeployments (spec changes) are taken off."""
    reads = writes = 0
    by_key: dict[str, int] = {}
    for key, count in sorted(window.items()):
        if not operator_request(key):
            continue
        if key.resource == "chattsdeployments" and key.verb == "PATCH" and key.subresource == "" and bench_patches:
            taken = min(bench_patches, count)
            count -= taken
            bench_patches -= taken
            if not count:
                continue
        label = f"{key.verb} {key.resource}" + (f"/{key.subresource}" if key.subresource else "")
        by_key[label] = count
        if key.verb in WRITE_VERBS:
            writes += count
        elif key.verb in READ_VERBS:
            reads += count
    events = sum(v for k, v in window.items() if k.resource == "events" and k.verb in WRITE_VERBS)
    return Attribution(reads, writes, by_key, events)


# The operator's own count (its chattts_operator_api_requests_total, "METHOD resource"): exact where
# the attribution above guesses (the API server's counter has no client label).
OWN_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def own_window(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    """The operator's requests between two reads of its counter, by "METHOD resource"."""
    return {k: int(v - before.get(k, 0)) for k, v in sorted(after.items()) if v - before.get(k, 0) > 0}


def own_per_object(window: dict[str, int], n: int) -> dict[str, float]:
    """Requests, writes, status patches and Events per object, from ``own_window``."""
    return {
        "requests": round(sum(window.values()) / n, 2),
        "writes": round(sum(v for k, v in window.items() if k.split()[0] in OWN_WRITE_METHODS) / n, 2),
        "status_patches": round(window.get("PATCH chattsdeployments/status", 0) / n, 2),
        "events": round(window.get("POST events", 0) / n, 2),
    }
