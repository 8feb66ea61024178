"""The code generation target: this host's features, and TILEFARM_CPU_FEATURES turning some of them off."""

import json
import os
import re
import subprocess
import sys

import pytest

from compiler.base.errors import InvalidTarget
from compiler.base.target import Target
from compiler.targets import host_target
from compiler.targets.cpu.host import FEATURES_ENV, _edited_features, _vector_bytes, fmas_in_flight, vector_registers

HOST = "+avx,+avx2,+avx512bw,+avx512f,+fma,-amx-tile,-sse4a"


def test_no_edits_is_the_host():
    assert _edited_features(HOST, "") == HOST
    assert _edited_features(HOST, " , ") == HOST


def test_turning_a_feature_off_drops_it_and_names_it_last():
    edited = _edited_features(HOST, "-avx512f")
    assert edited.split(",") == ["+avx", "+avx2", "+avx512bw", "+fma", "-amx-tile", "-avx512f", "-sse4a"]
    # "-" sorts after "+": LLVM applies the host's features first, then turns avx512f and what needs it off
    assert edited.index("-avx512f") > edited.index("+avx512bw")
    assert _vector_bytes(edited) == 32
    assert _vector_bytes(_edited_features(HOST, "-avx512f,-avx")) == 16


@pytest.mark.parametrize(
    "edits, says",
    [
        ("+avx2", "not a feature to turn off"),
        ("avx2", "not a feature to turn off"),
        ("-", "not a feature to turn off"),
        ("-avx10.1", "not a feature of this host"),
        ("-sse4a", "not a feature of this host"),  # already off
    ],
)
def test_bad_edits_name_what_is_wrong(edits, says):
    with pytest.raises(InvalidTarget, match=f"{FEATURES_ENV}.*{says}"):
        _edited_features(HOST, edits)


def _widest_feature() -> tuple[str, str]:
    """The edit that narrows this host's vectors, and the register name that must then be gone from the code."""
    host = host_target()
    if host.has("avx512f"):
        return "-avx512f", "%zmm"
    if host.has("avx"):
        return "-avx", "%ymm"
    pytest.skip("this host has no AVX to turn off (x86 with AVX needed)")


def _kernel(env_edits: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != FEATURES_ENV}
    if env_edits is not None:
        env[FEATURES_ENV] = env_edits
    code = (
        "from compiler.targets import host_target; print('fingerprint', host_target().fingerprint()); "
        "from tilefarm.cli import main; "
        "main(['kernel', 'gemm', '--shape', '64,64,64', '--show', 'asm', '--repeat', '1'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_narrower_code_runs_right_and_is_filed_apart():
    edit, register = _widest_feature()
    host, narrow = _kernel(None), _kernel(edit)
    assert register in host and register not in narrow
    for out in (host, narrow):
        err = float(re.search(r"max rel error vs numpy (\S+)", out).group(1))
        assert err < 1e-4
    fingerprints = [re.search(r"fingerprint (\w+)", out).group(1) for out in (host, narrow)]
    assert fingerprints[0] == host_target().fingerprint() != fingerprints[1]


def test_a_bad_setting_stops_the_cli_with_its_name_not_a_traceback():
    env = {**os.environ, FEATURES_ENV: "-no-such-feature"}
    cmd = [sys.executable, "-m", "tilefarm", "kernel", "gemm", "--shape", "8,8,8", "--repeat", "1"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"error: {FEATURES_ENV}: 'no-such-feature' is not a feature of this host" in out.stderr
    assert "Traceback" not in out.stderr


def test_tuning_with_edits_files_records_apart_and_says_so(tmp_path):
    edit, _ = _widest_feature()
    records = tmp_path / "r.jsonl"
    env = {**os.environ, FEATURES_ENV: edit}
    cmd = [sys.executable, "-m", "tilefarm", "tune-kernel", "gemm", "--shape", "16,16,16", "--trials", "2"]
    cmd += ["--per-round", "2", "--population", "16", "--threads", "1", "--records", str(records)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said = re.search(rf"with {edit} \({FEATURES_ENV}\): records filed under host (\w+)", out.stdout)
    assert said, out.stdout
    hosts = {json.loads(line)["host"] for line in records.read_text().splitlines()}
    assert hosts == {said.group(1)} and said.group(1) != host_target().fingerprint()


def test_vector_registers_follow_the_widest_vector_feature_and_the_architecture():
    assert vector_registers(Target(triple="x86_64-unknown-linux-gnu", features="+avx,+avx2,+avx512f,+fma")) == 32
    assert vector_registers(Target(triple="x86_64-unknown-linux-gnu", features="+avx,+avx2,+fma,-avx512f")) == 16
    assert vector_registers(Target(triple="x86_64-unknown-linux-gnu", features="+sse2")) == 16
    assert vector_registers(Target(triple="aarch64-unknown-linux-gnu", features="+neon")) == 32
    edited = _edited_features("+avx,+avx2,+avx512f,+fma", "-avx512f")
    assert vector_registers(Target(triple="x86_64-unknown-linux-gnu", features=edited)) == 16


def test_fmas_in_flight_are_latency_times_issue_rate_at_the_vector_width():
    def zen(n: int, vector_bytes: int) -> int:
        return fmas_in_flight(Target(mcpu=f"znver{n}", vector_bytes=vector_bytes))

    assert zen(2, 32) == 5 * 2 and zen(3, 32) == 4 * 2 and zen(1, 32) == 5 * 1
    assert zen(4, 32) == 4 * 2 and zen(4, 64) == 4 * 1  # Zen 4 splits a 512-bit FMA into two 256-bit halves
    assert zen(5, 64) == 4 * 2
    assert fmas_in_flight(Target(mcpu="haswell", vector_bytes=32)) == 10
    assert fmas_in_flight(Target(mcpu="sapphirerapids", vector_bytes=64)) == 8  # not listed: two FMAs of 4 cycles
