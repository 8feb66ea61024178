"""What a long command shows as it works: `tune`'s bar and per-task table redrawn in place in a terminal (driven
through a pseudo-terminal), plain lines into a file; a budget too small for every task's first round said first; a
download's bytes."""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import httpx

from tilefarm import examples, progress
from tilefarm.remote import Client

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
REDRAW = "\x1b[1A\x1b[2K"  # cursor up a line, erase it: rich redrawing its frame in place
# a small budget for CI: a few short rounds of the small example model; 5 tasks of 4 trials each would take 20
TUNE = ["--trials", "12", "--per-round", "4", "--population", "16", "--retime-best", "0", "--threads", "1"]


def _tune(tmp_path, records: str) -> list[str]:
    examples.save("tiny_cnn", tmp_path / "m.onnx")
    return [sys.executable, "-m", "tilefarm.cli", "tune", str(tmp_path / "m.onnx"), *TUNE, "--output", records]


def _in_terminal(argv: list[str], cwd, rows: int = 50, cols: int = 120, timeout_s: float = 300) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal of rows x cols as its stdin, stdout and stderr; (exit code, all it wrote)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR")}
    env = {k: v for k, v in env.items() if not k.startswith("TTY_")} | {"TERM": "xterm-256color"}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every writer of the terminal has closed it
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def test_tune_in_a_terminal_redraws_its_bar_and_task_table(tmp_path):
    code, out = _in_terminal(_tune(tmp_path, "r.json"), tmp_path)
    assert code == 0, out[-3000:]
    assert out.count(REDRAW) > 10  # frames redrawn in place, not appended
    frames = ANSI.sub("", out)
    # the bar's fields: trials done of the budget, elapsed, ETA, the current estimate
    bar = re.findall(r"tuning \S+ (\d+)/12 trials elapsed (\d+:\d\d:\d\d) (ETA \S+|re-timing the fastest) (.*)", frames)
    assert bar, frames[-3000:]
    done = [int(b[0]) for b in bar]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 12
    assert any(b[2].startswith("ETA 0:") for b in bar) and all("best estimate" in b[3] for b in bar)
    # the per-task table under it, refreshed as rounds end
    assert re.search(r"ID +task +MFLOP +weight +GFLOP/s +latency ms +trials +done", frames)
    assert re.search(r"\n +0 +fused_conv_relu +[\d.]+ +1 +[\d.]+ +[\d.]+ +4 ", frames), frames[-3000:]
    assert "round 1:" not in frames  # no plain lines on a terminal
    assert "estimated end-to-end latency" in frames  # the final table, printed once the bar is gone


def test_tune_into_a_file_writes_plain_lines(tmp_path):
    with open(tmp_path / "log", "w") as log:
        done = subprocess.run(
            _tune(tmp_path, "r.json"), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, timeout=300
        )
    out = (tmp_path / "log").read_text()
    assert done.returncode == 0, out[-3000:]
    assert "\x1b[" not in out  # no cursor movement nor colour in a log
    # said before tuning: the trials one round per task takes, and what becomes of the tasks left out
    assert re.search(r"note: 12 trials do not give every task its first round: .* takes 20 trials", out)
    assert "keeps its default schedule when compiled" in out
    rounds = re.findall(r"^round (\d+): (\d+)/12 trials, elapsed \d+:\d\d:\d\d, ETA \S+, (.*)$", out, re.M)
    assert [int(r[0]) for r in rounds] == list(range(1, len(rounds) + 1)) and int(rounds[-1][1]) == 12
    assert all(r[2].startswith("best estimate") for r in rounds)
    # the end: the estimate, or why there is none and how to get one
    assert "no end-to-end estimate: " in out and "--resume --trials" in out


def test_budget_note_says_what_the_first_rounds_need():
    assert progress.budget_note([33, 16, 22], [1, 1, 0], 100) is None
    assert progress.budget_note([64], [1], 16) is None  # one task, a short first round: still measured
    note = progress.budget_note([33, 16, 22, 0], [1, 1, 0, 2], 40)
    assert "3 tasks to measure (2 of the model's, 1 other forms of its convs) takes 71 trials" in note
    assert "about 2 tasks are measured" in note and "a conv form never measured is not taken" in note


def test_download_shows_its_bytes(tmp_path, monkeypatch):
    body = os.urandom(3 << 20)

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"X-Checksum-SHA256": hashlib.sha256(body).hexdigest()}, content=body)

    c = Client("http://farm")
    c.http = httpx.Client(base_url="http://farm/api/v1", transport=httpx.MockTransport(serve))
    seen = []
    got = c.download(7, tmp_path / "a.tar", lambda done, total: seen.append((done, total)))
    assert got["size_bytes"] == len(body) and seen[-1] == (len(body), len(body))
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    log = io.StringIO()
    with progress.download_progress("artifact 7", log) as show:
        show(1 << 20, 3 << 20)
        show(3 << 20, 3 << 20)
    assert log.getvalue().splitlines() == ["artifact 7: 1.0 MiB of 3.0 MiB", "artifact 7: 3.0 MiB of 3.0 MiB"]
