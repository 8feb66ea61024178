"""Target strings as tvmc and TVM write them ("llvm -mcpu=broadwell -mattr=+avx2,-fma"), read into the Target of that
CPU, and whether this host can execute a target's instructions.

What a named CPU can do is asked of LLVM itself (the llvmlite this process generates code with), never taken from a
table: the CPUs and features it knows from its `-mcpu=help` listing, and the features of a CPU from its inliner. LLVM
inlines a function into a caller only when the callee's features are a subset of the caller's (X86's
areInlineCompatible), so a module of callers compiled for the CPU, each calling a callee that adds one feature, tells
by which calls were inlined which features the CPU has. Only the instruction-set features LLVM detects on a host
(`get_host_cpu_features`) are asked about, so a target's features and a host's compare name for name.

A target is for another CPU, timed on this one: the cores, caches and CPU model (hence the fingerprint records are filed
under, which also holds the target's own CPU name and features) are this host's.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import tempfile

from compiler.base.errors import InvalidTarget
from compiler.base.target import Target
from compiler.costs.records import target_name
from compiler.targets.cpu.host import _sorted_features, _vector_bytes
from compiler.targets.cpu.host import host as this_host

KINDS = ("llvm", "cpu", "host")  # "llvm" as TVM writes it; the others are tilefarm's older names for this host's CPU
OPTIONS = ("mcpu", "mattr", "mtriple")
VENDORS = ("unknown", "pc")  # triple components that name no architecture, OS or environment
# named in the message for an unknown -mcpu, beside the closest spellings
COMMON_CPUS = ("haswell", "broadwell", "skylake", "skylake-avx512", "icelake-server", "sapphirerapids", "znver3",
               "znver4", "x86-64-v3")  # fmt: skip
# LLVM feature -> the flag Linux's /proc/cpuinfo lists for it: the vector and bit-manipulation instructions generated
# kernels use, which an artifact's loader checks the machine for (runtime_requirements)
CPUINFO_FLAGS = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a", "popcnt": "popcnt",
    "avx": "avx", "avx2": "avx2", "fma": "fma", "fma4": "fma4", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2",
    "lzcnt": "abm", "movbe": "movbe", "adx": "adx", "avx512f": "avx512f", "avx512bw": "avx512bw",
    "avx512cd": "avx512cd", "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq",
}  # fmt: skip


def parse_target(text: str, host: Target | None = None) -> Target:
    """The Target a tvmc/TVM target string names: `llvm` (this host), `llvm -mcpu=NAME` (any CPU LLVM knows),
    `-mattr=+a,-b` (features turned on or off, on that CPU or this host's), `-mtriple=` (this host's architecture and
    OS only: artifacts are linked by this host's C compiler). The CPU's features, vector width and register count are
    LLVM's; cores, caches and CPU model are `host`'s (default: this host's), as code tuned for another CPU is timed
    here. Raises InvalidTarget naming what is wrong."""
    here = host or this_host()
    kind, options = _split(text)
    triple = _triple(options.get("mtriple"), here)
    mcpu = options.get("mcpu", "native")
    mattr = _mattr(options.get("mattr", ""))
    if mcpu in ("native", here.mcpu):
        if not mattr:
            return here
        base, mcpu = here.features, here.mcpu
    else:
        _check_cpu(mcpu)
        base = ""
    on = cpu_features(mcpu, ",".join(f for f in (base, mattr) if f))
    isa = _isa_features()
    features = _sorted_features(",".join([*(f"+{f}" for f in on), *(f"-{f}" for f in isa - on)]))
    return dataclasses.replace(
        here, kind="cpu", triple=triple, mcpu=mcpu, features=features, vector_bytes=_vector_bytes(features), mattr=mattr
    )


def check_runs_here(target: Target, host: Target | None = None) -> None:
    """Raise InvalidTarget unless `host` (default: this host) can execute code generated for `target`: its
    architecture, and every instruction-set feature the target has."""
    here = host or this_host()
    if _arch(target.triple or here.triple) != _arch(here.triple):
        raise InvalidTarget(
            f"code for {_describe(target)} ({target.triple}) cannot run on this {here.triple} host; "
            "tune it on a machine of that architecture"
        )
    missing = sorted(_enabled(target.features) - _enabled(here.features))
    if missing:
        cpu = f"{here.mcpu}, {here.cpu_model}" if here.cpu_model else here.mcpu
        raise InvalidTarget(
            f"code for {_describe(target)} cannot run on this host ({cpu}): it lacks {', '.join(missing)}. Compile "
            "for that CPU here (the artifact runs there), but tune and run on a machine that has these features, or "
            f"turn them off: -mattr={','.join('-' + f for f in missing)}"
        )


def runtime_requirements(target: Target) -> dict:
    """What a machine must report to run `target`'s code, for the artifact's loader: per LLVM feature of the target
    (of CPUINFO_FLAGS), the flag /proc/cpuinfo lists for it."""
    on = _enabled(target.features)
    return {"cpuinfo_flags": {f: flag for f, flag in sorted(CPUINFO_FLAGS.items()) if f in on}}


def _describe(target: Target) -> str:
    return repr(target_name(target))


def _enabled(features: str) -> set[str]:
    return {f[1:] for f in features.split(",") if f.startswith("+")}


def _split(text: str) -> tuple[str, dict[str, str]]:
    words = text.split()
    if not words:
        raise InvalidTarget("the target is empty; write one as tvmc does: llvm, or llvm -mcpu=NAME -mattr=+a,-b")
    kind = words[0].lower()
    if kind not in KINDS:
        raise InvalidTarget(
            f"target kind {words[0]!r} is not supported: tilefarm generates code for CPUs through LLVM "
            "(llvm [-mcpu=NAME] [-mattr=+a,-b])"
        )
    options: dict[str, str] = {}
    rest = iter(words[1:])
    for word in rest:
        m = re.fullmatch(r"--?([\w.-]+?)(?:=(.*))?", word)
        if m is None:
            raise InvalidTarget(f"target {text!r}: {word!r} is not an option (-name=value)")
        name, value = m.group(1), m.group(2)
        if name not in OPTIONS:
            takes = ", ".join("-" + o for o in OPTIONS)
            raise InvalidTarget(f"target {text!r}: option -{name} is not supported; tilefarm takes {takes}")
        if value is None:  # "-mcpu NAME"
            value = next(rest, "")
        if not value:
            raise InvalidTarget(f"target {text!r}: -{name} needs a value (-{name}=...)")
        if name in options:
            raise InvalidTarget(f"target {text!r}: -{name} is given twice")
        options[name] = value
    return kind, options


def _arch(triple: str) -> str:
    arch = triple.split("-")[0].lower()
    return {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def _triple(text: str | None, here: Target) -> str:
    """This host's triple, if `text` (a -mtriple) names its architecture, OS and environment (the vendor aside)."""
    if text is None:
        return here.triple
    parts = [p for p in text.lower().split("-")[1:] if p not in VENDORS]
    own = [p for p in here.triple.lower().split("-")[1:] if p not in VENDORS]
    if _arch(text) != _arch(here.triple) or (parts != own and not (own and parts == own[:1])):
        raise InvalidTarget(
            f"-mtriple={text} is refused: tilefarm builds for this host's architecture and OS ({here.triple}), as "
            "artifacts are linked by its C compiler; choose the CPU with -mcpu=NAME"
        )
    return here.triple


def _mattr(text: str) -> str:
    edits = [e.strip() for e in text.split(",") if e.strip()]
    known = llvm_names()[1]
    for e in edits:
        if e[0] not in "+-" or len(e) < 2:
            raise InvalidTarget(f"-mattr: {e!r} is not a feature edit (+name to turn it on, -name to turn it off)")
        if e[1:] not in known:
            close = difflib.get_close_matches(e[1:], known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InvalidTarget(f"-mattr: LLVM knows no feature {e[1:]!r}{hint}")
    return ",".join(edits)


def _check_cpu(mcpu: str) -> None:
    cpus = llvm_names()[0]
    if mcpu not in cpus:
        close = difflib.get_close_matches(mcpu, cpus, n=3)
        some = [*close, *(c for c in COMMON_CPUS if c not in close and c in cpus)]
        raise InvalidTarget(
            f"-mcpu={mcpu}: LLVM knows no CPU {mcpu!r}; it knows {len(cpus)}, e.g. {', '.join(some)} "
            "(or native: this host's)"
        )


@functools.cache
def llvm_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(CPU names, feature names) this process's LLVM knows for the host's architecture, from its help listing."""
    text = _help_text()
    cpus, features = (
        tuple(sorted(re.findall(r"^  (\S+)\s+- ", part, re.MULTILINE)))
        for part in text.partition("Available features for this target:")[::2]
    )
    if not cpus or not features:
        raise InvalidTarget(f"cannot read the CPUs and features LLVM knows from its help listing: {text[:200]!r}")
    return cpus, features


def _help_text() -> str:
    """LLVM's -mcpu=help listing, which it prints to the process's stderr (file descriptor 2, read back here)."""
    llvm = _llvm()
    t = llvm.Target.from_triple(llvm.get_process_triple())
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            t.create_target_machine(cpu="help")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        return out.read().decode(errors="replace")


@functools.cache
def _isa_features() -> frozenset[str]:
    return frozenset(_llvm().get_host_cpu_features().keys())


@functools.cache
def cpu_features(mcpu: str, features: str = "") -> frozenset[str]:
    """The instruction-set features code for LLVM CPU `mcpu` with feature string `features` may use, LLVM's answer:
    those a callee can add and still be inlined (see the module docstring). Features LLVM's inliner ignores (64bit,
    cx16, sahf, nopl: every x86-64 CPU has them) come out as present on any CPU."""
    llvm = _llvm()
    names = sorted(_isa_features())
    defs, attrs = [], []
    base = f'"target-cpu"="{mcpu}"' + (f' "target-features"="{features}"' if features else "")
    for i, f in enumerate(["", *names]):  # probe 0 adds nothing: it must be inlined, or the question was not asked
        added = ",".join(x for x in (features, f"+{f}" if f else "") if x)
        callee = f'"target-cpu"="{mcpu}"' + (f' "target-features"="{added}"' if added else "")
        defs.append(f"define internal i32 @f{i}(i32 %x) #{2 * i} {{\n  %y = add i32 %x, {i}\n  ret i32 %y\n}}")
        defs.append(f"define i32 @p{i}(i32 %x) #{2 * i + 1} {{\n  %y = call i32 @f{i}(i32 %x)\n  ret i32 %y\n}}")
        attrs += [f"attributes #{2 * i} = {{ {callee} }}", f"attributes #{2 * i + 1} = {{ {base} }}"]
    mod = llvm.parse_assembly("\n".join(defs + attrs))
    tm = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(cpu=mcpu, features=features, opt=2)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(mod, pb)
    called = {int(i) for i in re.findall(r"call [^@\n]*@f(\d+)\(", str(mod))}  # calls left: not inlined
    if 0 in called:
        raise InvalidTarget(f"cannot ask LLVM for the features of {mcpu!r}: its inliner left even a plain call")
    return frozenset(f for i, f in enumerate(names, 1) if i not in called)


def _llvm():
    import llvmlite.binding as llvm  # as in host.py: imported where used

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm
