"""`GPUSharePolicy`: a day/night schedule that splits a GPU pool between online serving
and offline work.

Scope: **cluster**. The pool is a set of Nodes (cluster-scoped), and one pool is usually
shared by teams in several namespaces (serving in one, batch synthesis and quantization
in another). Namespaced policies would let each namespace's owner hand out the same nodes;
with cluster-scoped policies one owner (the capacity owner) sees every policy over the
pool, and where two policies' node selectors still overlap, the one named first acts and
the other reports ``Valid=False`` (reason ``OverlappingPool``) and changes nothing.

Membership is by label: a `ChatTTSDeployment` (online) or a batch/v1 `Job` (offline), in
any namespace, joins the policy named in its label ``tts.chattts.io/share-policy``. A fixed
key (rather than a free selector per policy) means an object belongs to at most one
policy, and the operator lists members with a server-side label selector.

Shares are percentages of the pool's GPU memory (MiB, summed over Ready, schedulable
nodes matching ``spec.nodeSelector``), whatever the sharing profile: a whole GPU counts
its full memory, a memory slice its MiB, a MIG slice its memory.

Windows are wall-clock times in ``spec.timezone`` (IANA name). A window whose end is not
after its start crosses midnight and ends the next day; ``days`` are the days on which a
window *starts*. On DST change days a local time that does not exist (spring forward)
is shifted forward by the gap, and an ambiguous one (fall back) means its first
occurrence. When windows overlap, ``spec.overlap`` decides: ``LatestStart`` (default,
the window that started most recently wins, so a short exception inside a long window
takes over) or ``FirstListed``. Outside every window, ``spec.defaultShares`` apply.
"""
from __future__ import annotations

import re
from datetime import time
from enum import Enum
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .common import Condition, SpecModel, StatusModel
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

GROUP = "tts.chattts.io"
VERSION = "v1alpha1"
KIND = "GPUSharePolicy"
PLURAL = "gpusharepolicies"
SINGULAR = "gpusharepolicy"
SHORT_NAMES = ["gsp"]
SCOPE = "Cluster"

# Label on a ChatTTSDeployment or Job: the name of the policy it belongs to.
SHARE_POLICY_LABEL = "tts.chattts.io/share-policy"
# Annotation on an offline Job: its priority among offline members (higher resumes first).
OFFLINE_PRIORITY_ANNOTATION = "tts.chattts.io/offline-priority"
# Annotations the operator writes on an online member (a ChatTTSDeployment):
REPLICA_CAP_ANNOTATION = "tts.chattts.io/replica-cap"  # the most replicas the policy allows now
REPLICA_CAP_REASON_ANNOTATION = "tts.chattts.io/replica-cap-reason"
# The pool's node selector as node-affinity requirements (JSON list of NodeSelectorRequirements):
# the serving pods are confined to the pool whose share they are counted against.
POOL_AFFINITY_ANNOTATION = "tts.chattts.io/pool-node-affinity"

# PriorityClasses the operator maintains: online pods may preempt offline ones.
ONLINE_PRIORITY_CLASS = "chattts-online"
OFFLINE_PRIORITY_CLASS = "chattts-offline"
ONLINE_PRIORITY_VALUE = 100000
OFFLINE_PRIORITY_VALUE = 1000

TIME_PATTERN = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"
TIMEZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$"
WINDOW_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_WINDOWS = 32
# Past actions kept in status: enough to read a day's story, small enough for etcd.
MAX_ACTIONS_KEPT = 20
# Members listed in status: the object stays far below etcd's size limit with thousands of Jobs.
MAX_MEMBERS_LISTED = 200


class Weekday(str, Enum):
    MON = "Mon"
    TUE = "Tue"
    WED = "Wed"
    THU = "Thu"
    FRI = "Fri"
    SAT = "Sat"
    SUN = "Sun"

    @property
    def index(self) -> int:
        """Monday is 0, as in ``datetime.weekday()``."""
        return list(Weekday).index(self)


class OverlapRule(str, Enum):
    LATEST_START = "LatestStart"
    FIRST_LISTED = "FirstListed"


def parse_clock_time(text: str) -> tuple[int, int]:
    """``"HH:MM"`` (``"24:00"`` allowed) -> (hours, minutes); ValueError if malformed."""
    if not isinstance(text, str) or not re.fullmatch(TIME_PATTERN, text):
        raise ValueError(f"invalid time {text!r}: use HH:MM on a 24-hour clock, e.g. '08:00', '20:30' or '24:00'")
    hours, minutes = text.split(":")
    return int(hours), int(minutes)


