"""ptxas, NVIDIA's PTX assembler, run on generated kernels: it turns PTX into a cubin for one SM version and reports
what each kernel costs the hardware (registers per thread, shared memory, spills to local memory, stack frame), the
facts the search's cost model and the runner's occupancy checks need. A GPU is not needed.

`ptxas` is found at `TILEFARM_PTXAS`, else in pip's `nvidia-cuda-nvcc` wheel (the `cuda` extra), else on PATH.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compiler.base.errors import BuildError, MissingExtra

if TYPE_CHECKING:
    from compiler.targets.cuda.codegen import GpuProgram

PTXAS_TIMEOUT_S = 300.0

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


class PtxasError(BuildError):
    """ptxas refused a kernel; `message` is what it said."""

    def __init__(self, kernel: str, arch: str, message: str):
        self.kernel, self.arch, self.message = kernel, arch, message
        super().__init__(f"ptxas -arch={arch} rejected kernel {kernel}:\n{message}")


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas -v said of one kernel: registers per thread, bytes of static shared memory, of the per-thread stack
    frame, and of spill stores and loads to local memory, and named barriers used."""

    kernel: str
    arch: str
    registers: int
    shared_bytes: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def __str__(self):
        spill = f", spills {self.spill_store_bytes} B stored / {self.spill_load_bytes} B loaded" if self.spills else ""
        return (
            f"{self.kernel} ({self.arch}): {self.registers} registers, {self.shared_bytes} B smem, "
            f"{self.stack_frame_bytes} B stack{spill}"
        )


@functools.cache
def find_ptxas() -> Path:
    """The ptxas executable: `TILEFARM_PTXAS`, the `nvidia-cuda-nvcc` wheel's, or PATH's. Raises MissingExtra saying
    how to get one."""
    override = os.environ.get("TILEFARM_PTXAS")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MissingExtra(f"TILEFARM_PTXAS names {path}, which is not an executable file")
        return path
    try:
        files = importlib.metadata.files("nvidia-cuda-nvcc") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "ptxas" and f.parent.name == "bin":
            return Path(str(f.locate()))
    found = shutil.which("ptxas")
    if found:
        return Path(found)
    raise MissingExtra(
        "checking GPU kernels needs NVIDIA's ptxas, which this environment lacks: pip install 'tilefarm[cuda]' (it "
        "brings the nvidia-cuda-nvcc wheel), or set TILEFARM_PTXAS to a ptxas executable"
    )


def parse_report(text: str) -> dict[str, PtxasReport]:
    """The per-kernel reports in ptxas -v's output, by kernel name."""
    reports: dict[str, PtxasReport] = {}
    kernel = arch = None
    fields: dict[str, int] = {}

    def close() -> None:
        if kernel is not None and arch is not None:
            reports[kernel] = PtxasReport(kernel, arch, **fields)

    for line in text.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            close()
            kernel, arch = entry.groups()
            fields = {"registers": 0}
            continue
        frame = _FRAME.search(line)
        if frame:
            stack, stores, loads = map(int, frame.groups())
            fields.update(stack_frame_bytes=stack, spill_store_bytes=stores, spill_load_bytes=loads)
        used = _USED.search(line)
        if used:
            fields["registers"] = int(used.group(1))
            for pattern, name in ((_BARRIERS, "barriers"), (_SMEM, "shared_bytes")):
                m = pattern.search(line)
                if m:
                    fields[name] = int(m.group(1))
    close()
    return reports


def assemble(ptx: str, kernel: str, arch: str) -> tuple[bytes, PtxasReport]:
    """Run `ptxas -arch=<arch> -v` on `ptx` (whose entry is `kernel`): the cubin and ptxas's report on the kernel.
    Raises PtxasError with ptxas's message when it refuses the PTX."""
    ptxas = find_ptxas()
    with tempfile.TemporaryDirectory(prefix="tilefarm-ptxas-") as tmp:
        src, out = Path(tmp) / f"{kernel}.ptx", Path(tmp) / f"{kernel}.cubin"
        src.write_text(ptx)
        cmd = [str(ptxas), f"-arch={arch}", "-v", str(src), "-o", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PTXAS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PtxasError(kernel, arch, f"ptxas ran past {PTXAS_TIMEOUT_S:.0f} s") from None
        except OSError as err:
            raise PtxasError(kernel, arch, f"cannot run {ptxas}: {err}") from None
        output = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise PtxasError(kernel, arch, output.strip().replace(str(src), f"{kernel}.ptx"))
        reports = parse_report(output)
        if kernel not in reports:
            raise PtxasError(kernel, arch, f"ptxas assembled the PTX but reported no entry {kernel!r}:\n{output}")
        return out.read_bytes(), reports[kernel]


@dataclass(frozen=True)
class Cubin:
    """One kernel assembled: its entry name, the cubin the driver loads without compiling, and ptxas's report."""

    kernel: str
    image: bytes
    report: PtxasReport


def assemble_program(program: GpuProgram) -> tuple[Cubin, ...]:
    """Every kernel launch of a compiled GPU program assembled for the architecture it was generated for."""
    out = []
    for k in program.kernels:
        image, report = assemble(k.ptx, k.name, k.arch.name)
        out.append(Cubin(k.name, image, report))
    return tuple(out)
