"""The native host entry of a CUDA artifact: C source, compiled into the artifact's `<name>.so`, that gives the same
`tilefarm_run(inputs, outputs, workspace)` as a CPU artifact's library, run on the GPU through the driver API.

On its first call it opens libcuda.so.1 (or `TILEFARM_LIBCUDA`) with dlopen, retains device 0's primary context,
loads every kernel's image (its cubin, else its PTX, embedded in the library), allocates one device buffer per input
and output, one for the weights (copied once) and one for the workspace. Each call copies the inputs to the device,
launches the kernels in plan order (meta.json's `calls`, each call's launches from the launches file) on their
buffers, waits, and copies the outputs back; the host `workspace` argument is not used. A failed driver call
returns CUDA_ERROR_CODE (meta.json's errors say so). Plans with control flow (If, Loop) are refused at build time:
their conditions would have to be read back from the device between launches.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from compiler.base.errors import BuildError

CUDA_ERROR_CODE = 1000  # tilefarm_run's result when a driver call failed (meta.json "errors" names it)
LOCATION_KINDS = {"input": 0, "output": 1, "param": 2}  # anything else is a workspace offset (3)

_PRELUDE = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
int tilefarm_num_threads = 0; /* the CPU artifact's knob; kept so one loader serves both */
extern const unsigned char tilefarm_params[];
typedef struct { int kind; int64_t at; } Loc;
typedef struct { int image; const char* name; unsigned grid[3], block[3], shared; int nargs; const Loc* args;
                 int workspace; } Launch;
static CUresult (*cuInit_)(unsigned);
static CUresult (*cuDeviceGet_)(int*, int);
static CUresult (*cuDevicePrimaryCtxRetain_)(void**, int);
static CUresult (*cuCtxSetCurrent_)(void*);
static CUresult (*cuModuleLoadData_)(void**, const void*);
static CUresult (*cuModuleGetFunction_)(void**, void*, const char*);
static CUresult (*cuMemAlloc_)(CUdeviceptr*, size_t);
static CUresult (*cuMemcpyHtoD_)(CUdeviceptr, const void*, size_t);
static CUresult (*cuMemcpyDtoH_)(void*, CUdeviceptr, size_t);
static CUresult (*cuLaunchKernel_)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   void*, void**, void**);
static CUresult (*cuCtxSynchronize_)(void);
"""

