"""`spec.autoscaling` and `status.autoscaling` of a ChatTTSDeployment.

Units, chosen once and used everywhere in this file:
- Durations that are *ours* (the wait target, the evaluation window, staleness, the
  batch-token quiet period) are Go-style duration strings: ``"5ms"``, ``"60s"``,
  ``"10m"``, ``"1h30m"``. ``parse_duration`` turns them into seconds (float).
- Fields copied from the HorizontalPodAutoscaler ``behavior`` block keep HPA's names
  and integer seconds (``stabilizationWindowSeconds``, ``periodSeconds``), so an
  HPA behaviour block can be pasted as is.
- Times in status are RFC 3339 UTC strings, as everywhere in Kubernetes status.

Cross-field rules are checked twice: by the model validators here (the operator and
the unit tests) and by the API server at apply time, through the CEL rules attached
to each model as ``x-kubernetes-validations`` in its JSON schema (crdgen copies them
into the CRD).
"""
from __future__ import annotations

import math
import re
import string
from urllib.parse import urlsplit
from typing import Any, Literal

from chattts_runtime import metric_names
from pydantic import ConfigDict, Field, field_validator, model_validator

from .common import Condition, SpecModel, StatusModel, format_time, parse_time
from .rules import Rule, cel, enforce

# Go's time.ParseDuration subset we accept: one or more <number><unit>, units ms/s/m/h.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# Placeholders a Prometheus query template may use ($name, ${name}).
QUERY_PLACEHOLDERS = frozenset({"namespace", "name", "window", "quantile", "selector"})

DEFAULT_PROMETHEUS_QUERY = (
    "histogram_quantile($quantile, sum by (le) (rate("
    f'{metric_names.SCHEDULER_DEADLINE_WAIT}_bucket{{namespace="$namespace",$selector}}[$window])))'
)

# How many past decisions status keeps: enough to read a scaling story, small enough
# to keep the object far below etcd's size limit.
MAX_DECISIONS_KEPT = 10


def parse_duration(text: str) -> float:
    """Seconds in a duration string such as ``"5ms"``, ``"1m30s"``; ValueError if malformed."""
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(
            f"invalid duration {text!r}: use a number and a unit (ms, s, m, h), e.g. '5ms', '60s', '1m30s'"
        )
    return sum(float(value) * _UNIT_SECONDS[unit] for value, unit in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest readable duration string for a number of seconds (``0.0123`` -> ``"12.3ms"``)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration")
    if seconds < 1.0:
        return f"{_trim(seconds * 1000.0)}ms"
    if seconds < 60.0:
        return f"{_trim(seconds)}s"
    if seconds < 3600.0:
        return f"{_trim(seconds / 60.0)}m"
    return f"{_trim(seconds / 3600.0)}h"


def _trim(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def _validate_duration(value: str, field: str, *, minimum: float = 0.0) -> str:
    seconds = parse_duration(value)
    if seconds < minimum:
        raise ValueError(f"{field} must be at least {format_duration(minimum)}, got {value!r}")
    return value


def min_duration_rule(field: str, minimum: float) -> dict[str, Any]:
    """The CRD's twin of ``_validate_duration``: the API server refuses a duration shorter than
    ``minimum`` seconds at apply time (CEL's duration() reads our forms: 5ms, 1m30s, 1.5h)."""
    floor = format_duration(minimum)
    return {"x-kubernetes-validations": [{
        "rule": f"!self.matches(r'{DURATION_PATTERN}') || duration(self) >= duration('{floor}')",
        "message": f"{field} must be at least {floor}",
    }]}


# --- spec ---------------------------------------------------------------------------


class ScalingPolicy(SpecModel):
    """One rate limit on scaling, as in the HPA: at most `value` pods (or percent of the
    current replicas) may be added or removed within any `periodSeconds`."""

    type: Literal["Pods", "Percent"] = Field(
        description="Pods: an absolute number of replicas; Percent: a share of the current replicas."
    )
    value: int = Field(ge=1, description="How many replicas (Pods) or what percentage (Percent).")
    period_seconds: int = Field(
        ge=1, le=1800, description="The window, in seconds, over which the policy limits changes."
    )


class ScalingRules(SpecModel):
    """Stabilization and rate policies for one direction, with the HPA's semantics."""

    stabilization_window_seconds: int = Field(
        0,
        ge=0,
        le=3600,
        description=(
            "Recommendations of the last this many seconds are considered: scale-up uses the "
            "lowest of them, scale-down the highest, so a short spike or dip does not move replicas."
        ),
    )
    select_policy: Literal["Max", "Min", "Disabled"] = Field(
        "Max",
        description="Which policy wins when several apply: the one allowing the most change (Max), "
        "the least (Min), or none: scaling in this direction is off (Disabled).",
    )
    policies: list[ScalingPolicy] = Field(
        default_factory=list,
        max_length=10,
        description="Rate limits; an empty list means no limit in this direction.",
    )


def _default_scale_up() -> ScalingRules:
    # The HPA's defaults: double or add 4 pods every 15 s, whichever is more; no stabilization.
    return ScalingRules(
        stabilization_window_seconds=0,
        select_policy="Max",
        policies=[
            ScalingPolicy(type="Percent", value=100, period_seconds=15),
            ScalingPolicy(type="Pods", value=4, period_seconds=15),
        ],
    )


def _default_scale_down() -> ScalingRules:
    # 360 s stabilization (HPA's is 300 s: a square wave of 5.5-minute halves then flaps, and
    # 420 s scales down too late after a burst; bench/results/autoscaler-results.md), then
    # any amount per 15 s.
    return ScalingRules(
        stabilization_window_seconds=360,
        select_policy="Max",
        policies=[ScalingPolicy(type="Percent", value=100, period_seconds=15)],
    )


class ScalingBehavior(SpecModel):
    """How fast replicas may change in each direction (the HPA `behavior` block)."""

    scale_up: ScalingRules = Field(default_factory=_default_scale_up, description="Rules for adding replicas.")
    scale_down: ScalingRules = Field(
        default_factory=_default_scale_down, description="Rules for removing replicas."
    )


class PodsMetricSource(SpecModel):
    """Read each Ready pod's Prometheus endpoint directly (no Prometheus server needed)."""

    port: int = Field(8000, ge=1, le=65535, description="The pod port serving metrics.")
    path: str = Field("/metrics", pattern=r"^/", description="The HTTP path of the metrics endpoint.")
    scheme: Literal["http", "https"] = Field("http", description="http or https.")
    timeout: str = Field("2s", pattern=DURATION_PATTERN, description="Per-pod scrape timeout.",
                         json_schema_extra=min_duration_rule("timeout", 0.001))

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, value: str) -> str:
        return _validate_duration(value, "timeout", minimum=0.001)

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)


def _http_url_with_host(text: str) -> bool:
    try:
        parts = urlsplit(text)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in text)
    except ValueError:
        return False


PROMETHEUS_URL_RULE = Rule(
    "isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",
    "metrics.prometheus.url must be an http(s) URL with a host, e.g. http://prometheus.monitoring:9090",
    _http_url_with_host)


class PrometheusMetricSource(SpecModel):
    """Ask a Prometheus server (HTTP API, instant query) for the wait quantile."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The same check as the validator below, at apply time ($$ is a literal $).
                    "rule": "self.query.replace('$$', '').findAll('[$][{]?[A-Za-z_][A-Za-z0-9_]*')"
                            ".all(p, p.replace('{', '') in "
                            + "[" + ", ".join(f"'${name}'" for name in sorted(QUERY_PLACEHOLDERS)) + "])",
                    "message": "metrics.prometheus.query uses an unknown placeholder; known: "
                               + ", ".join(f"${name}" for name in sorted(QUERY_PLACEHOLDERS)),
                },
            ]
        }
    )

    url: str = Field(
        pattern=r"^https?://", max_length=2048, json_schema_extra=cel(PROMETHEUS_URL_RULE),
        description="Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090.",
    )
    query: str = Field(
        DEFAULT_PROMETHEUS_QUERY,
        min_length=1,
        max_length=4096,
        description=(
            "PromQL returning one scalar: the fleet's scheduler_deadline_wait in seconds. "
            "Placeholders: $namespace, $name (the ChatTTSDeployment), $window (the evaluation "
            "window), $quantile, $selector (label matchers selecting this deployment's pods)."
        ),
    )
    timeout: str = Field("5s", pattern=DURATION_PATTERN, description="Query timeout.",
                         json_schema_extra=min_duration_rule("timeout", 0.001))

    @field_validator("query")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        unknown = set()
        for match in string.Template.pattern.finditer(value):
            name = match.group("named") or match.group("braced")
            if name and name not in QUERY_PLACEHOLDERS:
                unknown.add(name)
            if match.group("invalid") is not None:
                raise ValueError(
                    f"query has a stray '$' at offset {match.start()}: write '$$' for a literal dollar"
                )
        if unknown:
            raise ValueError(
                f"query uses unknown placeholders {sorted(unknown)}; known: {sorted(QUERY_PLACEHOLDERS)}"
            )
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, value: str) -> str:
        return _validate_duration(value, "timeout", minimum=0.001)

    @field_validator("url")
    @classmethod
    def _url_has_host(cls, value: str) -> str:
        enforce(value, PROMETHEUS_URL_RULE)
        return value

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)

    def render_query(self, *, namespace: str, name: str, window: str, quantile: float, selector: str) -> str:
        return string.Template(self.query).substitute(
            namespace=namespace, name=name, window=window, quantile=repr(quantile), selector=selector
        )


class MetricSource(SpecModel):
    """Where scheduler_deadline_wait comes from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type != 'prometheus' || has(self.prometheus)",
                    "message": "metrics.type prometheus needs metrics.prometheus.url",
                },
            ]
        }
    )

    type: Literal["pods", "prometheus"] = Field(
        "pods",
        description="pods (default): scrape every Ready pod's /metrics; prometheus: query a Prometheus server.",
    )
    pods: PodsMetricSource = Field(default_factory=PodsMetricSource, description="Settings for type pods.")
    prometheus: PrometheusMetricSource | None = Field(None, description="Settings for type prometheus.")

    @model_validator(mode="after")
    def _prometheus_needs_settings(self) -> "MetricSource":
        if self.type == "prometheus" and self.prometheus is None:
            raise ValueError("metrics.type prometheus needs metrics.prometheus.url")
        return self


class BatchTokenTuning(SpecModel):
    """Opt-in: raise the engine's maxNumBatchedTokens while waits stay above target and the
    GPU memory plan has KV-cache room; lower it again after a sustained quiet period.
    Each change is a rolling update, so changes are rare and never reverse quickly."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!has(self.cap) || self.cap >= self.step", "message": "batchTokenTuning.cap must be at least step"},
                {
                    "rule": "!self.enabled || has(self.cap)",
                    "message": "batchTokenTuning.cap is required when batchTokenTuning.enabled is true",
                },
            ]
        }
    )

    enabled: bool = Field(False, description="Turn batch-token tuning on.")
    step: int = Field(1024, ge=16, description="Tokens added or removed per change.")
    cap: int | None = Field(
        None, ge=16, description="Never raise maxNumBatchedTokens above this; required when enabled."
    )
    sustained_for: str = Field(
        "3m",
        pattern=DURATION_PATTERN,
        json_schema_extra=min_duration_rule("sustainedFor", 1.0),
        description="Waits must stay above target this long (at max replicas) before a raise.",
    )
    quiet_period: str = Field(
        "15m",
        pattern=DURATION_PATTERN,
        json_schema_extra=min_duration_rule("quietPeriod", 1.0),
        description="Waits must stay below half the target this long before a step back down.",
    )

    @field_validator("sustained_for", "quiet_period")
    @classmethod
    def _durations(cls, value: str, info) -> str:
        return _validate_duration(value, info.field_name, minimum=1.0)

    @model_validator(mode="after")
    def _cap_rules(self) -> "BatchTokenTuning":
        if self.enabled and self.cap is None:
            raise ValueError("batchTokenTuning.cap is required when batchTokenTuning.enabled is true")
        if self.cap is not None and self.cap < self.step:
            raise ValueError(f"batchTokenTuning.cap ({self.cap}) must be at least step ({self.step})")
        return self


FORECAST_LEAD_WITHIN_PERIOD = Rule(
    f"!self.lead.matches(r'{DURATION_PATTERN}') || !self.period.matches(r'{DURATION_PATTERN}')"
    " || duration(self.lead) <= duration(self.period)",
    "forecast.lead must not exceed forecast.period (the floor looks ahead within one period)",
    lambda f: parse_duration(f.lead) <= parse_duration(f.period))


class ForecastSpec(SpecModel):
    """Forecast-aware minimums: the operator records, per minute, how many replicas the
    load needed; ``period`` later (the same time the next day) it raises the floor to the
    most the next ``lead`` needed, so replicas are Ready before a rise that repeats.
    ``lead`` must cover a cold start (scheduling, weights, engine warm-up)."""

    model_config = ConfigDict(json_schema_extra=cel(FORECAST_LEAD_WITHIN_PERIOD))

    enabled: bool = Field(True, description="Raise the floor ahead of load that repeats every period.")
    lead: str = Field("5m", pattern=DURATION_PATTERN, json_schema_extra=min_duration_rule("lead", 60.0),
                      description="How far ahead of a predicted rise the floor rises (at least one cold start).")
    period: str = Field("24h", pattern=DURATION_PATTERN, json_schema_extra=min_duration_rule("period", 60.0),
                        description="How often the load repeats (a day), at least 1m.")

    @field_validator("lead", "period")
    @classmethod
    def _durations(cls, value: str, info) -> str:
        return _validate_duration(value, info.field_name, minimum=60.0)

    @model_validator(mode="after")
    def _lead_within_period(self) -> "ForecastSpec":
        enforce(self, FORECAST_LEAD_WITHIN_PERIOD)
        return self

    @property
    def lead_seconds(self) -> float:
        return parse_duration(self.lead)

    @property
    def period_seconds(self) -> float:
        return parse_duration(self.period)


class AutoscalingSpec(SpecModel):
    """Autoscaling on scheduler_deadline_wait: the time from a request's arrival until the
    engine first runs it. When disabled, the scale subresource is left to HPA or KEDA."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                    "message": "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
                },
                {
                    "rule": "!self.enabled || has(self.maxReplicas)",
                    "message": "autoscaling.maxReplicas is required when autoscaling.enabled is true",
                },
            ]
        }
    )

    enabled: bool = Field(False, description="Let the operator own spec.replicas.")
    min_replicas: int = Field(1, ge=1, le=10000, description="Never fewer replicas than this.")
    max_replicas: int | None = Field(
        None,
        ge=1,
        le=10000,
        description="Never more replicas than this (nor than the GPU share of a rebalancing schedule).",
    )
    target_scheduler_deadline_wait: str = Field(
        "5ms",
        pattern=DURATION_PATTERN,
        json_schema_extra=min_duration_rule("targetSchedulerDeadlineWait", 0.0001),
        description=(
            "Target for the wait quantile across the fleet, a duration such as 5ms. Above it "
            "the engine is saturated and requests queue."
        ),
    )
    quantile: float = Field(
        0.99, gt=0.0, lt=1.0, description="Which quantile of the wait is held to the target (0.99 = p99)."
    )
    window: str = Field(
        "60s",
        pattern=DURATION_PATTERN,
        json_schema_extra=min_duration_rule("window", 1.0),
        description="Evaluation window: the wait quantile and the load are computed over this span.",
    )
    tolerance: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="No change while the metric is within this fraction of the target (HPA: 0.1).",
    )
    staleness: str = Field(
        "2m",
        pattern=DURATION_PATTERN,
        json_schema_extra=min_duration_rule("staleness", 1.0),
        description="Samples older than this are ignored; with no fresh sample the replicas hold.",
    )
    behavior: ScalingBehavior = Field(
        default_factory=ScalingBehavior, description="Stabilization windows and rate policies, HPA-style."
    )
    reversal_guard: str = Field(
        "10m",
        pattern=DURATION_PATTERN,
        description=(
            "No scale-down within this long of a scale-up, unless the replicas are idle (nothing in "
            "flight, no request in the window): a reversal this soon is flapping."
        ),
    )
    deep_drop_window: str = Field(
        "1m",
        pattern=DURATION_PATTERN,
        description=(
            "Scale-down stabilization after a deep drop (the load needs half the replicas or fewer), "
            "used instead of behavior.scaleDown's window while the last hour's demand record holds no "
            "deep dip that came back within reversalGuard. Set it to that window to turn it off."
        ),
    )
    forecast: ForecastSpec = Field(default_factory=ForecastSpec, description="Forecast-aware minimums.")
    metrics: MetricSource = Field(default_factory=MetricSource, description="Where the metric is read.")
    batch_token_tuning: BatchTokenTuning = Field(
        default_factory=BatchTokenTuning, description="Opt-in tuning of the engine's maxNumBatchedTokens (engine.kind vllm only; other engines have none)."
    )

    @field_validator("target_scheduler_deadline_wait")
    @classmethod
    def _target_positive(cls, value: str) -> str:
        return _validate_duration(value, "targetSchedulerDeadlineWait", minimum=0.0001)

    @field_validator("window")
    @classmethod
    def _window_min(cls, value: str) -> str:
        return _validate_duration(value, "window", minimum=1.0)

    @field_validator("reversal_guard")
    @classmethod
    def _guard_valid(cls, value: str) -> str:
        return _validate_duration(value, "reversalGuard")

    @property
    def reversal_guard_seconds(self) -> float:
        return parse_duration(self.reversal_guard)

    @property
    def deep_drop_window_seconds(self) -> float:
        return parse_duration(self.deep_drop_window)

    @field_validator("staleness")
    @classmethod
    def _staleness_min(cls, value: str) -> str:
        return _validate_duration(value, "staleness", minimum=1.0)

    @model_validator(mode="after")
    def _replica_bounds(self) -> "AutoscalingSpec":
        if self.enabled and self.max_replicas is None:
            raise ValueError("autoscaling.maxReplicas is required when autoscaling.enabled is true")
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.minReplicas ({self.min_replicas}) must not exceed "
                f"autoscaling.maxReplicas ({self.max_replicas})"
            )
        return self

    # Parsed values for the decision function (seconds).
    @property
    def target_seconds(self) -> float:
        return parse_duration(self.target_scheduler_deadline_wait)

    @property
    def window_seconds(self) -> float:
        return parse_duration(self.window)

    @property
    def staleness_seconds(self) -> float:
        return parse_duration(self.staleness)


