"""The cuda target kind end to end without a GPU: target strings, the CUDA backend's search space and builder, `tilefarm
compile --target cuda` artifacts whose every PTX ptxas accepts, and the clear refusals to measure or run CUDA code
on a host without the NVIDIA driver (issue 51)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import tarfile

import numpy as np
import pytest

from compiler.artifact.runtime import Artifact, ArtifactError
from compiler.base.errors import InvalidProgram, InvalidTarget, MissingExtra
from compiler.costs.measure import INSTANTIATION, MeasureInput
from compiler.costs.records import target_name
from compiler.model.onnx_import import load
from compiler.schedule.state import Split
from compiler.search.evolution import SearchParams
from compiler.targets import BACKENDS, backend_for, check_runs_here, parse_target
from compiler.targets.cuda import ptx
from compiler.targets.cuda import target as cuda_target
from compiler.targets.cuda.driver import NoCudaDriver
from compiler.tensor.tasks import plan_tasks
from tilefarm.cli import main
from tilefarm.examples import save


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


HAS_DRIVER = _has_driver()


@pytest.fixture(scope="module")
def ptxas():
    try:
        return ptx.find_ptxas()
    except MissingExtra as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "encoder.onnx"
    save("encoder", path)
    return path


# ---------------------------------------------------------------------------------------------- target strings


@pytest.mark.parametrize(
    "text, arch",
    [("cuda", "sm_90"), ("cuda -arch=sm_80", "sm_80"), ("CUDA -arch sm_90", "sm_90"), ("cuda --arch=sm_80", "sm_80")],
)
def test_cuda_target_strings(text, arch):
    t = parse_target(text)
    assert (t.kind, t.mcpu, t.triple) == ("cuda", arch, "nvptx64-nvidia-cuda")
    assert backend_for(t) is BACKENDS["cuda"]


def test_the_fingerprint_depends_on_the_arch():
    sm80, sm90 = parse_target("cuda -arch=sm_80"), parse_target("cuda")
    assert (
        sm80.fingerprint() != sm90.fingerprint()
        and sm90.fingerprint() == parse_target("cuda -arch=sm_90").fingerprint()
    )
    assert sm90.fingerprint() != parse_target("llvm").fingerprint()


@pytest.mark.parametrize(
    "text, says",
    [
        ("cuda -arch=sm_70", r"-arch=sm_70 is not supported; choose -arch=sm_80\|sm_90"),
        ("cuda -arch=", r"-arch=\(empty\) is not supported; choose -arch=sm_80\|sm_90"),
        ("cuda -mcpu=sm_90", r"option -mcpu is not supported; a cuda target takes -arch=sm_80\|sm_90"),
        ("cuda -arch=sm_80 -arch=sm_90", r"-arch is given twice"),
        ("cuda sm_90", r"'sm_90' is not an option"),
        ("rocm", r"target kind 'rocm' is not supported: .*NVIDIA GPUs \(cuda \[-arch=sm_80\|sm_90\]\)"),
    ],
)
def test_bad_cuda_targets_are_refused_naming_the_choices(text, says):
    with pytest.raises(InvalidTarget, match=says):
        parse_target(text)


def test_cuda_code_runs_only_where_the_driver_loads(monkeypatch):
    def no_driver():
        raise NoCudaDriver("no CUDA driver on this host: cannot load libcuda.so.1")

    monkeypatch.setattr(cuda_target, "load_libcuda", no_driver)
    with pytest.raises(InvalidTarget, match=r"^no CUDA driver on this host: tuning for cuda -arch=sm_80 needs a GPU"):
        check_runs_here(parse_target("cuda -arch=sm_80"))
    monkeypatch.setattr(cuda_target, "load_libcuda", lambda: object())
    check_runs_here(parse_target("cuda"))


# ---------------------------------------------------------------------------------------------- search space, builder


def test_search_space_samples_mutates_and_replays_gpu_programs(encoder):
    target = parse_target("cuda")
    backend = backend_for(target)
    tasks, _, _ = plan_tasks(load(encoder))
    gemm = next(t for t in tasks if "matmul" in t.name)
    space = backend.search_space(gemm.dag, target, SearchParams())
    assert [sk.shared for sk in space.sketches] == [True, False]
    assert all(r.startswith(("multi_level_tile(", "bind_flat(")) for r in space.sketches[0].rules)
    rng = np.random.default_rng(0)
    made = 0
    for _ in range(12):
        k = int(rng.integers(len(space.sketches)))
        try:
            d, state = space.sample(k, rng)
        except InvalidProgram as e:
            assert "the device allows" in str(e)
            continue
        made += 1
        assert "threadIdx.x" in str(state) and "blockIdx.x" in str(state)
        assert space.materialize(k, space.decisions_from_json(json.loads(json.dumps(d.to_json())))) == state
        child = space.mutate(k, d, state, rng)
        assert child is not None and child.block == d.block
        renamed = space.rename_stages(d, lambda n: f"x_{n}")
        assert renamed is not None and all(n.startswith("x_") for n, _, _ in renamed.tiles)
    assert made >= 6


def test_builder_assembles_candidates_and_keeps_ptxas_reports(encoder, ptxas):
    target = parse_target("cuda -arch=sm_80")
    backend = backend_for(target)
    tasks, _, _ = plan_tasks(load(encoder))
    gemm = next(t for t in tasks if "matmul" in t.name)
    state = backend.default_schedule(gemm.dag, target)
    broken = tuple(s for s in state.steps if not isinstance(s, Split))  # splits gone, annotations refer to nothing
    with backend.builder(target=target, n_parallel=2) as builder:
        good, bad = builder.build([MeasureInput(gemm, state.steps), MeasureInput(gemm, broken)])
    assert good.error is None and good.path and good.reports, good.message
    assert all(r.arch == "sm_80" and r.registers > 0 for r in good.reports)
    assert "registers" in good.message
    assert bad.error == INSTANTIATION and bad.path is None


# ---------------------------------------------------------------------------------------------- compile, run, tune


@pytest.mark.parametrize(
    "model, options",
    [
        ("encoder", []),
        ("mobilenetv2", []),
        # Winograd's transform stages share their matrix (one shared-memory cache of it); 10-20 s on 2 cores
        pytest.param("resnet18", [], marks=pytest.mark.slow),
        ("resnet18", ["--disable-pass", "winograd_convs"]),  # the direct convs
    ],
)
def test_compile_for_cuda_writes_ptx_that_ptxas_accepts(model, options, tmp_path, ptxas, capsys):
    onnx_path, tar_path = tmp_path / f"{model}.onnx", tmp_path / f"{model}.tar"
    save(model, onnx_path)
    assert main(["compile", str(onnx_path), "--target", "cuda", "-o", str(tar_path), *options]) == 0
    with tarfile.open(tar_path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    meta = json.loads(files["meta.json"])
    assert meta["target"]["kind"] == "cuda" and meta["target"]["mcpu"] == "sm_90"
    assert parse_target(meta["target"]["name"]) == parse_target("cuda -arch=sm_90")
    assert meta["requires"] == {"cuda_arch": "sm_90"}
    assert meta["library"] == f"{model}.so" and files[meta["library"]].startswith(b"\x7fELF")  # the host entry
    launches = json.loads(files[f"{model}.launches.json"])
    assert launches["arch"] == "sm_90" and len(files[launches["params"]]) == meta["params_bytes"]
    assert set(meta["sha256"]) == set(files) - {"meta.json"}
    # the plan: every call's kernel has its launches, each with its grid, block and files
    assert {c["kernel"] for c in meta["calls"]} <= set(launches["kernels"])
    ptx_files = []
    for kernel in launches["kernels"].values():
        for launch in kernel["launches"]:
            assert min(launch["grid"]) >= 1 and 1 <= np.prod(launch["block"]) <= 1024
            assert launch["cubin"] in files and launch["ptxas"]["spill_store_bytes"] >= 0
            ptx_files.append((launch["name"], files[launch["ptx"]].decode()))
    assert len(ptx_files) >= len(meta["tasks"])
    for name, text in ptx_files:
        _, report = ptx.assemble(text, name, "sm_90")
        assert report.shared_bytes <= 48 * 1024, report


@pytest.mark.skipif(HAS_DRIVER, reason="this host has a CUDA driver")
def test_a_cuda_artifact_refuses_to_run_here_in_one_line(encoder, tmp_path, ptxas, capsys):
    tar_path = tmp_path / "enc.tar"
    assert main(["compile", str(encoder), "--target", "cuda -arch=sm_80", "-o", str(tar_path)]) == 0
    says = "no CUDA driver on this host"
    with pytest.raises(ArtifactError, match=f"holds CUDA kernels for sm_80.*{says}"):
        Artifact.load(tar_path)
    capsys.readouterr()
    assert main(["run", str(tar_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: artifact") and says in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(HAS_DRIVER, reason="this host has a CUDA driver")
def test_tune_for_cuda_builds_then_refuses_to_measure(encoder, tmp_path, ptxas, capsys, monkeypatch):
    from compiler.targets.cuda.measure import CudaBuilder

    built = []
    build = CudaBuilder.build

    def counting(self, inputs):
        results = build(self, inputs)
        built.extend(results)
        return results

    monkeypatch.setattr(CudaBuilder, "build", counting)
    records = tmp_path / "records.jsonl"
    args = ["tune", str(encoder), "--target", "cuda", "--trials", "4", "--per-round", "4", "-o", str(records)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: no CUDA driver on this host: tuning for cuda -arch=sm_90 needs a GPU worker (a machine with an "
        "NVIDIA GPU and its driver, libcuda.so.1); compiling for cuda works here"
    )
    assert built and all(b.error is None and b.reports for b in built), [b.message for b in built]


def test_the_cpu_artifact_is_unchanged(tmp_path, capsys):
    onnx_path, tar_path = tmp_path / "tiny.onnx", tmp_path / "tiny.tar"
    save("tiny_cnn", onnx_path)
    assert main(["compile", str(onnx_path), "-o", str(tar_path)]) == 0
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile("meta.json").read())
    assert names == ["meta.json", "tiny.so", "tiny.h"] and meta["library"] == "tiny.so"
    assert meta["target"]["kind"] == "cpu" and "cuda_arch" not in meta["requires"]
    x = np.random.default_rng(0).standard_normal(meta["inputs"][0]["shape"]).astype(np.float32)
    out = Artifact.load(tar_path).run({meta["inputs"][0]["name"]: x})
    assert all(np.isfinite(v).all() for v in out.values())


# ---------------------------------------------------------------------------------------------- the host entry

FAKE_LIBCUDA = r"""
/* A stand-in for libcuda.so.1: memory is host memory, a launch runs nothing but is logged (kernel, grid, block,
   and per argument which allocation it points into and at what offset) to the file FAKE_CUDA_LOG names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef unsigned long long CUdeviceptr;
static struct { char* base; size_t size; } allocs[4096];
static int n_allocs;
static FILE* log_file(void) { static FILE* f; if (!f) f = fopen(getenv("FAKE_CUDA_LOG"), "w"); return f; }
int cuInit(unsigned flags) { return flags != 0; }
int cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int d) { *ctx = (void*)0x1; return d != 0; }
int cuCtxSetCurrent(void* ctx) { return ctx == 0; }
int cuModuleLoadData(void** m, const void* image) {
  const char* p = image;
  if (memcmp(p, "\177ELF", 4) != 0 && strstr(p, ".entry") == 0) return 200; /* CUDA_ERROR_INVALID_IMAGE */
  *m = (void*)image; return 0;
}
int cuModuleGetFunction(void** f, void* m, const char* name) { (void)m; *f = strdup(name); return 0; }
int cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  allocs[n_allocs].base = calloc(1, n); allocs[n_allocs].size = n;
  *p = (CUdeviceptr)allocs[n_allocs++].base; return 0;
}
int cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) { memcpy((void*)d, h, n); return 0; }
int cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) { memcpy(h, (void*)d, n); return 0; }
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
  (void)stream; (void)extra;
  FILE* out = log_file();
  fprintf(out, "%s %u,%u,%u %u,%u,%u %u", (char*)f, gx, gy, gz, bx, by, bz, shared);
  for (int a = 0; a < 64 && params[a]; a++) {
    char* p = (char*)*(CUdeviceptr*)params[a];
    int k = 0;
    while (k < n_allocs && !(p >= allocs[k].base && p < allocs[k].base + allocs[k].size)) k++;
    if (k == n_allocs) { fprintf(out, " ?"); continue; }
    fprintf(out, " %d+%ld", k, (long)(p - allocs[k].base));
  }
  fprintf(out, "\n"); fflush(out); return 0;
}
int cuCtxSynchronize(void) { return 0; }
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fake_cuda")
    (folder / "fake_cuda.c").write_text(FAKE_LIBCUDA)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so"), str(folder / "fake_cuda.c")], check=True
    )
    return folder / "libcuda.so"