def load_timezone(name: str) -> ZoneInfo:
    """The IANA zone named, or ValueError with a hint."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown timezone {name!r}: use an IANA name such as 'UTC', 'Europe/Berlin' or 'America/New_York'"
        ) from None


_SHARES_RULE = {
    "rule": "self.online + self.offline <= 100",
    "message": "online + offline may not exceed 100 (percent of the pool's GPU memory)",
}


class Shares(SpecModel):
    """How the pool's GPU memory is split, in percent. What neither side gets stays free."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_SHARES_RULE]})

    online: int = Field(100, ge=0, le=100, description="Percent of the pool's GPU memory for online serving.")
    offline: int = Field(0, ge=0, le=100, description="Percent of the pool's GPU memory for offline Jobs.")

    @model_validator(mode="after")
    def _sum_at_most_100(self) -> "Shares":
        if self.online + self.offline > 100:
            raise ValueError(
                f"online + offline may not exceed 100 (percent of the pool's GPU memory), "
                f"got {self.online} + {self.offline}"
            )
        return self


class ScheduleWindow(SpecModel):
    """A daily time window with its shares. ``end`` not after ``start`` means the window
    crosses midnight and ends the next day."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _SHARES_RULE,
                {"rule": "self.start != self.end", "message": "a window's start and end must differ"},
                {"rule": "self.start != '24:00'", "message": "a window may not start at 24:00; use 00:00"},
            ]
        }
    )

    name: str = Field(
        min_length=1, max_length=63, pattern=WINDOW_NAME_PATTERN,
        description="Name shown in status and Events, e.g. 'day' or 'night'.",
    )
    start: str = Field(pattern=TIME_PATTERN, max_length=5, description="Local start time, HH:MM (24-hour clock).")
    end: str = Field(
        pattern=TIME_PATTERN, max_length=5,
        description="Local end time, HH:MM; '24:00' is midnight at the end of the day. "
        "An end not after the start crosses midnight.",
    )
    days: list[Weekday] = Field(
        default_factory=list,
        max_length=7,
        description="Days on which the window starts (Mon..Sun); empty means every day.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    online: int = Field(ge=0, le=100, description="Percent of the pool's GPU memory for online serving.")
    offline: int = Field(ge=0, le=100, description="Percent of the pool's GPU memory for offline Jobs.")

    @field_validator("start", "end")
    @classmethod
    def _valid_time(cls, value: str) -> str:
        parse_clock_time(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ScheduleWindow":
        if self.start == self.end:
            raise ValueError(f"window {self.name!r}: start and end must differ (both {self.start})")
        if self.start == "24:00":
            raise ValueError(f"window {self.name!r}: may not start at 24:00; use 00:00")
        if self.online + self.offline > 100:
            raise ValueError(
                f"window {self.name!r}: online + offline may not exceed 100, got {self.online} + {self.offline}"
            )
        return self

    @property
    def shares(self) -> Shares:
        return Shares(online=self.online, offline=self.offline)

    @property
    def start_time(self) -> time:
        hours, minutes = parse_clock_time(self.start)
        return time(hours, minutes)

    @property
    def crosses_midnight(self) -> bool:
        return parse_clock_time(self.end) <= parse_clock_time(self.start)


class LabelSelectorRequirement(SpecModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                    "message": "selector operators In and NotIn need values",
                },
                {
                    "rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                    "message": "selector operators Exists and DoesNotExist take no values",
                },
            ]
        }
    )

    key: str = Field(min_length=1, max_length=MAX_LABEL_KEY, json_schema_extra=cel(LABEL_KEY_RULE),
                     description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(
        default_factory=list, max_length=64, description="Values for In and NotIn.",
        json_schema_extra=LABEL_VALUES_SCHEMA,
    )

    @model_validator(mode="after")
    def _values_match_operator(self) -> "LabelSelectorRequirement":
        check_label_key(self.key)
        check_label_values(self.values)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"selector requirement on {self.key!r}: {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"selector requirement on {self.key!r}: {self.operator} takes no values")
        return self


class LabelSelector(SpecModel):
    """A Kubernetes label selector (matchLabels and matchExpressions, ANDed)."""

    match_labels: dict[str, str] = Field(default_factory=dict, json_schema_extra=match_labels_schema())
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_match_labels(value) or {}


class GPUSharePolicySpec(SpecModel):
    """A GPU pool and the daily windows that split it between online and offline members."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.windows) || self.windows.all(w, self.windows.exists_one(v, v.name == w.name))",
                    "message": "window names must be unique",
                },
            ]
        }
    )

    node_selector: LabelSelector = Field(
        description="Which nodes form the pool (labels); an empty selector means every node with GPUs."
    )
    timezone: str = Field(
        "UTC", pattern=TIMEZONE_PATTERN, max_length=64,
        description="IANA timezone of the windows' times, e.g. 'Europe/Berlin'.",
    )
    windows: list[ScheduleWindow] = Field(
        default_factory=list, max_length=MAX_WINDOWS, description="Daily windows with their shares."
    )
    default_shares: Shares = Field(
        default_factory=Shares, description="Shares outside every window (default: all online)."
    )
    overlap: OverlapRule = Field(
        OverlapRule.LATEST_START,
        description="Which window wins where windows overlap: LatestStart (the most recently started) "
        "or FirstListed (the earliest in the list).",
    )

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        load_timezone(value)
        return value

    @model_validator(mode="after")
    def _unique_window_names(self) -> "GPUSharePolicySpec":
        seen: set[str] = set()
        for window in self.windows:
            if window.name in seen:
                raise ValueError(f"window names must be unique: {window.name!r} appears twice")
            seen.add(window.name)
        return self

    @property
    def zone(self) -> ZoneInfo:
        return load_timezone(self.timezone)