# --- status -------------------------------------------------------------------------


class ScalingDecisionRecord(StatusModel):
    """One evaluation that changed something or explains why nothing changed."""

    time: str = Field(description="RFC 3339 time of the decision.")
    metric_value: str | None = Field(
        None, description="The wait quantile seen, as a duration; empty when the metric was missing."
    )
    current_replicas: int
    desired_replicas: int
    reason: str = Field(description="Machine-readable reason, e.g. ScaleUp, ScaleDown, HoldStaleMetric.")
    message: str = Field("", description="Why, for humans.")


class RecommendationRecord(StatusModel):
    """A past raw recommendation, kept for the stabilization windows (survives restarts)."""

    time: str
    replicas: int


class ScaleEventRecord(StatusModel):
    """A past change of replicas, kept for the rate policies (survives restarts)."""

    time: str
    change: int = Field(description="Replicas added (positive) or removed (negative).")


class BatchTokenTuningStatus(StatusModel):
    """State of batch-token tuning."""

    max_num_batched_tokens: int | None = Field(
        None, description="The value the operator set; empty while the engine's own setting applies."
    )
    last_change_time: str | None = None
    above_target_since: str | None = Field(None, description="Start of the current run of waits above target.")
    quiet_since: str | None = Field(None, description="Start of the current run of waits well below target.")