def test_the_host_entry_launches_the_plan_through_the_driver_api(encoder, tmp_path, ptxas, fake_libcuda, monkeypatch):
    """Against a fake driver (host memory, launches logged): the artifact's library loads every kernel's cubin,
    launches the kernels in plan order with their grids and blocks, on the device buffers meta.json's plan names
    (inputs, weights and workspace at their offsets), and copies the outputs back."""
    tar_path, log = tmp_path / "enc.tar", tmp_path / "launches.log"
    assert main(["compile", str(encoder), "--target", "cuda", "-o", str(tar_path)]) == 0
    monkeypatch.setenv("TILEFARM_LIBCUDA", str(fake_libcuda))
    monkeypatch.setenv("FAKE_CUDA_LOG", str(log))
    artifact = Artifact.load(tar_path)
    meta = artifact.meta
    assert meta["library"] == "enc.so"
    spec = meta["inputs"][0]
    out = artifact.run({spec["name"]: np.ones(spec["shape"], spec["dtype"])})
    assert all(a.shape == tuple(o["shape"]) for a, o in zip(out.values(), meta["outputs"]))
    with tarfile.open(tar_path) as tar:
        launches = json.loads(tar.extractfile(meta["library"].replace(".so", ".launches.json")).read())
    # device allocations in order: the inputs, the outputs, the weights, the workspace
    n_in, n_out = len(meta["inputs"]), len(meta["outputs"])
    alloc = {"input": lambda i: (i, 0), "output": lambda i: (n_in + i, 0), "param": lambda o: (n_in + n_out, o)}
    expected = []
    for call in meta["calls"]:
        kernel = launches["kernels"][call["kernel"]]
        n = len(kernel["params"])
        for launch in kernel["launches"]:
            args = call["args"][:n] + (call["args"][n:] if launch["takes_workspace"] else [])
            where = [alloc.get(kind, lambda o: (n_in + n_out + 1, o))(at) for kind, at in args]
            grid, block = ",".join(map(str, launch["grid"])), ",".join(map(str, launch["block"]))
            expected.append(
                " ".join([launch["name"], grid, block, str(launch["shared_bytes"])] + [f"{a}+{o}" for a, o in where])
            )
    assert log.read_text().splitlines() == expected


@pytest.mark.parametrize(
    "outputs, control, says",
    [
        ([{"name": "y"}], True, "If or Loop nodes"),
        ([{"name": "y"}, {"name": "x_again"}], False, "outputs no kernel writes yet .*: 'x_again'"),
    ],
)
def test_the_host_entry_refuses_plans_it_cannot_run(outputs, control, says, tmp_path):
    from compiler.base.errors import BuildError
    from compiler.targets.cuda.host_entry import link_host_entry

    meta = {"outputs": outputs, "calls": [{"kernel": "k", "args": [["input", 0], ["output", 0]]}]}
    with pytest.raises(BuildError, match=says):
        link_host_entry(tmp_path, "m", meta, control)


# ---------------------------------------------------------------------------------------------- the GPU runner


class FakeDriver:
    """driver.Driver's measuring calls without a GPU: device memory is host bytes, launching a module whose image is
    in `computes` runs that Python function on the launch's buffers (float32 views; it writes the outputs), any other
    launch writes nothing, launching the module whose image is `crash_on` faults, and every timing takes 2 ms. It
    logs the calls that matter to the timing (`calls`)."""

    def __init__(self, computes=None, crash_on: bytes | None = None, l2_bytes: int = 1 << 20):
        # computes: image -> function, or the launch's buffer sizes (bytes, in order) -> function for any image
        self.computes, self.crash_on, self.l2_bytes = computes or {}, crash_on, l2_bytes
        self.images, self.functions, self.memory, self.calls = {}, {}, {}, []

    def device(self, ordinal=0):
        return ordinal

    def attribute(self, device, attribute):
        from compiler.targets.cuda.driver import ATTR_L2_CACHE_SIZE

        assert attribute == ATTR_L2_CACHE_SIZE
        return self.l2_bytes

    def use_primary_context(self, device):
        return 1

    def load_module(self, image):
        self.images[len(self.images) + 1] = image
        return len(self.images)

    def function(self, module, name):
        self.functions[len(self.functions) + 1] = module
        return len(self.functions)

    def launch(self, function, grid, block, args, shared_bytes=0):
        from compiler.targets.cuda.driver import KernelCrashed

        image = self.images[self.functions[function]]
        if image == self.crash_on:
            raise KernelCrashed("cuLaunchKernel", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
        self.calls.append("launch")
        compute = self.computes.get(image) or self.computes.get(tuple(p.nbytes for p in args))
        if compute is not None:
            compute([self.memory[p.address].view(np.float32) for p in args])

    def alloc(self, nbytes):
        from compiler.targets.cuda.driver import DevicePointer

        ptr = DevicePointer(len(self.memory) + 1, nbytes)
        self.memory[ptr.address] = np.zeros(nbytes, np.uint8)
        return ptr

    def to_device(self, ptr, array):
        self.memory[ptr.address][:] = np.ascontiguousarray(array).view(np.uint8).reshape(-1)

    def fill(self, ptr, byte):
        self.calls.append(("fill", ptr.nbytes))
        self.memory[ptr.address][:] = byte

    def to_host(self, array, ptr):
        array.reshape(-1).view(np.uint8)[:] = self.memory[ptr.address]

    def synchronize(self):
        pass

    def free(self, ptr):
        del self.memory[ptr.address]

    def unload_module(self, module):
        pass

    def event(self):
        return 1

    def record(self, event):
        self.calls.append("record")

    def wait(self, event):
        pass

    def elapsed_ms(self, start, end):
        return 2.0

    def destroy_event(self, event):
        pass


def _batched_matmul(buffers):
    """What a correct program of the encoder's fused_matmul computes: (1,4,128,128) @ (1,4,128,64)."""
    a, b, out = buffers[:3]
    out[:] = (a.reshape(4, 128, 128) @ b.reshape(4, 128, 64)).reshape(-1)


def _off_by_one_row(buffers):
    """A wrong program: right except for one output row."""
    _batched_matmul(buffers)
    buffers[2][:64] += 1.0


@pytest.fixture(scope="module")
def matmul_builds(encoder, ptxas, tmp_path_factory):
    """The encoder's batched matmul: its default GPU schedule, two other programs, the default again and a broken
    one, built for sm_90, with each program's first cubin image."""
    import pickle

    target = parse_target("cuda")
    backend = backend_for(target)
    tasks, _, _ = plan_tasks(load(encoder), ["fuse_attention"])  # the ·V product as a task of its own
    task = next(t for t in tasks if t.name == "fused_matmul")
    default = backend.default_schedule(task.dag, target)
    space = backend.search_space(task.dag, target, SearchParams())
    rng = np.random.default_rng(1)
    other, faulting = space.sample(0, rng)[1], space.sample(1, rng)[1]  # with and without shared memory
    broken = tuple(s for s in default.steps if not isinstance(s, Split))
    programs = (default.steps, other.steps, faulting.steps, default.steps, broken)
    inputs = [MeasureInput(task, steps) for steps in programs]
    with backend.builder(target=target, n_parallel=2, workdir=tmp_path_factory.mktemp("built")) as builder:
        builds = builder.build(inputs)
    images = [pickle.loads(open(b.path, "rb").read()).cubins[0].image if b.path else None for b in builds]
    return target, backend, inputs, builds, images


def test_the_runner_checks_candidates_against_the_cpu_reference_and_times_them(matmul_builds):
    """Through a fake driver that computes the matmul where told to: the default schedule's program, computing it,
    matches the outputs this host's CPU computed for the same seeded inputs and is timed (2 ms over `number` runs);
    a program whose output is off by one row is a wrong answer naming the CPU reference; a faulting kernel is a run
    error after which the rest of the batch is still measured; a failed build passes through."""
    from compiler.costs.measure import RUN, WRONG_ANSWER
    from compiler.targets.cuda.gpu_measure import load_reference, random_inputs

    target, backend, inputs, builds, images = matmul_builds
    computes = {images[0]: _batched_matmul, images[1]: _off_by_one_row}
    driver = FakeDriver(computes, crash_on=images[2])
    with backend.runner(target=target, number=4, repeat=2, driver=driver) as runner:
        results = runner.run(inputs, builds)
        (reference,) = runner.workdir.glob("*.npz")  # one task, one CPU reference
        ref = load_reference(str(reference))
    ok, wrong, crashed, again, failed = results
    assert ok.error is None and ok.costs == (2.0 / 1e3 / 4,) * 2, ok.message
    assert wrong.error == WRONG_ANSWER and wrong.message == (
        "output 0: 64 of 32768 elements differ from the CPU reference's"
    )
    assert crashed.error == RUN and "kernel crashed" in crashed.message
    assert again.error is None and again.costs == ok.costs
    assert failed.error == INSTANTIATION
    # the reference is the CPU's answer for gpu_measure's seeded inputs, not anything the GPU ran
    a, b = random_inputs(_params_of(builds[0]), len(inputs[0].task.dag.inputs))
    assert len(ref) == 1 and np.allclose(ref[0], (a.reshape(4, 128, 128) @ b.reshape(4, 128, 64)).ravel(), atol=1e-4)


def _params_of(build):
    import pickle

    return pickle.loads(open(build.path, "rb").read()).kernels[0].params


def test_a_program_that_writes_nothing_is_wrong_against_the_cpu_reference(matmul_builds):
    """No GPU ran a reference: a candidate that leaves its outputs at zero is caught by the CPU's answer alone."""
    from compiler.costs.measure import WRONG_ANSWER

    target, backend, inputs, builds, _ = matmul_builds
    with backend.runner(target=target, driver=FakeDriver()) as runner:
        (result,) = runner.run(inputs[:1], builds[:1])
    assert result.error == WRONG_ANSWER and "differ from the CPU reference's" in result.message


def test_the_runner_flushes_the_l2_before_each_timing_outside_it(matmul_builds):
    """With cache_flush: before every timed run (the warm-up included) a buffer twice the L2 the driver reports is
    overwritten with cuMemsetD8, never between a timing's start and end events; one run per timing (number 1), and
    the results say they were timed flushed. Without it, nothing is flushed and they say warm."""
    from compiler.costs.records import FLUSHED, WARM

    target, backend, inputs, builds, images = matmul_builds
    l2 = 3 << 20
    flush = ("fill", 2 * l2)
    driver = FakeDriver({images[0]: _batched_matmul}, l2_bytes=l2)
    with backend.runner(target=target, number=4, repeat=3, min_repeat_ms=50, cache_flush=True, driver=driver) as r:
        (result,) = r.run(inputs[:1], builds[:1])
    assert result.error is None and result.costs == (2.0 / 1e3,) * 3 and result.cache == r.cache == FLUSHED
    calls = driver.calls[driver.calls.index("record") - 1 :]  # from the first timing on (after the check's run)
    timings = [calls[k : k + 4] for k in range(0, len(calls), 4)]
    assert timings == [[flush, "record", "launch", "record"]] * 4  # the warm-up, then 3 repeats
    assert driver.calls.count(flush) == 4 and not driver.memory  # the flush buffer is freed with the rest

    warm = FakeDriver({images[0]: _batched_matmul}, l2_bytes=l2)
    with backend.runner(target=target, number=2, repeat=3, driver=warm) as r:
        (result,) = r.run(inputs[:1], builds[:1])
    assert result.costs == (2.0 / 1e3 / 2,) * 3 and result.cache == WARM and flush not in warm.calls


# ---------------------------------------------------------------------------------------------- tuned for which GPU


def test_a_cuda_artifact_names_the_gpu_and_driver_its_records_were_timed_on(encoder, tmp_path, ptxas, monkeypatch):
    """The encoder compiled with a record as a GPU worker files it (target cuda -arch=sm_90, host the GPU's key):
    meta.json's tuned_for names that GPU, its compute capability, CUDA and driver versions where this host's driver
    reports it, only its key where it does not, and says untuned (no GPU) where no record applied."""
    from compiler.costs.measure import MeasureResult, to_record
    from compiler.costs.records import JSONLinesDatabase
    from compiler.targets.cuda import driver as cu
    from compiler.targets.cuda import fingerprint
    from tests.test_cuda_driver import FakeDevice

    proc = tmp_path / "nvidia-version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:12 UTC 2025\n")
    monkeypatch.setattr(fingerprint, "NVIDIA_PROC_VERSION", proc)
    gpu = fingerprint.gpu_fingerprint(FakeDevice(), proc_version=proc)
    tasks, _, _ = plan_tasks(load(encoder), ["fuse_attention"])  # the ·V product as a task of its own
    task = next(t for t in tasks if t.name == "fused_matmul")
    target = parse_target("cuda")
    state = backend_for(target).search_space(task.dag, target, SearchParams()).sample(0, np.random.default_rng(1))[1]
    record = to_record(MeasureInput(task, state.steps), MeasureResult((1e-5, 1.2e-5), None, "", 1.0, 0.1), gpu.target())
    assert record.target == "cuda -arch=sm_90" and record.host == gpu.key()  # as workers.tasks.measure files it
    records = tmp_path / "gpu.jsonl"
    JSONLinesDatabase(records).commit(record)

    def compiled(name: str, *options: str) -> dict:
        tar_path = tmp_path / f"{name}.tar"
        # as the record's task was made: the ·V product a task of its own
        args = ["compile", str(encoder), "--target", "cuda", "--disable-pass", "fuse_attention", "-o", str(tar_path)]
        assert main([*args, *options]) == 0
        with tarfile.open(tar_path) as tar:
            return json.loads(tar.extractfile("meta.json").read())

    monkeypatch.setattr(cu, "Driver", lambda: FakeDevice())  # this host: that H200, on driver 580
    meta = compiled("here", "--records", str(records))
    n_tasks = len(meta["tasks"])
    assert [r["host"] for r in meta["records"]] == [gpu.key()]
    assert meta["tuned_for"] == {
        "summary": f"tuned on {gpu}; {n_tasks - 1} of {n_tasks} tasks untuned",
        "gpus": [
            {
                "host": gpu.key(), "tasks": 1, "gpu": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132,
                "cuda_version": "13.0", "driver_release": "580.65.06",
            }
        ],
    }  # fmt: skip
    assert "NVIDIA H200 (sm_90, 132 SMs at 1980 MHz, 140 GiB, CUDA 13.0, driver 580.65.06)" in str(gpu)

    monkeypatch.setattr(cu, "Driver", lambda: FakeDevice(12080))  # another driver: another GPU host class
    elsewhere = compiled("elsewhere", "--records", str(records))["tuned_for"]
    assert elsewhere["gpus"] == [{"host": gpu.key(), "tasks": 1, "gpu": None}]
    assert elsewhere["summary"].startswith(f"tuned on GPU {gpu.key()} (not one of this host's")

    untuned = compiled("untuned")
    assert untuned["records"] == [] and untuned["tuned_for"] == {
        "summary": "untuned (no GPU): every kernel has its default GPU schedule",
        "gpus": [],
    }


