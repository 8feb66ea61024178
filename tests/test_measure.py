"""Measurement: correct schedules get timed; every kind of bad candidate gets its error code and the next
candidate in the same builder or runner still measures."""

from __future__ import annotations

import ctypes
import subprocess
import threading
import time

import numpy as np
import pytest

from compiler.costs.measure import (
    BUILD,
    BUILD_TIMEOUT,
    INSTANTIATION,
    RUN,
    RUN_TIMEOUT,
    WRONG_ANSWER,
    BuildResult,
    MeasureInput,
    MeasureResult,
    measure,
    to_record,
)
from compiler.costs.records import COLD_WEIGHTS, JSONLinesDatabase
from compiler.schedule.hand_schedules import gemm
from compiler.schedule.state import Split, apply_steps, step_from_record
from compiler.targets import host_target
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner, _serve_builds
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task

N = 64


def matmul_task(n: int = N) -> Task:
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    dag = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
    return Task(dag.workload_key, dag, f"matmul{n}")


TASK = matmul_task()


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(n_parallel=2) as b:
        yield b


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(timeout=2.0, number=2, repeat=2, min_repeat_ms=5, threads=1) as r:
        yield r


@pytest.fixture(scope="module")
def good(builder) -> BuildResult:
    """A correct library kept for the whole module (measure() would delete it)."""
    (b,) = builder.build([MeasureInput(TASK, gemm(TASK.dag).steps)])
    assert b.error is None, b.message
    return b


def run_one(runner: LocalRunner, path: str) -> MeasureResult:
    (res,) = runner.run([MeasureInput(TASK, ())], [BuildResult(path, None, "", 0.0)])
    return res


def test_correct_schedules_are_timed(builder, runner):
    inputs = [MeasureInput(TASK, gemm(TASK.dag).steps), MeasureInput(TASK, default_schedule(TASK.dag).steps)]
    results = measure(inputs, builder, runner)
    for r in results:
        assert r.ok and r.error is None, r.message
        assert len(r.costs) == 2 and all(0 < c < 0.01 for c in r.costs)
        assert r.mean_cost == sum(r.costs) / 2
        assert r.build_seconds > 0 and r.run_seconds > 0
    assert not list(builder.workdir.iterdir())  # measure() removed the libraries it built


def test_illegal_steps_are_instantiation_errors(builder, runner):
    steps = (*gemm(TASK.dag).steps[:2], Split(99, 0, (4,), True))
    (r,) = measure([MeasureInput(TASK, steps)], builder, runner)
    assert r.error == INSTANTIATION and not r.ok and r.mean_cost == float("inf")
    assert "step 2" in r.message and r.costs == ()


C_MATMUL = """
int tilefarm_num_threads = 0;
void kernel(const float* a, const float* b, float* c) {
    BEFORE
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < N; k++) s += a[i * N + k] * b[k * N + j];
            if (i * N + j < LIMIT) c[i * N + j] = s * SCALE;
        }
}
"""


def c_library(tmp_path, name: str, before: str = "", limit: int = N * N, scale: str = "1.0f") -> str:
    """A kernel library written in C with the candidates' ABI: `kernel(A, B, C)` and `tilefarm_num_threads`."""
    src = tmp_path / f"{name}.c"
    src.write_text(C_MATMUL.replace("BEFORE", before).replace("LIMIT", str(limit)).replace("SCALE", scale))
    lib = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", f"-DN={N}", "-o", str(lib), str(src)], check=True)
    return str(lib)


BAD_KERNELS = {
    "segfault": ({"before": "*(volatile int*)0 = 0;"}, RUN, "SIGSEGV"),
    "abort": ({"before": "__builtin_abort();"}, RUN, "SIGABRT"),
    "illegal_instruction": ({"before": "__builtin_trap();"}, RUN, "SIGILL"),
    "hang": ({"before": 'for (;;) { __asm__ volatile(""); }'}, RUN_TIMEOUT, "no answer within 2 s"),
    "wrong_values": ({"scale": "1.01f"}, WRONG_ANSWER, "largest error"),
    "unwritten_element": ({"limit": N * N - 1}, WRONG_ANSWER, f"output C: 1 of {N * N} elements differ"),
}


@pytest.mark.parametrize("kind", BAD_KERNELS)
def test_bad_kernels_fail_and_the_runner_recovers(tmp_path, runner, good, kind):
    kwargs, code, says = BAD_KERNELS[kind]
    t0 = time.perf_counter()
    r = run_one(runner, c_library(tmp_path, kind, **kwargs))
    assert r.error == code and says in r.message, r.message
    assert time.perf_counter() - t0 < runner.timeout + 1.5
    after = run_one(runner, good.path)
    assert after.ok, after.message


