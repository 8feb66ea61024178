"""Targets for another CPU: tvmc's target strings read into the Target of any CPU LLVM knows, code compiled here for
it (an AVX2 fleet's broadwell: runs here, matches onnxruntime, not one AVX-512 instruction; skylake-avx512: zmm code
that `run` refuses on a CPU without AVX-512), tuned here where this host runs its instructions (records filed under
its name), refused where it cannot (the host's features faked)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace

import numpy as np
import pytest

from compiler.artifact import runtime
from compiler.artifact.runtime import Artifact, ArtifactError
from compiler.base.errors import InvalidTarget
from compiler.base.target import Target
from compiler.costs.cost_model import RandomModel
from compiler.costs.records import JSONLinesDatabase, target_name
from compiler.search.evolution import SearchParams
from compiler.search.task_scheduler import TaskScheduler, TuneOptions
from compiler.targets import check_runs_here, host_target, parse_target
from compiler.targets.cpu.annotate import RegisterFile
from compiler.targets.cpu.default_schedule import _registers
from compiler.targets.cpu.host import FEATURES_ENV, fmas_in_flight, vector_registers
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from compiler.targets.cpu.target_parse import cpu_features, llvm_names
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task
from tilefarm import examples
from tilefarm.cli import main

# an AVX2-only host to judge targets against, whatever this machine is: a Zen 3 of 2 cores with its caches
ZEN3 = Target(
    kind="cpu", triple="x86_64-unknown-linux-gnu", mcpu="znver3", cores=2, vector_bytes=32, l1_bytes=32 << 10,
    l2_bytes=512 << 10, l3_bytes=32 << 20, cpu_model="AMD EPYC 7B13",
    features=",".join(sorted(f"+{f}" for f in cpu_features("znver3"))),
)  # fmt: skip
# instructions only AVX-512 (EVEX) has: mask registers and their moves, 3-source permutes, ternary logic, compress
EVEX_ONLY = re.compile(
    r"%zmm|%k[0-7]|\{%k|\bk(mov|and|or|xor|not|shift|test|unpck)\w*|vpternlog|vperm[it]2|vpcompress|vexpand"
)


def _host_without(*features: str) -> Target:
    return replace(ZEN3, features=",".join(f for f in ZEN3.features.split(",") if f[1:] not in features))


# ---------------------------------------------------------------------------------------------- reading targets


def test_a_named_cpu_has_llvms_features_and_this_hosts_cores_and_caches():
    bdw = parse_target("llvm -mcpu=broadwell", ZEN3)
    assert bdw.mcpu == "broadwell" and target_name(bdw) == "llvm -mcpu=broadwell"
    assert {"avx2", "fma", "f16c", "bmi2", "adx"} <= {f[1:] for f in bdw.features.split(",") if f[0] == "+"}
    assert "-avx512f" in bdw.features.split(",") and not bdw.has("avx512f")
    assert (bdw.vector_bytes, vector_registers(bdw), fmas_in_flight(bdw)) == (
        32,
        16,
        5 * 2,
    )  # Broadwell: 5 cycles, 2/cycle
    assert (bdw.cores, bdw.l2_bytes, bdw.l3_bytes, bdw.cpu_model, bdw.triple) == (
        ZEN3.cores, ZEN3.l2_bytes, ZEN3.l3_bytes, ZEN3.cpu_model, ZEN3.triple
    )  # fmt: skip
    # timed here, its records are its own: the fingerprint holds the target's CPU and features beside the host's model
    assert bdw.fingerprint() != ZEN3.fingerprint()
    skx = parse_target("llvm -mcpu=skylake-avx512", ZEN3)
    assert skx.has("avx512f") and skx.has("avx512bw") and skx.has("avx512vl")
    assert (skx.vector_bytes, vector_registers(skx)) == (64, 32)
    assert parse_target("llvm -mcpu=x86-64", ZEN3).vector_bytes == 16


def test_llvm_and_this_hosts_own_cpu_name_this_host():
    for text in ("llvm", "cpu", "host", "llvm -mcpu=znver3", "llvm -mcpu=native", "llvm -mtriple=x86_64-linux-gnu"):
        assert parse_target(text, ZEN3) == ZEN3, text
    assert parse_target("llvm") == host_target()


def test_mattr_edits_the_cpus_features_and_names_the_target():
    skx_avx2 = parse_target("llvm -mcpu=skylake-avx512 -mattr=-avx512f", ZEN3)
    assert target_name(skx_avx2) == "llvm -mcpu=skylake-avx512 -mattr=-avx512f"
    # what needs AVX-512F goes with it, as LLVM has it
    assert not any(skx_avx2.has(f) for f in ("avx512f", "avx512bw", "avx512vl")) and skx_avx2.has("avx2")
    assert skx_avx2.vector_bytes == 32
    wider = parse_target("llvm -mattr=+avx512f", ZEN3)
    assert wider.mcpu == "znver3" and wider.has("avx512f") and wider.vector_bytes == 64
    narrower = parse_target("llvm -mcpu broadwell -mattr=-fma,-avx2", ZEN3)
    assert not narrower.has("fma") and not narrower.has("avx2") and narrower.has("avx")


@pytest.mark.parametrize(
    "text, says",
    [
        ("llvm -mcpu=skylakex", r"LLVM knows no CPU 'skylakex'; it knows \d+, e\.g\. .*skylake-avx512.*broadwell"),
        ("llvm -mcpu=pentium9", r"LLVM knows no CPU 'pentium9'"),
        ("llvm -mattr=+avx513", r"LLVM knows no feature 'avx513'; did you mean avx512"),
        ("llvm -mattr=avx2", r"not a feature edit"),
        ("rocm", r"target kind 'rocm' is not supported"),  # cuda is a target kind (test_cuda_backend)
        ("llvm -num-cores=4", r"option -num-cores is not supported; tilefarm takes -mcpu, -mattr, -mtriple"),
        ("llvm -mtriple=aarch64-linux-gnu", r"-mtriple=aarch64-linux-gnu is refused"),
        ("llvm -mtriple=x86_64-pc-windows-msvc", r"-mtriple=x86_64-pc-windows-msvc is refused"),
        ("llvm -mcpu=", r"-mcpu needs a value"),
        ("", r"the target is empty"),
    ],
)
def test_what_llvm_does_not_know_is_refused_naming_it(text, says):
    with pytest.raises(InvalidTarget, match=says):
        parse_target(text, ZEN3)


def test_llvm_lists_the_cpus_and_features_it_knows():
    cpus, features = llvm_names()
    assert {"broadwell", "haswell", "skylake-avx512", "znver3", "znver4", "x86-64-v3"} <= set(cpus)
    assert {"avx2", "avx512f", "fma", "sse4.1"} <= set(features)


# ---------------------------------------------------------------------------------------------- where code runs


def test_an_avx512_target_is_refused_on_an_avx2_host_naming_what_it_lacks():
    for text in ("llvm -mcpu=skylake-avx512", "llvm -mattr=+avx512f"):
        with pytest.raises(
            InvalidTarget, match=r"cannot run on this host \(znver3, AMD EPYC 7B13\): it lacks .*avx512f"
        ):
            check_runs_here(parse_target(text, ZEN3), ZEN3)
    check_runs_here(parse_target("llvm -mcpu=broadwell", ZEN3), ZEN3)  # Broadwell's features are all Zen 3's
    check_runs_here(parse_target("llvm -mcpu=skylake-avx512 -mattr=-avx512f", ZEN3), ZEN3)
    with pytest.raises(InvalidTarget, match=r"it lacks fma\b"):
        check_runs_here(parse_target("llvm -mcpu=broadwell", ZEN3), _host_without("fma"))


def test_the_builder_measures_only_what_this_host_runs():
    here = host_target()
    if here.has("avx512f"):
        pytest.skip("this host runs AVX-512: the refusal is shown on a faked host above and through the CLI below")
    with pytest.raises(InvalidTarget, match="avx512f"):
        LocalBuilder(target=parse_target("llvm -mcpu=skylake-avx512"))


def test_tune_refuses_a_target_this_host_cannot_run(tmp_path):
    """Through the command line, this host's features faked without AVX-512 where it has it (TILEFARM_CPU_FEATURES)."""
    model = tmp_path / "tiny.onnx"
    examples.save("tiny_cnn", model)
    env = {k: v for k, v in os.environ.items() if k != FEATURES_ENV}
    if host_target().has("avx512f"):
        env[FEATURES_ENV] = "-avx512f"
    cmd = [sys.executable, "-m", "tilefarm", "tune", str(model), "--target", "llvm -mcpu=skylake-avx512"]
    cmd += ["--trials", "2", "--records", str(tmp_path / "r.jsonl")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.search(
        r"error: code for 'llvm -mcpu=skylake-avx512' cannot run on this host .*it lacks .*avx512f", out.stderr
    )
    assert "Traceback" not in out.stderr and not (tmp_path / "r.jsonl").exists()


# ---------------------------------------------------------------------------------------------- sketches and schedules


def test_register_blocks_and_default_schedules_follow_the_target_not_the_host():
    bdw, skx = parse_target("llvm -mcpu=broadwell", ZEN3), parse_target("llvm -mcpu=skylake-avx512", ZEN3)
    assert RegisterFile.of(bdw, "float32") == RegisterFile(16, 8, 10)
    assert RegisterFile.of(skx, "float32") == RegisterFile(32, 16, 8)
    assert _registers(bdw) == (8, 10) and _registers(skx) == (16, 16)


# ---------------------------------------------------------------------------------------------- compile and run


def _objdump(tar, tmp_path) -> str:
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is needed to read the artifact's machine code")
    folder = tmp_path / tar.stem
    with tarfile.open(tar) as t:
        t.extractall(folder, filter="data")
    so = next(folder.glob("*.so"))
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    examples.save("tiny_cnn", path)
    return path


def test_an_artifact_for_broadwell_runs_here_matches_onnxruntime_and_has_no_avx512(tiny, tmp_path, capsys):
    import onnxruntime as ort

    if not {"avx2", "fma", "f16c", "bmi2", "movbe"} <= runtime.cpuinfo_flags():
        pytest.skip("this machine is no AVX2 x86-64: a broadwell artifact cannot run here")
    tar = tmp_path / "bdw.tar"
    assert main(["compile", str(tiny), "--target", "llvm -mcpu=broadwell", "-o", str(tar)]) == 0
    art = Artifact.load(tar)
    assert art.meta["target"]["name"] == "llvm -mcpu=broadwell" and "+avx2" in art.meta["target"]["features"]
    assert "-avx512f" in art.meta["target"]["features"].split(",")
    assert "avx512f" not in art.meta["requires"]["cpuinfo_flags"] and art.meta["requires"]["cpuinfo_flags"]["fma"]
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    name = art.input_names[0]
    got = next(iter(art.run({name: x}).values()))
    want = ort.InferenceSession(str(tiny), providers=["CPUExecutionProvider"]).run(None, {name: x})[0]
    assert float(np.abs(got - want).max() / np.abs(want).max()) < 1e-4
    asm = _objdump(tar, tmp_path)
    assert "%ymm" in asm, "broadwell code is AVX2: 256-bit vectors"
    found = sorted({m.group(0) for m in EVEX_ONLY.finditer(asm)})
    assert not found, f"AVX-512 instructions in code for broadwell: {found}"


def test_an_artifact_for_skylake_avx512_is_zmm_code_that_run_refuses_without_avx512(tiny, tmp_path, monkeypatch):
    tar = tmp_path / "skx.tar"
    assert main(["compile", str(tiny), "--target", "llvm -mcpu=skylake-avx512", "-o", str(tar)]) == 0
    assert "%zmm" in _objdump(tar, tmp_path), "cross-compiled for skylake-avx512: 512-bit vectors"
    with tarfile.open(tar) as t:
        meta = json.load(t.extractfile("meta.json"))
    assert meta["requires"]["cpuinfo_flags"]["avx512f"] == "avx512f"
    # a CPU without AVX-512, whatever this one is: its /proc/cpuinfo flags less those
    flags = frozenset(f for f in runtime.cpuinfo_flags() if not f.startswith("avx512")) or frozenset({"sse2", "avx2"})
    monkeypatch.setattr(runtime, "cpuinfo_flags", lambda: flags)
    with pytest.raises(
        ArtifactError, match=r"compiled for llvm -mcpu=skylake-avx512, and this machine's CPU lacks avx512bw.*avx512f"
    ):
        Artifact.load(tar)
    assert main(["run", str(tar)]) == 2


# ---------------------------------------------------------------------------------------------- tune


def test_tuning_for_broadwell_measures_here_and_files_records_under_its_name(tmp_path):
    target = parse_target("llvm -mcpu=broadwell")
    check_runs_here(target)  # an x86-64 host with AVX2 (the development machines all are)
    A, B = te.placeholder((32, 32), name="A"), te.placeholder((32, 32), name="B")
    dag = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    options = TuneOptions(trials=4, measures_per_round=4, params=SearchParams(population=16, num_iters=1))
    with LocalBuilder(n_parallel=1, target=target) as builder, LocalRunner(repeat=1, min_repeat_ms=1) as runner:
        sched = TaskScheduler([Task(dag.workload_key, dag, "matmul32")], db, options, model=RandomModel(0),
                              builder=builder, runner=runner, target=target)  # fmt: skip
        sched.run()
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert records and {r["target"] for r in records} == {"llvm -mcpu=broadwell"}
    assert {r["host"] for r in records} == {target.fingerprint()} != {host_target().fingerprint()}
    assert any(r["error"] is None for r in records)


def test_the_service_takes_the_host_classs_own_cpu_and_refuses_another(monkeypatch):
    from server import catalog
    from server.schemas import Invalid

    monkeypatch.setattr(catalog, "host_target", lambda session, settings, fingerprint: ZEN3)
    for text in ("llvm", "llvm -mcpu=znver3"):
        assert catalog.resolve_target(None, None, text, "h") is ZEN3
    for text, says in [
        ("llvm -mcpu=broadwell", r"another CPU than the host class's \(llvm -mcpu=znver3\).*tilefarm compile --target"),
        ("llvm -mcpu=nosuchcpu", "LLVM knows no CPU 'nosuchcpu'"),
        ("cuda", r"host 'h' is a CPU host class, not one of cuda -arch=sm_90"),
        ("opencl", "'opencl' is not supported: use llvm"),
    ]:
        with pytest.raises(Invalid, match=says):
            catalog.resolve_target(None, None, text, "h")
