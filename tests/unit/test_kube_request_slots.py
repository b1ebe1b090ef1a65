"""core/kube.py RequestSlots: the operator's bounded request slots, served by priority."""
from __future__ import annotations

import asyncio

from chattts_operator.core.kube import Priority, RequestSlots


async def _take(slots: RequestSlots, priority: Priority, order: list[str], name: str, hold: asyncio.Event) -> None:
    async with slots.held(priority):
        order.append(name)
        await hold.wait()


def test_a_freed_slot_goes_to_the_oldest_high_priority_waiter_first():
    async def scenario() -> list[str]:
        slots, order, hold = RequestSlots(1), [], asyncio.Event()
        first = asyncio.create_task(_take(slots, Priority.HIGH, order, "holder", hold))
        await asyncio.sleep(0)
        waiters = [asyncio.create_task(_take(slots, p, order, name, hold))
                   for p, name in ((Priority.LOW, "status-1"), (Priority.HIGH, "apply-1"),
                                   (Priority.LOW, "status-2"), (Priority.HIGH, "apply-2"))]
        await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(first, *waiters)
        assert slots.free == 1
        return order

    assert asyncio.run(scenario()) == ["holder", "apply-1", "apply-2", "status-1", "status-2"]


def test_a_cancelled_waiter_neither_keeps_nor_loses_a_slot():
    async def scenario() -> None:
        slots, order, hold = RequestSlots(1), [], asyncio.Event()
        holder = asyncio.create_task(_take(slots, Priority.HIGH, order, "holder", hold))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(_take(slots, Priority.HIGH, order, "cancelled", hold))
        later = asyncio.create_task(_take(slots, Priority.LOW, order, "later", hold))
        await asyncio.sleep(0)
        cancelled.cancel()
        hold.set()
        await asyncio.gather(holder, later)
        assert cancelled.cancelled()
        assert order == ["holder", "later"]
        assert slots.free == 1

    asyncio.run(scenario())


def test_a_waiter_cancelled_as_the_slot_reaches_it_passes_the_slot_on():
    async def scenario() -> None:
        slots, order, hold = RequestSlots(1), [], asyncio.Event()
        hold.set()
        await slots._acquire(Priority.HIGH)  # the one slot, held by this test
        handed = asyncio.create_task(_take(slots, Priority.HIGH, order, "handed", hold))
        later = asyncio.create_task(_take(slots, Priority.LOW, order, "later", hold))
        await asyncio.sleep(0)
        slots._release()  # hands the slot to ``handed``, which is cancelled before it runs
        handed.cancel()
        await later
        assert handed.cancelled()
        assert order == ["later"] and slots.free == 1

    asyncio.run(scenario())