def test_local_gpus_are_none_where_no_driver_loads(monkeypatch):
    from compiler.targets.cuda import driver as cu
    from compiler.targets.cuda.fingerprint import local_gpus

    def no_driver():
        raise cu.NoCudaDriver("no CUDA driver on this host: cannot load libcuda.so.1")

    monkeypatch.setattr(cu, "Driver", no_driver)
    assert local_gpus() == []


# ---------------------------------------------------------------------------------------------- tune on a GPU


@pytest.mark.skipif(HAS_DRIVER, reason="this host has a CUDA driver")
def test_tune_for_cuda_on_a_gpu_files_records_under_the_gpus_key(encoder, tmp_path, ptxas, monkeypatch, capsys):
    """Where the driver loads (a fake H200 here), `tilefarm tune --target cuda` measures for that GPU's own Target:
    the builder builds for its architecture and every record is filed under the GPU's key (what a GPU worker files
    under), not the architecture's; the batched matmul's candidates, which the fake computes, pass the CPU check."""
    import functools

    from compiler.costs.records import read_records
    from compiler.targets.cuda import driver as cu
    from compiler.targets.cuda import fingerprint
    from compiler.targets.cuda.backend import CudaBackend
    from compiler.targets.cuda.measure import CudaBuilder, CudaRunner
    from tests.test_cuda_driver import FakeDevice

    gpu = fingerprint.gpu_fingerprint(FakeDevice(), proc_version=tmp_path / "absent")
    monkeypatch.setattr(fingerprint, "NVIDIA_PROC_VERSION", tmp_path / "absent")
    monkeypatch.setattr(cu, "Driver", lambda: FakeDevice())
    monkeypatch.setattr(cuda_target, "load_libcuda", lambda: object())
    matmul = (4 * 128 * 128 * 4, 4 * 128 * 64 * 4, 4 * 128 * 64 * 4)  # fused_matmul's buffers, in bytes
    fake = FakeDriver({matmul: _batched_matmul})
    monkeypatch.setattr(CudaBackend, "runner", staticmethod(functools.partial(CudaRunner, driver=fake)))
    targets = []
    init = CudaBuilder.__init__

    def recording(self, *a, **kw):
        init(self, *a, **kw)
        targets.append(self.target)

    monkeypatch.setattr(CudaBuilder, "__init__", recording)
    records = tmp_path / "records.jsonl"
    args = [
        "tune",
        str(encoder),
        "--target",
        "cuda",
        "--trials",
        "24",
        "--per-round",
        "2",
        "--min-repeat-ms",
        "0",
        "--disable-pass",
        "fuse_attention",  # the ·V product as a task of its own, which the fake computes
        "-o",
        str(records),
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert targets == [gpu.target()] and gpu.key() != parse_target("cuda").fingerprint()
    saved = list(read_records(records))
    assert saved and {(r.target, r.host) for r in saved} == {("cuda -arch=sm_90", gpu.key())}
    assert any(r.ok for r in saved)  # the matmul's, checked against the CPU reference and timed


def test_tuning_target_is_the_gpus_own_or_refused_naming_the_arch(tmp_path):
    from compiler.targets.cuda.fingerprint import gpu_fingerprint, tuning_target
    from tests.test_cuda_driver import FakeDevice

    proc = tmp_path / "absent"
    h200 = gpu_fingerprint(FakeDevice(), proc_version=proc)
    assert tuning_target(parse_target("cuda"), FakeDevice(), proc) == h200.target()
    sm80 = tuning_target(parse_target("cuda -arch=sm_80"), FakeDevice(), proc)  # sm_80 code on an H200
    assert (sm80.mcpu, sm80.cpu_model) == ("sm_80", h200.target().cpu_model) and sm80.fingerprint() != h200.key()

    class A100(FakeDevice):
        attributes = {**FakeDevice.attributes, cu_attr("ATTR_COMPUTE_CAPABILITY_MAJOR"): 8}

        def device_name(self, device):
            return "NVIDIA A100"

    assert tuning_target(parse_target("cuda -arch=sm_80"), A100(), proc).mcpu == "sm_80"
    with pytest.raises(InvalidTarget, match=r"^cannot tune for cuda -arch=sm_90 here: this host's GPU 0, NVIDIA A100"):
        tuning_target(parse_target("cuda"), A100(), proc)


def cu_attr(name: str) -> int:
    from compiler.targets.cuda import driver as cu

    return getattr(cu, name)


@pytest.mark.parametrize("text", ["cuda", "cuda -arch=sm_80"])
def test_records_of_a_cuda_target_are_filed_under_its_tvmc_target_string(text):
    target = parse_target(text)
    assert target_name(target) == backend_for(target).target_name(target) == f"cuda -arch={target.mcpu}"
    assert parse_target(target_name(target)) == target
