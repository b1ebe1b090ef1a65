"""The engine process's pipes: a sender never waits for a slow reader, keeps the order, and says when
the pipe broke (the parent's event loop queues requests to the child through one)."""
from __future__ import annotations

import multiprocessing
import threading

from chattts_runtime.engines.process import _Sender


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