_BODY = r"""
static int ready = 0;
static void* functions[N_LAUNCHES];
static CUdeviceptr d_inputs[N_INPUTS + 1], d_outputs[N_OUTPUTS + 1], d_params, d_workspace;

#define BIND(sym, name) if (!(*(void**)&sym = dlsym(lib, name))) return 1
#define CHECK(call) if ((call) != 0) return CUDA_ERROR_CODE

static int bind(void) {
  const char* path = getenv("TILEFARM_LIBCUDA");
  void* lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 1;
  BIND(cuInit_, "cuInit"); BIND(cuDeviceGet_, "cuDeviceGet");
  BIND(cuDevicePrimaryCtxRetain_, "cuDevicePrimaryCtxRetain"); BIND(cuCtxSetCurrent_, "cuCtxSetCurrent");
  BIND(cuModuleLoadData_, "cuModuleLoadData"); BIND(cuModuleGetFunction_, "cuModuleGetFunction");
  BIND(cuMemAlloc_, "cuMemAlloc_v2"); BIND(cuMemcpyHtoD_, "cuMemcpyHtoD_v2"); BIND(cuMemcpyDtoH_, "cuMemcpyDtoH_v2");
  BIND(cuLaunchKernel_, "cuLaunchKernel"); BIND(cuCtxSynchronize_, "cuCtxSynchronize");
  return 0;
}

static int setup(void) {
  int device; void* ctx; void* modules[N_IMAGES];
  if (bind()) return CUDA_ERROR_CODE;
  CHECK(cuInit_(0)); CHECK(cuDeviceGet_(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain_(&ctx, device)); CHECK(cuCtxSetCurrent_(ctx));
  for (int i = 0; i < N_IMAGES; i++) CHECK(cuModuleLoadData_(&modules[i], images[i]));
  for (int k = 0; k < N_LAUNCHES; k++)
    CHECK(cuModuleGetFunction_(&functions[k], modules[launches[k].image], launches[k].name));
  for (int i = 0; i < N_INPUTS; i++) CHECK(cuMemAlloc_(&d_inputs[i], input_bytes[i] ? input_bytes[i] : 1));
  for (int i = 0; i < N_OUTPUTS; i++) CHECK(cuMemAlloc_(&d_outputs[i], output_bytes[i] ? output_bytes[i] : 1));
  CHECK(cuMemAlloc_(&d_params, PARAMS_BYTES ? PARAMS_BYTES : 1));
  if (PARAMS_BYTES) CHECK(cuMemcpyHtoD_(d_params, tilefarm_params, PARAMS_BYTES));
  CHECK(cuMemAlloc_(&d_workspace, WORKSPACE_BYTES ? WORKSPACE_BYTES : 1));
  ready = 1;
  return 0;
}

static CUdeviceptr where(Loc l) {
  switch (l.kind) {
    case 0: return d_inputs[l.at];
    case 1: return d_outputs[l.at];
    case 2: return d_params + (CUdeviceptr)l.at;
    default: return d_workspace + (CUdeviceptr)l.at;
  }
}

size_t tilefarm_workspace_bytes(void) { return 64; }
int64_t tilefarm_output_rows(const void* workspace, int output) { (void)workspace; return output_rows[output]; }

int tilefarm_run(void* const* inputs, void* const* outputs, void* workspace) {
  (void)workspace;
  if (!ready) { int rc = setup(); if (rc) return rc; }
  for (int i = 0; i < N_INPUTS; i++) CHECK(cuMemcpyHtoD_(d_inputs[i], inputs[i], input_bytes[i]));
  for (int k = 0; k < N_LAUNCHES; k++) {
    const Launch* l = &launches[k];
    CUdeviceptr values[MAX_ARGS + 1];
    void* params[MAX_ARGS + 1];
    for (int a = 0; a < l->nargs; a++) { values[a] = where(l->args[a]); params[a] = &values[a]; }
    params[l->nargs] = NULL; /* the driver reads as many as the kernel takes; NULL ends them for other readers */
    CHECK(cuLaunchKernel_(functions[k], l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2],
                          l->shared, NULL, params, NULL));
  }
  CHECK(cuCtxSynchronize_());
  for (int i = 0; i < N_OUTPUTS; i++) CHECK(cuMemcpyDtoH_(outputs[i], d_outputs[i], output_bytes[i]));
  return 0;
}
"""


def _nbytes(spec: dict) -> int:
    return int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize


def host_entry_source(meta: dict, launches: dict, images: list[str]) -> str:
    """The C host entry of an artifact whose meta.json is `meta` (its inputs, outputs, call plan, workspace and
    weights sizes) and launches file `launches`; `images` are the launch names whose image (cubin or PTX) is
    symbol tilefarm_image<k> (data_source)."""
    index = {n: i for i, n in enumerate(images)}
    rows, n_args = [], 0
    arg_tables = []
    for c in meta["calls"]:
        kernel = launches["kernels"][c["kernel"]]
        nparams = len(kernel["params"])
        for launch in kernel["launches"]:
            locs = list(c["args"][:nparams]) + ([c["args"][nparams]] if launch["takes_workspace"] else [])
            table = f"args{len(arg_tables)}"
            cells = ",".join(f"{{{LOCATION_KINDS.get(kind, 3)},{int(at)}}}" for kind, at in locs)
            arg_tables.append(f"static const Loc {table}[] = {{{cells or '{0,0}'}}};")
            grid, block = ",".join(map(str, launch["grid"])), ",".join(map(str, launch["block"]))
            rows.append(
                f'{{{index[launch["name"]]},"{launch["name"]}",{{{grid}}},{{{block}}},{launch["shared_bytes"]},'
                f"{len(locs)},{table},{int(launch['takes_workspace'])}}}"
            )
            n_args = max(n_args, len(locs))
    ins = [_nbytes(s) for s in meta["inputs"]]
    outs = [_nbytes(s) for s in meta["outputs"]]
    defines = {
        "N_IMAGES": len(images), "N_LAUNCHES": len(rows), "N_INPUTS": len(ins), "N_OUTPUTS": len(outs),
        "MAX_ARGS": n_args, "PARAMS_BYTES": meta["params_bytes"], "WORKSPACE_BYTES": meta["workspace_bytes"],
        "CUDA_ERROR_CODE": CUDA_ERROR_CODE,
    }  # fmt: skip
    parts = [
        _PRELUDE,
        *(f"#define {k} {v}ULL" if k.endswith("BYTES") else f"#define {k} {v}" for k, v in defines.items()),
    ]
    parts += [f"extern const unsigned char tilefarm_image{i}[];" for i in range(len(images))]
    parts.append(
        f"static const void* images[] = {{{','.join(f'tilefarm_image{i}' for i in range(len(images))) or '0'}}};"
    )
    parts += arg_tables
    parts.append(f"static const Launch launches[] = {{{','.join(rows) or '{0}'}}};")
    parts.append(f"static const size_t input_bytes[] = {{{','.join(map(str, ins)) or '0'}}};")
    parts.append(f"static const size_t output_bytes[] = {{{','.join(map(str, outs)) or '0'}}};")
    rows_of = (str(o["shape"][0] if o["shape"] else 1) for o in meta["outputs"])
    parts.append(f"static const int64_t output_rows[] = {{{','.join(rows_of) or '0'}}};")
    parts.append(_BODY)
    return "\n".join(parts)


def data_source(images: list[str]) -> str:
    """Assembler that embeds the weights (params.bin, 64-byte aligned at tilefarm_params) and each kernel image file
    (tilefarm_image<k>, NUL-terminated: the driver reads PTX as a C string) in the library's read-only data."""
    lines = [".section .rodata", ".balign 64", ".globl tilefarm_params", "tilefarm_params:", '.incbin "params.bin"']
    for k, path in enumerate(images):
        lines += [".balign 64", f".globl tilefarm_image{k}", f"tilefarm_image{k}:", f'.incbin "{path}"', ".byte 0"]
    return "\n".join([*lines, '.section .note.GNU-stack,"",@progbits', ""])


def link_host_entry(folder: Path, name: str, meta: dict, has_control_flow: bool) -> str:
    """Compile the host entry of the artifact in `folder` (its launches file, kernel images and weights written by
    cuda/artifact.py, `meta` its meta.json without sha256) into `<name>.so` there; returns that file's name. Raises
    BuildError for a plan with control flow or outputs no kernel writes, or naming the C compiler's complaint."""
    if has_control_flow:
        raise BuildError(
            "a CUDA artifact cannot run a model with If or Loop nodes yet: their conditions live on the GPU"
        )
    written = {at for c in meta["calls"] for kind, at in c["args"] if kind == "output"}
    unwritten = [o["name"] for k, o in enumerate(meta["outputs"]) if k not in written]
    if (
        unwritten
    ):  # the CPU entry copies these (an input, a constant or a repeated value); this one cannot say from where
        raise BuildError(
            f"a CUDA artifact cannot give outputs no kernel writes yet (a model input, a constant or another output "
            f"returned as is): {', '.join(map(repr, unwritten))}"
        )
    launches = json.loads((folder / f"{name}.launches.json").read_text())
    files = {x["name"]: x.get("cubin", x["ptx"]) for k in launches["kernels"].values() for x in k["launches"]}
    (folder / "cuda_entry.c").write_text(host_entry_source(meta, launches, list(files)))
    (folder / "data.S").write_text(data_source(list(files.values())))
    library = f"{name}.so"
    cmd = [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", "-o", library, "cuda_entry.c", "data.S", "-ldl"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=folder)
    except OSError as err:
        raise BuildError(f"cannot run the C compiler {cmd[0]!r}: {err}") from None
    if proc.returncode != 0:
        raise BuildError(f"compiling the CUDA host entry failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    return library
