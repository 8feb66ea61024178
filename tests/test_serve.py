"""`tilefarm serve` supervises its workers: one that dies (killed, crashed) is restarted after a delay that doubles
while it keeps dying, and each death and restart is said. Stand-in processes play the workers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from tilefarm.serve import supervise


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_dead_worker_is_restarted_and_said(capsys):
    procs = [_sleeper(), _sleeper()]
    spawned: list[int] = []

    def respawn(i: int) -> subprocess.Popen:
        spawned.append(i)
        return _sleeper()

    stopping = threading.Event()
    thread = threading.Thread(target=supervise, args=(procs, ["search", "measure0"], respawn, stopping, (0.2, 1.0)))
    thread.start()
    try:
        first = procs[1]
        first.kill()  # kill -9 of a measure worker
        _wait_for(lambda: procs[1] is not first and procs[1].poll() is None)
        assert spawned == [1] and procs[0].poll() is None  # the other worker untouched
        second = procs[1]
        second.kill()  # it dies again: the next restart waits longer
        t = time.monotonic()
        _wait_for(lambda: procs[1] is not second)
        assert time.monotonic() - t >= 0.35 and spawned == [1, 1]
    finally:
        stopping.set()
        thread.join()
        for p in procs:
            p.kill()
            p.wait()
    err = capsys.readouterr().err
    assert f"worker measure0 (pid {first.pid}) exited with code -9; restarting it in 0 s" in err
    assert f"worker measure0 restarted (pid {second.pid})" in err