class AutoscalingStatus(StatusModel):
    """What the autoscaler saw and did."""

    current_metric: str | None = Field(None, description="Last fresh wait quantile, as a duration.")
    desired_replicas: int | None = Field(None, description="Replicas the autoscaler last asked for.")
    last_scale_time: str | None = Field(None, description="When replicas were last changed by the autoscaler.")
    last_scale_up_time: str | None = Field(None, description="When replicas were last added (the reversal guard's clock).")
    forecast_floor: int | None = Field(None, description="The forecast's floor at the last evaluation, if any.")
    step_time: str | None = Field(
        None, description="Learned engine step time near the load limit (the capacity signal's unit), as a duration.")
    last_evaluation_time: str | None = None
    decisions: list[ScalingDecisionRecord] = Field(
        default_factory=list, description=f"The last {MAX_DECISIONS_KEPT} decisions, newest last."
    )
    recommendations: list[RecommendationRecord] = Field(
        default_factory=list, description="Raw recommendations within the longest stabilization window."
    )
    scale_events: list[ScaleEventRecord] = Field(
        default_factory=list, description="Replica changes within the longest policy period."
    )
    conditions: list[Condition] = Field(default_factory=list)
    batch_token_tuning: BatchTokenTuningStatus | None = None


__all__ = [
    "AutoscalingSpec",
    "AutoscalingStatus",
    "BatchTokenTuning",
    "ForecastSpec",
    "BatchTokenTuningStatus",
    "DURATION_PATTERN",
    "MAX_DECISIONS_KEPT",
    "MetricSource",
    "PodsMetricSource",
    "PrometheusMetricSource",
    "RecommendationRecord",
    "ScaleEventRecord",
    "ScalingBehavior",
    "ScalingDecisionRecord",
    "ScalingPolicy",
    "ScalingRules",
    "format_duration",
    "format_time",
    "parse_duration",
    "parse_time",
]