# --- status -----------------------------------------------------------------------


class PoolStatus(StatusModel):
    nodes: int = Field(0, description="Ready, schedulable nodes in the pool.")
    gpu_memory_mi_b: int = Field(0, alias="gpuMemoryMiB", description="The pool's GPU memory (MiB).")


class UsageStatus(StatusModel):
    online_mi_b: int = Field(0, alias="onlineMiB", description="GPU memory (MiB) asked by online members.")
    offline_mi_b: int = Field(0, alias="offlineMiB", description="GPU memory (MiB) asked by offline members.")
    total_mi_b: int = Field(0, alias="totalMiB", description="Both together; never above the pool.")


class BudgetStatus(StatusModel):
    online_mi_b: int = Field(0, alias="onlineMiB", description="The online share of the pool (MiB).")
    offline_mi_b: int = Field(0, alias="offlineMiB", description="The offline share of the pool (MiB).")


class MemberStatus(StatusModel):
    kind: str = Field(description="ChatTTSDeployment (online) or Job (offline).")
    namespace: str
    name: str
    gpu_memory_mi_b: int = Field(0, alias="gpuMemoryMiB", description="Per replica (online) or per Job (offline).")
    replica_cap: int | None = Field(None, description="Online: the most replicas allowed now.")
    state: str = Field("", description="Offline: Running, Suspended, Waiting (held for room) or Finished.")
    reason: str = Field("", description="Why it has this cap or state.")


class ActionRecord(StatusModel):
    time: str = Field(description="RFC 3339 UTC, from the operator's clock.")
    action: str = Field(description="Suspend, Resume, ScaleDown or ScaleUp.")
    kind: str
    namespace: str
    name: str
    reason: str


class GPUSharePolicyStatus(StatusModel):
    observed_generation: int | None = None
    window: str = Field("", description="The window in force ('' outside every window: default shares).")
    next_change: str | None = Field(None, description="When the window in force changes next (RFC 3339 UTC).")
    shares: Shares | None = None
    pool: PoolStatus = Field(default_factory=PoolStatus)
    budget: BudgetStatus = Field(default_factory=BudgetStatus)
    used: UsageStatus = Field(default_factory=UsageStatus)
    members: list[MemberStatus] = Field(
        default_factory=list, description=f"Online members, then offline ones (at most {MAX_MEMBERS_LISTED} listed)."
    )
    member_count: int = Field(0, description="All members, listed or not.")
    last_actions: list[ActionRecord] = Field(
        default_factory=list, description=f"The last {MAX_ACTIONS_KEPT} suspends, resumes and scalings, newest last."
    )
    overlaps: list[str] = Field(
        default_factory=list, description="Pairs of windows that overlap this week ('a/b'): the overlap rule decides there."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class GPUSharePolicy(BaseModel):
    """A GPU pool's daily schedule: the share of its GPU memory for online serving
    (ChatTTSDeployments) and for offline Jobs, per time window."""

    model_config = ConfigDict(populate_by_name=True)

    spec: GPUSharePolicySpec
    status: GPUSharePolicyStatus | None = None


PRINTER_COLUMNS = [
    {"name": "Window", "type": "string", "jsonPath": ".status.window"},
    {"name": "Online%", "type": "integer", "jsonPath": ".status.shares.online"},
    {"name": "Offline%", "type": "integer", "jsonPath": ".status.shares.offline"},
    {"name": "Used-MiB", "type": "integer", "jsonPath": ".status.used.totalMiB"},
    {"name": "Pool-MiB", "type": "integer", "jsonPath": ".status.pool.gpuMemoryMiB"},
    {"name": "Next-Change", "type": "string", "jsonPath": ".status.nextChange"},  # future: "date" prints <invalid>
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
