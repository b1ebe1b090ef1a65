"""The rebalancing planner: shares -> caps, suspends and resumes, and the invariant that
the GPU memory asked by members never exceeds the pool at any step."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

from chattts_operator.api.sharepolicy import GPUSharePolicySpec
from chattts_operator.sharepolicy.planner import OfflineMember, OnlineMember, PoolNode, plan

UTC = timezone.utc
DAYTIME = datetime(2026, 6, 1, 12, tzinfo=UTC)  # a Monday
NIGHTTIME = datetime(2026, 6, 1, 23, tzinfo=UTC)

POLICY = GPUSharePolicySpec.model_validate(
    {
        "nodeSelector": {},
        "timezone": "UTC",
        "windows": [
            {"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 20},
            {"name": "night", "start": "20:00", "end": "08:00", "online": 60, "offline": 40},
        ],
    }
)
POOL = [PoolNode("n1", 50_000), PoolNode("n2", 50_000)]  # 100,000 MiB


def tts(name="tts", wanted=10, cap=None, pods=None, per=10_000, ns="serving"):
    return OnlineMember(ns, name, per, wanted, cap, wanted if pods is None else pods)


def job(name, running=True, priority=0, per=20_000, par=1, pods=None, finished=False, created="2026-06-01T00:00:00Z", ns="batch"):
    return OfflineMember(ns, name, per, par, not running, priority, created, finished, (par if running else 0) if pods is None else pods)


def kinds(p):
    return [(a.action, a.name) for a in p.actions]


# --- table: one planning pass ---------------------------------------------------------

TABLE = [
    dict(
        case="day: online capped at 80%, offline keeps 20% for the higher-priority job",
        online=[tts(wanted=10, cap=6, pods=6)], offline=[job("a", priority=5), job("b", priority=1)],
        now=DAYTIME, window="day", caps={"tts": 6}, running={"a": True, "b": False},
        actions=[("Suspend", "b")],  # scale-up must wait for b's pod to go
    ),
    dict(
        case="day, after b's pod is gone: online takes its share",
        online=[tts(wanted=10, cap=6, pods=6)], offline=[job("a", priority=5), job("b", running=False, priority=1, pods=0)],
        now=DAYTIME, window="day", caps={"tts": 8}, running={"a": True, "b": False},
        actions=[("ScaleUp", "tts")],
    ),
    dict(
        case="night: online scaled down first, resume waits for its pods",
        online=[tts(wanted=10, cap=8, pods=8)], offline=[job("a", priority=5), job("b", running=False, priority=1)],
        now=NIGHTTIME, window="night", caps={"tts": 6}, running={"a": True, "b": False},
        actions=[("ScaleDown", "tts")],
    ),
    dict(
        case="night, after the pods are gone: offline resumes up to 40%",
        online=[tts(wanted=10, cap=6, pods=6)], offline=[job("a", priority=5), job("b", running=False, priority=1)],
        now=NIGHTTIME, window="night", caps={"tts": 6}, running={"a": True, "b": True},
        actions=[("Resume", "b")],
    ),
    dict(
        case="resumes go in priority order, and only while they fit",
        online=[tts(wanted=6, cap=6, pods=6)],
        offline=[job("low", running=False, priority=1, per=10_000), job("high", running=False, priority=9, per=10_000),
                 job("mid", running=False, priority=5, per=10_000), job("lowest", running=False, priority=0, per=20_000)],
        now=NIGHTTIME, window="night", caps={"tts": 6}, running={"high": True, "mid": True, "low": True, "lowest": False},
        actions=[("Resume", "high"), ("Resume", "mid"), ("Resume", "low")],
    ),
    dict(
        case="backfill: a job too big for the share waits, a smaller lower-priority one runs",
        online=[tts(wanted=6, cap=6, pods=6)],
        offline=[job("big", running=False, priority=9, per=50_000), job("small", running=False, priority=1, per=30_000)],
        now=NIGHTTIME, window="night", caps={"tts": 6}, running={"big": False, "small": True},
        actions=[("Resume", "small")],
    ),
    dict(
        case="equal priority: the running job keeps running, no churn",
        online=[tts(wanted=6, cap=6, pods=6)],
        offline=[job("old", running=False, created="2026-01-01T00:00:00Z"), job("new", running=True, created="2026-05-01T00:00:00Z")],
        now=DAYTIME, window="day", caps={"tts": 6}, running={"new": True, "old": False}, actions=[],
    ),
    dict(
        case="finished jobs ask nothing and are left alone",
        online=[tts(wanted=8, cap=8, pods=8)], offline=[job("done", running=True, finished=True, pods=0), job("a")],
        now=DAYTIME, window="day", caps={"tts": 8}, running={"a": True}, actions=[],
    ),
    dict(
        case="a new member without a cap is capped down to the share",
        online=[tts(wanted=12, cap=None, pods=0)], offline=[],
        now=DAYTIME, window="day", caps={"tts": 8}, running={}, actions=[("ScaleDown", "tts")],
    ),
    dict(
        case="two online members share round-robin",
        online=[tts("a", wanted=10, cap=None, pods=0), tts("b", wanted=2, cap=None, pods=0), tts("c", wanted=10, cap=None, pods=0)],
        offline=[], now=DAYTIME, window="day", caps={"a": 3, "b": 2, "c": 3}, running={},
        actions=[("ScaleDown", "a"), ("ScaleDown", "c")],
    ),
    dict(
        case="a user's unsuspended job that does not fit is suspended",
        online=[tts(wanted=8, cap=8, pods=8)], offline=[job("sneaky", running=True, pods=0, per=30_000)],
        now=DAYTIME, window="day", caps={"tts": 8}, running={"sneaky": False}, actions=[("Suspend", "sneaky")],
    ),
]


@pytest.mark.parametrize("row", TABLE, ids=[r["case"] for r in TABLE])
def test_plan_table(row):
    p = plan(POLICY, row["online"], row["offline"], POOL, row["now"])
    assert p.window == row["window"]
    assert {k[1]: v for k, v in p.caps.items()} == row["caps"]
    got_running = {k[1]: v for k, v in p.job_running.items() if k[1] in row["running"]}
    assert got_running == row["running"]
    assert kinds(p) == row["actions"]
    assert p.asked_after_mib <= p.pool_mib


def test_actions_are_ordered_suspend_scaledown_scaleup_resume():
    policy = GPUSharePolicySpec.model_validate({"nodeSelector": {}, "defaultShares": {"online": 50, "offline": 50}})
    online = [tts("shrink", wanted=10, cap=10, pods=0, per=5_000), tts("grow", wanted=4, cap=0, pods=0, per=5_000)]
    offline = [job("stop", priority=0, per=40_000, pods=0), job("start", running=False, priority=9, per=40_000)]
    p = plan(policy, online, offline, POOL, DAYTIME)
    assert kinds(p) == [("Suspend", "stop"), ("ScaleDown", "shrink"), ("ScaleUp", "grow"), ("Resume", "start")]
    assert p.caps == {("serving", "shrink"): 6, ("serving", "grow"): 4}


def test_pool_shrinking_only_releases():
    online = [tts(wanted=8, cap=8, pods=8)]
    offline = [job("a", priority=5), job("b", running=False, priority=1)]
    p = plan(POLICY, online, offline, [PoolNode("n1", 50_000), PoolNode("n2", 50_000, usable=False)], DAYTIME)
    assert p.pool_mib == 50_000 and p.pool_nodes == 1
    assert {a.action for a in p.actions} <= {"Suspend", "ScaleDown"}
    assert p.caps[("serving", "tts")] == 4  # 80% of 50,000 over 10,000 per replica
    assert p.job_running[("batch", "a")] is False  # 20% = 10,000 cannot hold a's 20,000


def test_pool_growing_raises_caps_once_there_is_room():
    online = [tts(wanted=20, cap=8, pods=8)]
    p = plan(POLICY, online, [], POOL + [PoolNode("n3", 100_000)], DAYTIME)
    assert p.pool_mib == 200_000
    assert p.caps[("serving", "tts")] == 16
    assert kinds(p) == [("ScaleUp", "tts")]


def test_empty_pool_caps_everything_to_zero():
    p = plan(POLICY, [tts(wanted=3, cap=3, pods=3)], [job("a")], [], DAYTIME)
    assert p.pool_mib == 0
    assert p.caps[("serving", "tts")] == 0
    assert p.job_running[("batch", "a")] is False


def test_partial_scale_up_while_pods_still_terminate():
    # Night -> day: b was just suspended and its pod is still there; tts may grow by one only.
    online = [tts(wanted=10, cap=6, pods=6)]
    offline = [job("b", running=False, pods=1, per=10_000, priority=1), job("a", priority=5, per=10_000)]
    pool = [PoolNode("n", 80_000)]
    p = plan(POLICY, online, offline, pool, DAYTIME)
    # online budget 64,000 -> target 6; offline 16,000 -> a only. Nothing to grow here;
    # use a bigger wanted share to force the deferred case:
    policy = GPUSharePolicySpec.model_validate({"nodeSelector": {}, "defaultShares": {"online": 80, "offline": 20}})
    p = plan(policy, [tts(wanted=10, cap=4, pods=4)], [job("b", running=False, pods=2, par=2, per=10_000)], pool, DAYTIME)
    assert p.targets[("serving", "tts")] == 6
    assert p.caps[("serving", "tts")] == 6  # 60,000 + b's lingering 20,000 = 80,000: fits exactly
    p = plan(policy, [tts(wanted=10, cap=4, pods=4)], [job("b", running=False, pods=3, par=3, per=10_000)], pool, DAYTIME)
    assert p.caps[("serving", "tts")] == 5 and not p.settled
    assert p.asked_after_mib == 80_000


# --- simulation: the invariant at every step ----------------------------------------


@dataclass
class World:
    """A tiny cluster model: writes take effect at once, pods appear at once when allowed
    (the worst case), and released pods linger for one tick before they are gone."""

    nodes: list[PoolNode]
    online: dict[str, dict] = field(default_factory=dict)  # name -> per, wanted, cap, pods
    jobs: dict[str, dict] = field(default_factory=dict)  # name -> per, par, suspended, pods, priority, finished

    @property
    def pool(self) -> int:
        return sum(n.gpu_memory_mib for n in self.nodes if n.usable)

    def asked(self) -> int:
        # Written independently of the planner's own accounting.
        total = 0
        for m in self.online.values():
            allowed = m["wanted"] if m["cap"] is None else min(m["wanted"], m["cap"])
            total += max(m["pods"], allowed) * m["per"]
        for j in self.jobs.values():
            pods = j["pods"] if j["suspended"] or j["finished"] else max(j["pods"], j["par"])
            total += pods * j["per"]
        return total

    def members(self):
        online = [OnlineMember("ns", n, m["per"], m["wanted"], m["cap"], m["pods"]) for n, m in sorted(self.online.items())]
        offline = [
            OfflineMember("ns", n, j["per"], j["par"], j["suspended"], j["priority"], f"2026-01-01T00:00:{i:02d}Z", j["finished"], j["pods"])
            for i, (n, j) in enumerate(sorted(self.jobs.items()))
        ]
        return online, offline

    def apply(self, action):
        if action.kind == "Job":
            j = self.jobs[action.name]
            j["suspended"] = action.action == "Suspend"
            if not j["suspended"]:
                j["pods"] = max(j["pods"], j["par"])
        else:
            m = self.online[action.name]
            m["cap"] = action.replicas
            m["pods"] = max(m["pods"], min(m["wanted"], m["cap"]))

    def settle(self):
        for m in self.online.values():
            allowed = m["wanted"] if m["cap"] is None else min(m["wanted"], m["cap"])
            m["pods"] = min(m["pods"], allowed)
        for j in self.jobs.values():
            if j["suspended"] or j["finished"]:
                j["pods"] = 0


def _run_day(rng: random.Random, policy, world: World, start: datetime, steps: int, minutes: int):
    now = start
    transitions = set()
    for _ in range(steps):
        # The world changes under the operator: nodes come and go, replicas wanted change, jobs finish.
        event = rng.random()
        if event < 0.08 and len(world.nodes) > 1:
            world.nodes.pop(rng.randrange(len(world.nodes)))
        elif event < 0.16:
            world.nodes.append(PoolNode(f"n{rng.randrange(10**6)}", rng.choice([40_000, 80_000, 143_771])))
        elif event < 0.26:
            name = rng.choice(sorted(world.online))
            world.online[name]["wanted"] = rng.randrange(0, 12)
        elif event < 0.30:
            name = rng.choice(sorted(world.jobs))
            if not world.jobs[name]["suspended"]:
                world.jobs[name]["finished"] = True
        online, offline = world.members()
        before = world.asked()
        p = plan(policy, online, offline, world.nodes, now)
        transitions.add(p.window)
        assert p.asked_before_mib == before
        for action in p.actions:
            asked_prior = world.asked()
            world.apply(action)
            if action.action in ("Suspend", "ScaleDown"):
                assert world.asked() <= asked_prior, f"a release raised what is asked: {action}"
            else:
                # Growth only ever lands within the pool, even when a shrinking pool left
                # the state over it before this pass.
                assert world.asked() <= world.pool, f"over-commit after {action} at {now}"
        # Every cap written, not only those with actions, keeps the invariant.
        for name, m in world.online.items():
            m["cap"] = p.caps[("ns", name)]
        if before <= world.pool:
            assert world.asked() <= world.pool
        assert world.asked() == p.asked_after_mib
        world.settle()
        now += timedelta(minutes=minutes)
    return transitions


@pytest.mark.parametrize("seed", range(40))
def test_never_over_commits_through_random_days(seed):
    rng = random.Random(seed)
    world = World(nodes=[PoolNode(f"n{i}", rng.choice([80_000, 143_771])) for i in range(rng.randrange(1, 4))])
    for i in range(rng.randrange(1, 4)):
        world.online[f"tts{i}"] = dict(per=rng.choice([8_000, 16_000, 24_000]), wanted=rng.randrange(1, 12), cap=None, pods=0)
    for i in range(rng.randrange(1, 6)):
        world.jobs[f"job{i}"] = dict(
            per=rng.choice([10_000, 20_000, 40_000]), par=rng.randrange(1, 3), suspended=True, pods=0,
            priority=rng.randrange(0, 3), finished=False,
        )
    seen = _run_day(rng, POLICY, world, datetime(2026, 6, 1, 6, tzinfo=UTC), steps=96, minutes=20)
    assert {"day", "night"} <= seen


def test_settles_to_the_window_shares():
    world = World(nodes=list(POOL))
    world.online["tts"] = dict(per=10_000, wanted=10, cap=None, pods=0)
    for i, prio in enumerate([3, 2, 1]):
        world.jobs[f"job{i}"] = dict(per=20_000, par=1, suspended=True, pods=0, priority=prio, finished=False)
    for now, online_pods, running in [(DAYTIME, 8, {"job0"}), (NIGHTTIME, 6, {"job0", "job1"}), (DAYTIME + timedelta(days=1), 8, {"job0"})]:
        for _ in range(3):  # release, then grow once the pods are gone, then steady
            online, offline = world.members()
            p = plan(POLICY, online, offline, world.nodes, now)
            for a in p.actions:
                world.apply(a)
            for name, m in world.online.items():
                m["cap"] = p.caps[("ns", name)]
            world.settle()
        assert world.online["tts"]["pods"] == online_pods
        assert {n for n, j in world.jobs.items() if not j["suspended"]} == running
        assert p.actions == [] and p.settled
