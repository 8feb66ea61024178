"""tvmc's Python driver API (TVM's `from tvm.driver import tvmc`): a tvmc tutorial's script runs with its import line
changed to `import tilefarm as tvmc`.

    model = tilefarm.load("resnet18.onnx", shape_dict={"input": [1, 3, 224, 224]})
    model.summary()                                               # inputs, outputs, operators, tasks
    records = tilefarm.tune(model, target="llvm", trials=2000)    # the records file it wrote
    package = tilefarm.compile(model, target="llvm", tuning_records=records, package_path="resnet18.tar")
    result = tilefarm.run(package, device="cpu", repeat=10)
    print(result)                                                 # tvmc's timing summary and the outputs' names

Each call is the command line's (`load` as `compile` reads a model, `tune` through `tilefarm tune`'s own code, with its
progress), so what docs/cli.md says of the commands holds here; docs/tvmc.md maps tvmc's arguments onto tilefarm's.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from compiler.artifact.runtime import Artifact
from compiler.base.errors import InvalidModel, TilefarmError
from compiler.model import load_any
from compiler.targets import parse_target

# ---------------------------------------------------------------------------------------------------------- model


class Model:
    """A loaded model (tvmc's TVMCModel): its graph, what it came from, and the records its last `tune` wrote,
    which `compile` then uses unless told other records."""

    def __init__(self, graph, source: str, shape_dict: dict[str, list[int]] | None = None):
        self.graph, self.source, self.shape_dict = graph, source, shape_dict
        self.tuning_records: str | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def _dir(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tilefarm-model-")
        return Path(self._tmp.name)

    def default_tuning_records_path(self) -> str:
        """Where `tune` writes when given no path (a temporary folder that lives as long as the model)."""
        return str(self._dir() / "tuning_records.json")

    def default_package_path(self) -> str:
        """Where `compile` writes when given no package_path."""
        return str(self._dir() / "model_package.tar")

    def summary(self, file=None) -> None:
        """Print the model's inputs, outputs, operators and the tasks it compiles to (tvmc prints its Relay IR)."""
        from collections import Counter

        from compiler.tensor.tasks import kernel_calls, plan_tasks

        g = self.graph
        tasks, calls, _ = plan_tasks(g)
        lines = [f"{self.source}: {len(g.nodes)} nodes", "inputs:"]
        lines += [f"  {v.name}: {v.dtype}{list(v.shape)}" for v in g.inputs]
        lines += ["outputs:", *(f"  {v.name}: {v.dtype}{list(v.shape)}" for v in g.outputs)]
        lines.append("ops: " + ", ".join(f"{op} x{n}" for op, n in Counter(n.op for n in g.nodes).most_common()))
        gflop = sum(t.flop_count * t.weight for t in tasks) / 1e9
        lines.append(f"{len(tasks)} tasks ({len(kernel_calls(calls))} kernel calls), {gflop:.3f} GFLOP:")
        lines += [f"  {i:3d} {t.name:<28} x{t.weight}  {t.flop_count / 1e6:10.2f} MFLOP" for i, t in enumerate(tasks)]
        print("\n".join(lines), file=file)

    def __repr__(self) -> str:
        return f"Model({self.source!r}, inputs={[f'{v.name}{list(v.shape)}' for v in self.graph.inputs]})"


def load(path_or_module, shape_dict: Mapping[str, Sequence[int]] | None = None, model_format: str | None = None):
    """A model from a file (ONNX; PyTorch where that import is in), ONNX bytes or ModelProto, or a PyTorch module;
    `shape_dict` fixes input shapes ({name: shape}), as `--input-shapes` does."""
    shapes = {name: [int(d) for d in shape] for name, shape in shape_dict.items()} if shape_dict else None
    if isinstance(path_or_module, str | Path) and not Path(path_or_module).exists():
        raise InvalidModel(f"no such model file: {path_or_module}")
    graph = load_any(path_or_module, shapes, model_format)
    source = str(path_or_module) if isinstance(path_or_module, str | Path) else type(path_or_module).__name__
    return Model(graph, source, shapes)


# ---------------------------------------------------------------------------------------------------------- tune


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """tvmc's tutorials tune at a script's top level, with no `if __name__ == "__main__":` guard, since TVM's workers
    never import the main module. tilefarm's start from multiprocessing's forkserver, which runs the main module
    again in each one unless it has neither a file nor a module name: both are hidden while tuning. Nothing a worker
    is sent comes from the script (it gets a model's tasks and their schedules)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def tune(
    model: Model,
    target: str = "llvm",
    trials: int = 1000,
    tuning_records: str | Path | None = None,
    prior_records: str | Path | None = None,
    enable_autoscheduler: bool = True,
    early_stopping: int | None = None,
    repeat: int = 1,
    number: int = 3,
    min_repeat_ms: int = 100,
    timeout: int = 10,
    time_budget: float | None = None,
    threads: int | None = None,
    seed: int = 0,
) -> str:
    """Tune the model's tasks as `tilefarm tune` does (its progress printed) and return the records file:
    `tuning_records`, appended to (resumed from where it exists already: no program is measured twice), or a
    temporary one the model keeps for `compile`. `prior_records`: earlier records to start from (they join the
    output's). `enable_autoscheduler` changes nothing: the auto-scheduler is tilefarm's only tuner."""
    from tilefarm import cli

    for name, value, least in (("trials", trials, 1), ("repeat", repeat, 1), ("number", number, 1)):
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    out = str(tuning_records or model.default_tuning_records_path())
    args = cli.build_parser().parse_args(["tune", model.source, "--records", out, "--target", target])
    args.trials, args.early_stopping, args.time_budget, args.threads, args.seed = (
        trials, early_stopping, time_budget, threads, seed
    )  # fmt: skip
    args.repeat, args.number, args.min_repeat_ms, args.timeout = repeat, number, min_repeat_ms, timeout
    args.tuning_records = str(prior_records) if prior_records else None
    args.resume = Path(out).exists()
    with _main_module_hidden():
        code = cli.tune_graph(model.graph, model.source, args)
    if code:
        raise TilefarmError(f"tuning {model.source} failed: every measurement failed (see the messages above)")
    model.tuning_records = out
    return out


# ---------------------------------------------------------------------------------------------------------- compile


class Package:
    """A compiled model (tvmc's TVMCPackage): the artifact at `package_path`, loaded and ready to run."""

    def __init__(self, package_path: str | Path):
        self.package_path = str(package_path)
        self.artifact = Artifact.load(package_path)

    @property
    def meta(self) -> dict:
        return self.artifact.meta

    @property
    def records(self) -> list[dict]:
        """The tuning records compiled in, one per task that had one (meta.json's `records`)."""
        return self.meta["records"]

    def __repr__(self) -> str:
        return f"Package({self.package_path!r}, {len(self.meta['tasks'])} tasks, {len(self.records)} from records)"


def compile(
    model: Model,
    target: str = "llvm",
    tuning_records: str | Path | None = None,
    package_path: str | Path | None = None,
    disabled_passes: Sequence[str] = (),
) -> Package:
    """Compile the model into an artifact at `package_path` (else a temporary file the model keeps) with the best
    of `tuning_records` per task (else the records of the model's last `tune`, if any; else default schedules)."""
    from compiler.artifact.build import build
    from compiler.costs.records import JSONLinesDatabase

    host = parse_target(target)
    records = tuning_records if tuning_records is not None else model.tuning_records
    if records is not None and not Path(records).exists():
        raise TilefarmError(f"no such records file: {records}")
    path = str(package_path or model.default_package_path())
    name = Path(path).stem.replace("-", "_").replace(".", "_") or "model"
    database = JSONLinesDatabase(records) if records is not None else None
    build(model.graph, path, name=name, records=database, disabled_passes=disabled_passes, target=host)
    return Package(path)


# ---------------------------------------------------------------------------------------------------------- run


class Result:
    """What `run` gives (tvmc's TVMCResult): `outputs` by the model's output names, and `times`, the seconds of each
    timed repeat (each the mean of `number` runs)."""

    def __init__(self, outputs: dict[str, np.ndarray], times: list[float], profile: list[dict] | None = None):
        self.outputs, self.times, self.profile = outputs, times, profile

    def format_times(self) -> str:
        return format_times(self.times)

    def get_output(self, name: str) -> np.ndarray:
        """An output by its name, or by tvmc's `output_<i>`."""
        if name not in self.outputs and name.startswith("output_") and name[7:].isdigit():
            return list(self.outputs.values())[int(name[7:])]
        return self.outputs[name]

    def save(self, output_path: str | Path) -> None:
        save_outputs(output_path, self.outputs)

    def __str__(self) -> str:
        return f"{self.format_times()}\n\nOutput Names:\n {list(self.outputs)}"


def run(
    package: Package | str | Path,
    device: str = "cpu",
    inputs: Mapping[str, np.ndarray] | None = None,
    fill_mode: str = "random",
    repeat: int = 10,
    number: int = 1,
    profile: bool = False,
    end_to_end: bool = False,
) -> Result:
    """Run a package (or an artifact's path) on `inputs` (those not given: filled by `fill_mode`), timing `repeat`
    repeats of `number` runs each. `end_to_end` changes nothing: an artifact's inputs are in host memory, so every
    timing counts the whole call. `profile`: also time every kernel (Result.profile, as `run --profile`)."""
    if isinstance(package, str | Path):
        package = Package(package)
    if not isinstance(package, Package):
        raise TilefarmError(f"run takes a Package (tilefarm.compile gives one) or an artifact's path, not {package!r}")
    if device != "cpu":
        raise TilefarmError(f"device {device!r}: tilefarm's artifacts run on this CPU (device='cpu')")
    if repeat < 1 or number < 1:
        raise ValueError(f"repeat and number must be at least 1, got {repeat} and {number}")
    art = package.artifact
    full = fill_inputs(art.meta["inputs"], dict(inputs or {}), fill_mode)
    outputs = art.run(full)
    times = time_runs(art, full, repeat, number)
    return Result(outputs, times, art.profile(full) if profile else None)


def fill_inputs(specs: list[dict], given: dict[str, np.ndarray], fill_mode: str = "random") -> dict[str, np.ndarray]:
    """The inputs of a run: those given, the rest filled with zeros, ones or random values (seeded: the same each
    run). A name the model does not take is refused: its data would be ignored."""
    names = [s["name"] for s in specs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise TilefarmError(f"{', '.join(unknown)}: not inputs of the model (it takes {', '.join(names)})")
    if fill_mode not in ("random", "zeros", "ones"):
        raise ValueError(f"fill_mode must be random, zeros or ones, not {fill_mode!r}")
    rng = np.random.default_rng(0)
    full = {}
    for s in specs:
        if s["name"] in given:
            full[s["name"]] = given[s["name"]]
        elif fill_mode == "random":
            full[s["name"]] = rng.standard_normal(s["shape"]).astype(s["dtype"])
        else:
            full[s["name"]] = (np.zeros if fill_mode == "zeros" else np.ones)(s["shape"], s["dtype"])
    return full


def time_runs(art: Artifact, inputs: dict[str, np.ndarray], repeat: int, number: int = 1) -> list[float]:
    """Seconds of each of `repeat` timings, each the mean of `number` runs."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            art.run(inputs)
        times.append((time.perf_counter() - t) / number)
    return times


def format_times(times: Sequence[float]) -> str:
    """tvmc's timing summary: mean, median, max, min and standard deviation in ms, in its layout (scripts read it)."""
    ms = np.asarray(times, dtype=np.float64) * 1e3
    heads = ("mean (ms)", "median (ms)", "max (ms)", "min (ms)", "std (ms)")
    values = (ms.mean(), np.median(ms), ms.max(), ms.min(), ms.std())
    rows = " ".join(f"{h:^12}" for h in heads), " ".join(f"{v:^12.4f}" for v in values)
    return "Execution time summary:\n" + "\n".join(rows)


def top_results(outputs: dict[str, np.ndarray], n: int) -> str:
    """Each output's `n` largest values with their flat indices, largest first (`run --print-top N`)."""
    lines = []
    for name, a in outputs.items():
        flat = a.reshape(-1)
        top = np.argsort(flat, kind="stable")[::-1][:n]
        lines.append(f"{name} top {len(top)}: " + ", ".join(f"[{i}] {flat[i]:.6g}" for i in top))
    return "\n".join(lines)


def save_outputs(path: str | Path, outputs: dict[str, np.ndarray]) -> None:
    """The outputs as an .npz, each under its name and under tvmc's `output_<i>` too (tvmc's scripts read those)."""
    arrays = dict(outputs)
    for i, a in enumerate(outputs.values()):
        arrays.setdefault(f"output_{i}", a)
    np.savez(path, **arrays)


TVMCModel, TVMCPackage, TVMCResult = Model, Package, Result  # tvmc's names, for scripts that use them
