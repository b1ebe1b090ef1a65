"""The engine process's pipes: neither side's writer waits for a slow reader; both keep the order and say
when the pipe broke. The child's engine loop sends chunks through a sender thread (``_Sender``); the
parent's event loop writes requests through a pipe transport (``_LoopWriter``), framed so that the child's
``Connection.recv`` reads them, and reads the chunks itself (``read_frames``), whatever way the frames
are cut into reads."""
from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import pytest

import numpy as np

from chattts_runtime.engines.process import _LoopWriter, _Sender, read_frames


def test_a_sender_does_not_wait_for_a_reader_that_is_not_reading_and_keeps_the_order():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = _Sender(writer)
    payload = b"x" * (256 << 10)  # 64 of these hold 16 MiB: far more than any pipe buffers
    queued = threading.Event()

    def send_all():
        for i in range(64):
            assert sender.send((i, payload))
        queued.set()

    threading.Thread(target=send_all, daemon=True).start()
    # Nothing reads yet: a sender that wrote from the caller's thread would block at the pipe's size.
    assert queued.wait(30), "send() waited for the reader"
    got = [reader.recv() for _ in range(64)]
    assert [i for i, _ in got] == list(range(64))
    assert all(body == payload for _, body in got)
    sender.close()


def test_a_sender_whose_reader_is_gone_says_so():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = _Sender(writer)
    reader.close()
    sender.send(("first", b""))  # queued; the write fails on the sender's thread
    sender.close()  # waits for the thread, which ended at the broken pipe
    assert sender.broken
    assert sender.send(("after", b"")) is False


def _loops():
    loops = [("asyncio", asyncio.new_event_loop)]
    try:
        import uvloop  # the speech server's loop

        loops.append(("uvloop", uvloop.new_event_loop))
    except ImportError:
        pass
    return loops


_NAMED_LOOPS = dict(_loops())
LOOPS = pytest.mark.parametrize("make_loop", list(_NAMED_LOOPS.values()), ids=list(_NAMED_LOOPS))


@LOOPS
def test_the_loop_writer_never_waits_for_the_child_and_its_frames_are_what_recv_reads(make_loop):
    reader, writer_end = multiprocessing.Pipe(duplex=False)
    payload = b"x" * (256 << 10)
    got: list = []

    async def main():
        writer = _LoopWriter()
        await writer.open(writer_end)
        started = time.monotonic()
        for i in range(64):  # 16 MiB while nothing reads: a blocking write would hang here
            assert writer.send((i, payload))
        assert time.monotonic() - started < 5, "send() waited for the reader"
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticking = asyncio.ensure_future(tick())
        drained = asyncio.get_running_loop().run_in_executor(None, lambda: [reader.recv() for _ in range(64)])
        got.extend(await asyncio.wait_for(drained, 60))
        ticking.cancel()
        assert ticks > 0  # the loop ran while the pipe drained
        assert writer.send(("big", b"y" * 100_000))  # more than the pipe holds: the loop writes the rest
        assert await asyncio.to_thread(reader.recv) == ("big", b"y" * 100_000)
        writer.close()

    loop = make_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert [i for i, _ in got] == list(range(64)) and all(body == payload for _, body in got)


@LOOPS
def test_the_loop_writer_whose_child_is_gone_says_so(make_loop):
    reader, writer_end = multiprocessing.Pipe(duplex=False)

    async def main():
        writer = _LoopWriter()
        await writer.open(writer_end)
        reader.close()
        writer.send(("first", b""))  # queued or written: the write fails with EPIPE on the loop
        for _ in range(200):
            if writer.broken:
                break
            await asyncio.sleep(0.01)
        assert writer.broken
        assert writer.send(("after", b"")) is False

    loop = make_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_the_loop_writer_takes_a_message_from_another_thread_onto_its_loop():
    reader, writer_end = multiprocessing.Pipe(duplex=False)

    async def main():
        writer = _LoopWriter()
        await writer.open(writer_end)
        assert await asyncio.to_thread(writer.send, ("from a thread", 1))
        got = await asyncio.to_thread(reader.recv)
        writer.close()
        return got

    assert asyncio.run(main()) == ("from a thread", 1)


def run_reporting_errors(make_loop, main) -> None:
    """Run ``main()`` on a new loop; fail on any error the loop only logged (a protocol callback's)."""
    errors: list = []
    loop = make_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert not errors, errors


@LOOPS
def test_the_loop_reads_every_frame_in_order_small_and_larger_than_the_pipe_then_the_close(make_loop):
    reader_end, writer = multiprocessing.Pipe(duplex=False)
    audio = np.arange(300_000, dtype=np.float32)  # 1.2 MB: many reads of one frame
    sent = [("small", i) for i in range(500)] + [("audio", audio)] + [("after", i) for i in range(3)]
    got: list = []

    async def main():
        closed = asyncio.get_running_loop().create_future()
        transport = await read_frames(reader_end, got.append, lambda: closed.set_result(True))

        def write_all():
            for message in sent:
                writer.send(message)  # Connection.send: what the child's sender writes
            writer.close()

        await asyncio.to_thread(write_all)
        assert await asyncio.wait_for(closed, 30)
        transport.close()

    run_reporting_errors(make_loop, main)
    assert len(got) == len(sent)
    assert got[:500] == sent[:500] and got[501:] == sent[501:]
    assert got[500][0] == "audio" and np.array_equal(got[500][1], audio)


@LOOPS
def test_the_loop_reader_waits_for_the_rest_of_a_frame_cut_anywhere(make_loop):
    """A frame's header and body may arrive in pieces as small as a byte."""
    import os
    import struct

    from multiprocessing.reduction import ForkingPickler

    read_fd, write_fd = os.pipe()
    messages = [("chunks", list(range(i))) for i in range(40)]
    stream = b"".join(struct.pack("!i", len(body)) + body for body in map(ForkingPickler.dumps, messages))
    got: list = []

    class Ends:  # what read_frames takes: a connection's fileno() and close()
        def fileno(self):
            return read_fd

        def close(self):
            os.close(read_fd)

    async def main():
        closed = asyncio.get_running_loop().create_future()
        transport = await read_frames(Ends(), got.append, lambda: closed.set_result(True))
        for at in range(0, len(stream), 7):  # 7-byte writes: headers and bodies split everywhere
            os.write(write_fd, stream[at:at + 7])
            await asyncio.sleep(0)
        os.close(write_fd)
        await asyncio.wait_for(closed, 30)
        transport.close()

    run_reporting_errors(make_loop, main)
    assert got == messages