def test_a_correct_c_kernel_passes_the_check(tmp_path, runner):
    # another summation order than the default schedule's, and plain C: the check is not bit-exact
    r = run_one(runner, c_library(tmp_path, "correct"))
    assert r.ok, r.message


def test_unloadable_libraries_are_run_errors(tmp_path, runner, good):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    nosym = tmp_path / "nosym.c"
    nosym.write_text("int tilefarm_num_threads = 0; void other(void) {}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "nosym.so"), str(nosym)], check=True)
    for path in (junk, tmp_path / "nosym.so", tmp_path / "missing.so"):
        r = run_one(runner, str(path))
        assert r.error == RUN and "cannot load" in r.message, r.message
    assert run_one(runner, good.path).ok


def test_build_timeout_kills_the_build_and_the_builder_goes_on(builder):
    big = matmul_task(256)
    inp = MeasureInput(big, gemm(big.dag).steps)
    old = builder.timeout
    builder.timeout = 0.02  # lowering and LLVM take ~100 ms: this build cannot finish in time
    try:
        t0 = time.perf_counter()
        (b,) = builder.build([inp])
        assert b.error == BUILD_TIMEOUT and b.path is None and "0.02 s" in b.message
        assert time.perf_counter() - t0 < 1.0
    finally:
        builder.timeout = old
    builds = builder.build([inp, inp, MeasureInput(big, (Split(7, 0, (2,), True),))])
    assert [b.error for b in builds] == [None, None, INSTANTIATION]
    assert builds[0].path != builds[1].path


def test_a_build_process_that_dies_is_a_build_error_and_is_replaced(builder):
    big = matmul_task(256)
    inp = MeasureInput(big, gemm(big.dag).steps)
    builder.build([inp])  # both workers exist and are idle
    victims = [w.proc for w in builder._workers]
    killer = threading.Timer(0.03, lambda: [p.kill() for p in victims])  # mid-build: a 256^3 build takes ~100 ms
    killer.start()
    (b,) = builder.build([inp])
    killer.join()
    assert b.error == BUILD and "SIGKILL" in b.message, b.message
    (b,) = builder.build([inp])
    assert b.error is None, b.message


def test_integer_outputs_are_checked_exactly(builder, runner):
    A = te.placeholder((8, 128), "int32", name="A")
    B = te.placeholder((8, 128), "int32", name="B")
    dag = ComputeDAG([A, B, te.compute((8, 128), lambda i, j: A[i, j] * B[i, j] + A[i, j], name="D")])
    task = Task(dag.workload_key, dag, "int_fma")
    (r,) = measure([MeasureInput(task, default_schedule(dag).steps)], builder, runner)
    assert r.ok, r.message


def test_number_grows_until_a_repeat_lasts_min_repeat_ms(good):
    with LocalRunner(number=1, repeat=2, min_repeat_ms=50, threads=1) as r:
        res = run_one(r, good.path)
    assert res.ok, res.message
    # one call takes microseconds; only many calls per repeat can fill 2 x 50 ms
    assert res.run_seconds >= 0.1
    assert all(c < 0.005 for c in res.costs)


class _FakeKernel:
    """A kernel whose calls advance a fake clock by the next of `durations` (the last repeats)."""

    def __init__(self, *durations: float):
        self.now, self.calls, self.durations = 0.0, 0, durations

    def clock(self) -> float:
        return self.now

    def __call__(self, *ptrs) -> None:
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1


@pytest.fixture
def fake_kernel(monkeypatch):
    from types import SimpleNamespace

    from compiler.targets.cpu import sandbox as measure_worker

    def make(*durations: float) -> _FakeKernel:
        k = _FakeKernel(*durations)
        monkeypatch.setattr(measure_worker, "time", SimpleNamespace(perf_counter=k.clock))
        return k

    return make


def test_a_batch_times_calls_until_they_fill_min_repeat_ms(fake_kernel):
    from compiler.targets.cpu.sandbox import timed_repeats

    d = 2**-9  # ~1.95 ms, exact in binary: the sums below are exact
    k = fake_kernel(d)
    costs, number = timed_repeats(k, [], number=3, repeat=2, min_s=0.1, before=None, warm_s=d)
    # untimed calls until they and the check call have run a tenth of the window (10 ms: 4 + 1 calls), then two
    # batches of the 52 calls that first reach 100 ms: a batch that falls short goes on rather than starting over
    assert number == 52 and k.calls == 5 + 2 * 52
    assert costs == pytest.approx([d, d])


def test_a_slow_check_call_is_warm_up_enough(fake_kernel):
    from compiler.targets.cpu.sandbox import timed_repeats

    k = fake_kernel(0.04)
    costs, number = timed_repeats(k, [], number=1, repeat=1, min_s=0.1, before=None, warm_s=0.04)
    assert (number, k.calls) == (3, 3) and costs == pytest.approx([0.04])


def test_a_batch_runs_at_least_number_calls_but_stops_at_the_overshoot(fake_kernel):
    from compiler.targets.cpu.sandbox import OVERSHOOT, timed_repeats

    k = fake_kernel(0.001)
    costs, number = timed_repeats(k, [], number=200, repeat=1, min_s=0.1, before=None, warm_s=1.0)
    assert number == 200 and costs == pytest.approx([0.001])
    # a kernel that turns 100x slower after planning: the batch ends once its calls took OVERSHOOT x min_repeat_ms
    k = fake_kernel(0.001, 0.001, 0.1)
    costs, number = timed_repeats(k, [], number=100, repeat=1, min_s=0.1, before=None, warm_s=1.0)
    assert number == 5 and sum(costs) * number == pytest.approx(OVERSHOOT * 0.1 + 0.002)


def test_without_min_repeat_ms_each_batch_is_number_calls_each_prepared(fake_kernel):
    from compiler.targets.cpu.sandbox import timed_repeats

    k = fake_kernel(0.003)
    flushes = []
    costs, number = timed_repeats(
        k, [], number=1, repeat=3, min_s=0.0, before=lambda: flushes.append(k.calls), warm_s=0.003
    )
    assert number == 1 and k.calls == 3 and flushes == [0, 1, 2]
    assert costs == pytest.approx([0.003] * 3)


def test_cache_flush_times_single_calls(good):
    with LocalRunner(repeat=3, cache_flush=True, threads=1) as r:
        assert (r.number, r.min_repeat_ms) == (1, 0)
        assert r.flush_bytes >= 2 * (host_target().l3_bytes or 0)
        res = run_one(r, good.path)
    assert res.ok and len(res.costs) == 3, res.message


def test_records_round_trip_and_replay(tmp_path):
    target = host_target()
    steps = gemm(TASK.dag).steps
    ok = MeasureResult((1e-5, 2e-5), None, "", 0.1, 0.2)
    bad = MeasureResult((), WRONG_ANSWER, "output 0 differs", 0.1, 0.2)
    records = [to_record(MeasureInput(TASK, steps), ok, target), to_record(MeasureInput(TASK, steps[:3]), bad, target)]
    db = JSONLinesDatabase(tmp_path / "records.jsonl")
    assert db.import_records(records) == 2
    again = JSONLinesDatabase(tmp_path / "records.jsonl")
    assert list(again) == records
    (best,) = again.best(TASK.key, records[0].target, target.fingerprint())
    assert best == records[0] and best.mean_cost == pytest.approx(1.5e-5)
    assert apply_steps(TASK.dag, [step_from_record(s) for s in best.steps]).steps == steps
    assert records[1].error == WRONG_ANSWER and not records[1].ok


def test_measured_arrays_start_on_a_cache_line():
    from compiler.base.arrays import ALIGN, aligned, aligned_empty

    out = aligned_empty((5, 7), np.float32)
    assert out.ctypes.data % ALIGN == 0 and out.flags.c_contiguous and out.shape == (5, 7) and out.dtype == np.float32
    for a in (np.arange(37, dtype=np.float32).reshape(37, 1), np.zeros((2, 3), np.int64), np.ones(1, np.float64)):
        b = aligned(a)
        assert b.ctypes.data % ALIGN == 0 and b.flags.c_contiguous and b.dtype == a.dtype
        np.testing.assert_array_equal(b, a)


def test_with_cold_constants_the_weights_are_flushed_before_every_timed_call(builder, tmp_path, monkeypatch):
    """The runner sends the task's constant inputs (here B, as a model's weight) for eviction; the sandbox flushes
    their cache lines before each call, and the candidate still checks and times."""
    from compiler.targets.cpu import sandbox as measure_worker

    task = Task(TASK.key, TASK.dag, TASK.name, constants=(1,))
    with LocalRunner(timeout=5.0, number=2, repeat=2, min_repeat_ms=5, threads=1, cold_constants=True) as cold:
        assert cold._task_fields(task)["evict"] == [1] and cold._task_fields(TASK)["evict"] == []
        inp = MeasureInput(task, gemm(task.dag).steps)
        results = measure([inp], builder, cold)
        assert results[0].ok, results[0].message
        assert cold.cache == results[0].cache == to_record(inp, results[0], host_target()).cache == COLD_WEIGHTS
        lib = cold._evict_lib
        # what the sandbox does, in this process: flushing writes dirty lines back, so data never changes
        flushed: list[tuple[int, int]] = []
        evictor = measure_worker._evictors.setdefault(lib, ctypes.CDLL(lib))
        evictor.tilefarm_evict.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        real = evictor.tilefarm_evict
        a = measure_worker.aligned(np.arange(1000, dtype=np.float32))
        real(a.ctypes.data, a.nbytes)
        np.testing.assert_array_equal(a, np.arange(1000, dtype=np.float32))

        class Data:
            inputs = [a, measure_worker.aligned(np.ones(16, np.float32))]

        monkeypatch.setattr(evictor, "tilefarm_evict", lambda p, n: flushed.append((p, n)))
        prepare = measure_worker._cache_preparation({"evict": [0], "evict_lib": lib}, Data)
        prepare()
        prepare()
        assert flushed == [(a.ctypes.data, a.nbytes)] * 2
    assert measure_worker._cache_preparation({"evict": [], "flush_bytes": 0}, Data) is None


def test_tasks_know_which_inputs_are_model_constants():
    from compiler.model.onnx_import import load
    from compiler.tensor.tasks import constant_bytes, plan_tasks, weights_arrive_cold
    from tilefarm.examples import resnet18

    tasks, calls, _ = plan_tasks(load(resnet18()))
    for t in tasks:
        consts = [
            {i for i, v in enumerate(c.args[: len(t.dag.inputs)]) if v.const is not None} for c in calls if c.task is t
        ]
        assert set(t.constants) == set.intersection(*consts)
    conv = next(t for t in tasks if t.name == "fused_blockedconv_add_relu")
    assert [conv.dag.inputs[i] for i in conv.constants] == [n for n in conv.dag.inputs if "_bn_" in n or "bias" in n]
    assert len(conv.constants) == 2  # the weight and the bias; the data and the residual are activations
    # ResNet-18's weights (75.1 MB: 46.8 MB of them as trained, 3x3 weights grown by the Winograd transform) exceed
    # a 32 MiB L3, so a run meets them cold; a 128 MiB cache would hold them
    assert 75e6 < constant_bytes(calls) < 75.2e6
    assert weights_arrive_cold(calls, 32 << 20) and not weights_arrive_cold(calls, 128 << 20)


def test_auto_times_weights_cold_where_this_host_does_not_keep_them_cached(monkeypatch):
    from compiler.model.onnx_import import load
    from compiler.search.task_scheduler import weights_timed_cold
    from compiler.targets import cpu
    from compiler.targets.cpu import cache_probe
    from compiler.tensor.tasks import constant_bytes, plan_tasks
    from tilefarm.examples import tiny_cnn

    _, calls, _ = plan_tasks(load(tiny_cnn()))
    probed = []

    def keeps(nbytes: int, kept: bool) -> bool:
        probed.append(nbytes)
        return kept

    # the weights fit the reported cache: the measured re-read decides
    monkeypatch.setattr(cpu.BACKEND, "keeps_cached", lambda n: keeps(n, True))
    assert not weights_timed_cold("auto", calls, 1 << 30)
    monkeypatch.setattr(cpu.BACKEND, "keeps_cached", lambda n: keeps(n, False))
    assert weights_timed_cold("auto", calls, 1 << 30)
    assert probed == [constant_bytes(calls)] * 2
    # measured only where this host is of the class that times the kernels (a farm's search host may not be)
    assert not weights_timed_cold("auto", calls, 1 << 30, probe=False) and len(probed) == 2
    # over the reported cache they are cold without a measurement; "warm" and "cold" are taken as said
    assert weights_timed_cold("auto", calls, 1) and probed == [constant_bytes(calls)] * 2
    assert not weights_timed_cold("warm", calls, 1) and weights_timed_cold("cold", calls, 1 << 30)
    assert len(probed) == 2
    # measured: a buffer that fits every host's L2 re-reads far faster than from memory once flushed
    ratio = cache_probe.reread_ratio(256 << 10)
    assert ratio is not None and 0 < ratio < cache_probe.CACHED_RATIO and cache_probe.keeps_cached(256 << 10)
    # weights that fit a core's private cache are not measured: reads of a few bytes are too short to time
    monkeypatch.setattr(cache_probe, "reread_ratio", lambda n: probed.append(n) or 1.0)
    assert cache_probe.keeps_cached(cache_probe.PRIVATE_CACHE_BYTES) and len(probed) == 2
    assert not cache_probe.keeps_cached(cache_probe.PRIVATE_CACHE_BYTES + 1) and len(probed) == 3


def test_a_build_worker_whose_tuning_process_is_gone_exits_quietly(capfd):
    # the tuning process killed or interrupted: its end of the pipe closes, and the worker returns without the
    # EOFError traceback it printed before (one per worker on a Ctrl-C of `tilefarm tune`)
    import multiprocessing

    parent, child = multiprocessing.Pipe()
    parent.close()
    _serve_builds(child)
    assert capfd.readouterr().err == ""
