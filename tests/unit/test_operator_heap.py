"""Python's garbage collector kept off the operator's latency (core/heap.py): survivors of a
full collection are frozen, a thaw hands them back, every pause is measured."""
from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from chattts_operator.core import heap, metrics


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class Node:
    """A container the collector tracks; two of them pointing at each other are a cycle."""
    other: Node | None = None


@pytest.fixture
def collector_factory():
    """Collectors installed for one test; Python's automatic collections are off meanwhile, so
    only the test's own gc.collect() calls freeze or thaw anything."""
    made: list[heap.HeapCollector] = []
    was_enabled = gc.isenabled()
    gc.disable()

    def make(freeze: bool, thaw_seconds: float = 3600.0) -> heap.HeapCollector:
        collector = heap.HeapCollector(freeze, thaw_seconds)
        collector.install()
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.uninstall()
    gc.unfreeze()  # whatever a failed assertion left frozen goes back to the collector
    if was_enabled:
        gc.enable()
    assert not [cb for cb in gc.callbacks if getattr(cb, "__self__", None) in made]


def test_a_full_collection_freezes_its_survivors_and_only_when_asked(collector_factory):
    gc.unfreeze()
    keep = [Node() for _ in range(1000)]
    collector_factory(freeze=False)
    gc.collect(2)
    assert gc.get_freeze_count() == 0  # off: Python's own behaviour

    gc.collect(1)  # not full: nothing frozen even when on
    on = collector_factory(freeze=True)
    gc.collect(1)
    assert gc.get_freeze_count() == 0
    gc.collect(2)
    assert gc.get_freeze_count() >= len(keep)
    on.uninstall()
    assert gc.get_freeze_count() == 0  # stopping hands everything back


def test_a_cycle_that_dies_while_frozen_is_freed_after_the_thaw(collector_factory):
    gc.unfreeze()
    collector_factory(freeze=True)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle: only the cyclic collector can free it
    holder, cycle = [a], weakref.ref(a)
    del a, b
    gc.collect(2)  # the cycle is live (holder): it survives and is frozen
    assert cycle() is not None and gc.get_freeze_count() > 0
    holder.clear()
    gc.collect(2)
    assert cycle() is not None  # garbage now, but frozen: the collector does not walk it

    gc.unfreeze()  # what run() does every thaw_seconds
    gc.collect(2)
    assert cycle() is None


def test_acyclic_garbage_goes_at_once_even_when_frozen(collector_factory):
    gc.unfreeze()
    collector_factory(freeze=True)
    cache = {"pod": Node()}
    gone = weakref.ref(cache["pod"])
    gc.collect(2)
    assert gc.get_freeze_count() > 0
    cache["pod"] = Node()  # a watch event replaces the cached object: reference counting frees it
    assert gone() is None


def test_pauses_reach_the_metrics_from_the_loop_not_the_callback(collector_factory):
    collector = collector_factory(freeze=True)
    full = sample("chattts_operator_gc_pause_seconds_count", generation="2")
    young = sample("chattts_operator_gc_pause_seconds_count", generation="0")
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    # The callback only queued them.
    assert sample("chattts_operator_gc_pause_seconds_count", generation="2") == full
    assert len(collector.pauses) >= 3
    collector.drain()
    assert sample("chattts_operator_gc_pause_seconds_count", generation="2") - full >= 2
    assert sample("chattts_operator_gc_pause_seconds_count", generation="0") - young >= 1
    assert not collector.pauses


def test_run_drains_and_thaws_on_its_interval(collector_factory, monkeypatch):
    monkeypatch.setattr(heap, "DRAIN_SECONDS", 0.01)
    collector = collector_factory(freeze=True, thaw_seconds=0.05)

    async def scenario() -> list[int]:
        task = asyncio.create_task(collector.run())
        counts = []
        gc.collect(2)
        counts.append(gc.get_freeze_count())
        await asyncio.sleep(0.2)  # past one thaw
        counts.append(gc.get_freeze_count())
        task.cancel()
        return counts

    frozen, thawed = asyncio.run(scenario())
    assert frozen > 0 and thawed == 0
    assert not collector.pauses  # drained on the way
