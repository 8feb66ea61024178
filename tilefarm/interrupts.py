"""A Ctrl-C held back while native extensions load, so that it ends a command with its one line."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Run the block with SIGINT held: one that arrives inside is raised as KeyboardInterrupt when the block ends.

    A KeyboardInterrupt raised inside a C++ extension's initialization (onnx's, whose pybind11 module creates Python
    enums as it loads) cannot unwind through it: a Ctrl-C sent 0.4 s into `tilefarm compile` on a 2-core host busy
    with the test suite aborted the process (exit -6, a traceback from enum's class creation on stderr); 90 more tries
    on an idle or loaded host did not repeat it. Outside the main thread, where no signal handler can be set, the block
    runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if arrived:
        raise KeyboardInterrupt
