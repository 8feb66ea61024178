"""The `tilefarm` command."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.model.optimize import OPTIONAL_PASSES
from compiler.schedule import hand_schedules
from compiler.schedule.lower import infer_bound, lower
from compiler.schedule.state import apply_steps, initial_state, step_from_record
from compiler.targets import host_target
from compiler.targets.cpu.codegen import assembly, compile_funcs, emit_shared_library, llvm_ir
from compiler.targets.cpu.host import FEATURES_ENV
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import CONV_FORM_MODES, WEIGHT_MODES


def _gemm(shape: list[int]):
    m, n, k = (shape + [shape[-1]] * 3)[:3] if shape else (512, 512, 512)
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    return [A, B], ops.matmul(A, B, name="C"), lambda a, b: [a.astype(np.float64) @ b], hand_schedules.gemm


def _conv2d(shape: list[int]):
    n, c, h, w, f = shape if len(shape) == 5 else (1, 64, 56, 56, 64)
    data, weight = te.placeholder((n, c, h, w), name="data"), te.placeholder((f, c, 3, 3), name="weight")
    out = ops.conv2d_nchw(data, weight, padding=1, name="conv")
    return [data, weight], out, lambda d, wt: [ops.reference_conv2d(d, wt, padding=1)], hand_schedules.conv2d


BUILDERS = {"gemm": _gemm, "conv2d": _conv2d}


def _kernel(name: str, shape: list[int]):
    if name in BUILDERS:
        return BUILDERS[name](shape)
    if name not in ops.KERNELS:
        raise SystemExit(f"unknown kernel {name!r}; choose from {', '.join([*BUILDERS, *ops.KERNELS])}")
    case = ops.KERNELS[name]
    inputs, outputs = case.build()
    return inputs, outputs[0], case.reference, None


def cmd_kernel(args: argparse.Namespace) -> int:
    """Schedule one kernel, print its loop nest, JIT it, check it against numpy and time it."""
    inputs, output, reference, hand = _kernel(args.name, [int(x) for x in args.shape.split(",")] if args.shape else [])
    dag = ComputeDAG([*inputs, output])
    if args.schedule == "naive":
        state = initial_state(dag)
    elif args.schedule == "hand":
        if hand is None:
            raise SystemExit(f"no hand-written schedule for {args.name}; use naive or a steps JSON file")
        state = hand(dag)
    else:
        try:
            records = json.loads(Path(args.schedule).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"error: cannot read the schedule {args.schedule!r}: {e}") from None
        if not isinstance(records, list):
            raise SystemExit(f"error: {args.schedule} must hold a JSON list of step records")
        steps = [step_from_record(r) for r in records]
        state = apply_steps(dag, steps)
    print(f"workload {dag.workload_key}  {dag.flop_count / 1e9:.3f} GFLOP  target {host_target().mcpu}")
    print(infer_bound(state))
    func = lower(state, args.name)
    if args.show in ("loopir", "llvm", "asm"):
        print(
            {"loopir": lambda: str(func), "llvm": lambda: llvm_ir([func]), "asm": lambda: assembly([func])}[args.show]()
        )
    built = compile_funcs([func])
    kernel = built[func.name]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]
    out = np.zeros(output.shape, np.float32)
    kernel(*arrays, out)
    want = reference(*arrays)[0]
    err = float(np.max(np.abs(out - want)) / max(1.0, float(np.max(np.abs(want)))))
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        kernel(*arrays, out)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    threads = os.environ.get("TILEFARM_NUM_THREADS", "all")
    print(
        f"JIT {built.compile_seconds:.3f} s | max rel error vs numpy {err:.2e} | median {med * 1e3:.3f} ms"
        f" = {dag.flop_count / med / 1e9:.1f} GFLOP/s on {threads} threads"
    )
    if args.save_steps:
        Path(args.save_steps).write_text(json.dumps([s.record() for s in state.steps]))
    if args.emit_lib:
        print(f"shared library: {emit_shared_library([func], args.emit_lib)}")
    if err > 1e-3:
        print("error: the result does not match numpy", file=sys.stderr)
        return 1
    return 0


def _load_model(path: str, shapes: str | None, model_format: str | None = None):
    from tilefarm.interrupts import held_interrupts

    with held_interrupts():  # onnx's C++ extension loads here: a Ctrl-C inside it aborted the process
        import onnx  # noqa: F401

        from compiler.model import load_any
        from compiler.model.onnx_import import parse_input_shapes

    if not Path(path).exists():
        raise SystemExit(f"error: no such model file: {path}")
    return load_any(path, parse_input_shapes(shapes) if shapes else None, model_format)


def _disable_pass_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--disable-pass",
        action="append",
        default=[],
        choices=OPTIONAL_PASSES,
        metavar="PASS",
        help=f"leave this graph pass out (repeatable; one of {', '.join(OPTIONAL_PASSES)}); tune and compile a model "
        "with the same ones, since the tasks, and so the records that fit them, change with the passes",
    )


def _model_format_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-format",
        choices=["onnx", "pytorch"],
        help="the model's format (default: by its file name; .onnx is ONNX, .pt, .pth and .pt2 are PyTorch)",
    )


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile an ONNX model into an artifact (.tar) runnable from Python or C."""
    from compiler.artifact.build import build
    from compiler.tensor.tasks import kernel_calls
    from tilefarm.progress import Phases

    target = _check_target(args.target)
    _print_feature_edits()
    t = time.perf_counter()
    records = _records_source(args)
    with Phases() as phase:
        phase("import the model")
        graph = _load_model(args.model, args.input_shapes, args.model_format)
        name = Path(args.output).stem.replace("-", "_") or "model"
        info = build(
            graph, args.output, name=name, records=records, disabled_passes=args.disable_pass, on_phase=phase,
            target=target,
        )  # fmt: skip
    print(
        f"compiled {args.model} -> {args.output}: {len(info.tasks)} tasks ({len(info.records_used)} from records), "
        f"{len(kernel_calls(info.calls))} kernel calls, {time.perf_counter() - t:.1f} s"
    )
    if info.forms:
        from compiler.model.passes import describe_forms

        print(f"convs in another form than the rule's, faster in the records: {describe_forms(info.forms)}")
    return 0


def _check_target(target: str, runs_here: bool = False) -> Target:
    """The Target of a tvmc target string ("llvm -mcpu=broadwell -mattr=-fma", "cuda -arch=sm_80"); with `runs_here`
    (tuning measures here), a CPU target this host can run the code of, or InvalidTarget names what it lacks. Another
    kind's runner refuses when it is asked to measure, after the search and the builder ran: a GPU's kernels are
    generated and checked by ptxas on any host."""
    from compiler.targets import check_runs_here, parse_target

    parsed = parse_target(target)
    if runs_here and parsed.kind == host_target().kind:
        check_runs_here(parsed)
    return parsed


def _records_source(args: argparse.Namespace):
    """The records named by --records FILE (which must exist) or --database URL; None when neither is given."""
    if args.records:
        from compiler.costs.records import JSONLinesDatabase

        if not Path(args.records).exists():
            raise SystemExit(f"error: no such records file: {args.records}")
        return JSONLinesDatabase(args.records)
    return _open_database(args.database) if args.database else None


def cmd_run(args: argparse.Namespace) -> int:
    """Run an artifact on inputs from an .npz file (random inputs if none), optionally timing it."""
    from compiler.artifact.runtime import Artifact
    from tilefarm.driver import fill_inputs, format_times, save_outputs, time_runs, top_results

    if Path(args.artifact).suffix.lower() == ".onnx":
        raise SystemExit(
            f"error: {args.artifact} is an ONNX model; `run` takes a compiled artifact: "
            f"tilefarm compile {args.artifact} -o {Path(args.artifact).with_suffix('.tar')}"
        )
    art = Artifact.load(args.artifact)
    given = _read_inputs(args.inputs, art.meta["inputs"]) if args.inputs else {}
    inputs = fill_inputs(art.meta["inputs"], given, args.fill_mode)
    filled = [name for name in inputs if name not in given]
    if args.inputs and filled:
        print(f"not in {args.inputs}, filled with {args.fill_mode} values (--fill-mode): {', '.join(filled)}")
    outputs = art.run(inputs)
    for name, a in outputs.items():
        summary = f"mean {float(np.mean(a)):.6g}  max {float(np.max(a)):.6g}" if a.size else "(no elements)"
        print(f"{name}: {a.dtype}{list(a.shape)}  {summary}")
    if args.print_top:
        print(top_results(outputs, args.print_top))
    if args.output:
        save_outputs(args.output, outputs)
    if args.print_time:
        print(format_times(time_runs(art, inputs, max(args.repeat, 1), args.number)))
    elif args.repeat:
        times = time_runs(art, inputs, args.repeat, args.number)
        print(f"median latency {statistics.median(times) * 1e3:.3f} ms over {args.repeat} runs")
    if args.profile:
        rows = art.profile(inputs)
        hot, in_run = sum(r["seconds"] for r in rows), sum(r["in_run"] for r in rows)
        print("   in run    share    alone  kernel  (alone: called repeatedly, caches hot; in run: as a run calls it)")
        for r in sorted(rows, key=lambda r: -r["in_run"]):
            share = 100 * r["in_run"] / in_run
            nodes = r.get("nodes", [])
            names = f"  ({', '.join(nodes[:3])}{f' +{len(nodes) - 3}' if len(nodes) > 3 else ''})" if nodes else ""
            print(f"{r['in_run'] * 1e3:9.3f} ms {share:5.1f}% {r['seconds'] * 1e3:8.3f} ms  {r['kernel']}{names}")
        print(f"{in_run * 1e3:9.3f} ms  100.0% {hot * 1e3:8.3f} ms  all kernels")
    return 0


def _read_inputs(path: str, specs: list[dict]) -> dict[str, np.ndarray]:
    """A run's inputs: an .npz with one array per input, or an .npy for a model of one input; each in its input's
    dtype (a different one is refused, naming both: casting float data to int, or int64 to float32, would change it)."""
    names = [i["name"] for i in specs]
    try:
        if path.endswith(".npy"):
            if len(specs) != 1:
                raise SystemExit(f"error: the model takes {len(specs)} inputs ({', '.join(names)}): give an .npz")
            inputs = {names[0]: np.load(path, allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as data:
                inputs = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError) as e:
        raise SystemExit(
            f"error: cannot read inputs {path!r} (an .npz with one array per input, or an .npy): {e}"
        ) from None
    unknown = sorted(set(inputs) - set(names))
    if unknown:  # a misnamed input would otherwise run on filled values, and its data be ignored
        raise SystemExit(
            f"error: {path} holds {', '.join(unknown)}, not inputs of the model (it takes {', '.join(names)})"
        )
    for spec in specs:
        a = inputs.get(spec["name"])
        if a is not None and a.dtype != np.dtype(spec["dtype"]):
            raise SystemExit(
                f"error: input {spec['name']!r} is {a.dtype} in {path} but the model takes {spec['dtype']}"
            )
    return inputs


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a model's operators and the tasks it compiles to (FLOPs, weights, workload keys); with --database or
    --records, also what the records already hold for each task on this host and the trials still needed."""
    from collections import Counter

    from compiler.costs.records import cache_preference, target_name
    from compiler.search.task_scheduler import coverage
    from compiler.tensor.tasks import constant_bytes, kernel_calls, plan_tasks

    target = _check_target(args.target)
    if args.trials_per_task <= 0:
        raise SystemExit("error: --trials-per-task must be positive")
    graph = _load_model(args.model, args.input_shapes)
    print(f"{args.model}: inputs {[f'{v.name}{list(v.shape)}' for v in graph.inputs]}, {len(graph.nodes)} nodes")
    print("ops: " + ", ".join(f"{op} x{n}" for op, n in Counter(n.op for n in graph.nodes).most_common()))
    tasks, calls, _ = plan_tasks(graph, args.disable_pass)
    print(
        f"{len(tasks)} tasks ({len(kernel_calls(calls))} kernel calls), "
        f"{sum(t.flop_count * t.weight for t in tasks) / 1e9:.3f} GFLOP"
    )
    head = f"{'ID':>3} {'workload key':32} {'weight':>6} {'MFLOP':>10}"
    rows = [f"{i:3d} {t.key} {t.weight:6d} {t.flop_count / 1e6:10.2f}" for i, t in enumerate(tasks)]
    db = _records_source(args)
    if db is None:
        print("\n".join([f"{head}  name", *(f"{row}  {t.name}" for row, t in zip(rows, tasks))]))
        return 0
    where = args.records or str(db)
    covered = coverage(tasks, db, target, args.trials_per_task, cache_preference(constant_bytes(calls), target))
    print(f"records in {where} for {target_name(target)} measured on this host ({target.fingerprint()}):")
    print(f"{head} {'records':>7} {'best ms':>10} {'trials needed':>13}  name")
    for row, c in zip(rows, covered):
        best = f"{c.best.mean_cost * 1e3:10.4f}" if c.best else f"{'-':>10}"
        print(f"{row} {c.valid:7d} {best} {c.trials_needed:13d}  {c.task.name}")
    needed = sum(c.trials_needed for c in covered)
    tuned = sum(1 for c in covered if c.trials_needed == 0)
    latency = sum(c.task.weight * c.best.mean_cost for c in covered if c.best)
    missing = sum(1 for c in covered if c.best is None)
    print(
        f"{tuned} of {len(covered)} tasks tuned ({args.trials_per_task} error-free records each); "
        f"{needed} trials still needed; latency from records {latency * 1e3:.3f} ms"
        + (f" ({missing} without a record: default schedules)" if missing else "")
    )
    if needed:
        source = f"--records {args.records}" if args.records else f"--database {where}"
        print(f"  tilefarm tune {args.model} {source} --resume --trials {needed}")
    return 0


def _tune_options(args: argparse.Namespace):
    from compiler.search.evolution import SearchParams
    from compiler.search.task_scheduler import TuneOptions

    if args.trials <= 0:
        raise SystemExit("error: --trials must be positive")
    if args.retime_best < 0:
        raise SystemExit("error: --retime-best must be 0 or more")
    return TuneOptions(
        trials=args.trials,
        measures_per_round=args.per_round,
        time_budget=args.time_budget,
        early_stopping=args.early_stopping,
        seed=args.seed,
        params=SearchParams(population=args.population),
        share_siblings=not args.no_sibling_sharing,
        retime_best=args.retime_best,
    )


def _open_database(url: str):
    """The SQL records database at `url` (server/ is imported only here: the file-only CLI never needs it)."""
    import getpass

    from server.database import SQLDatabase

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return SQLDatabase(url, created_by=user)


def _run_tuning(tasks, args: argparse.Namespace, choices=(), graph=None) -> int:
    from compiler.costs.records import JSONLinesDatabase
    from compiler.search.task_scheduler import TaskScheduler
    from compiler.targets import backend_for
    from tilefarm.progress import TuneProgress, budget_note, estimate_line

    target = _check_target(getattr(args, "target", "llvm"), runs_here=True)  # tune-kernel has no --target
    if target.kind == "cuda":  # on a GPU, its records are keyed by the GPU, as the farm's GPU workers key theirs
        from compiler.targets.cuda.fingerprint import tuning_target

        target = tuning_target(target)
    if args.database:
        db = _open_database(args.database)
        db.describe_workloads(tasks)
    else:
        db = JSONLinesDatabase(args.records)
    where = args.records or str(db)
    if args.tuning_records:
        _take_prior(db, args, where)
    progress = TuneProgress(args.trials, args.time_budget)
    model = _cost_model(args, db if args.database else None, target)
    backend = backend_for(target)
    with (
        backend.builder(target=target) as builder,
        backend.runner(
            repeat=args.repeat,
            number=args.number,
            min_repeat_ms=args.min_repeat_ms,
            timeout=args.timeout,
            threads=args.threads,
            cache_flush=args.cache_flush,
            cold_constants=args.weights == "cold",
        ) as runner,
    ):
        sched = TaskScheduler(
            tasks, db, _tune_options(args), model=model, builder=builder, runner=runner, callback=progress,
            choices=choices, target=target, model_timer=_model_timer(graph, db, target, args),
        )  # fmt: skip
        if args.resume:
            loaded = bool(args.model_file) and Path(args.model_file).exists()
            print(f"resumed {sched.resume(train=not loaded)} records from {where}")
        note = budget_note(sched.first_round_trials(), [p.task.weight for p in sched.progress], args.trials)
        if note and not args.time_budget:
            print(note, flush=True)
        with progress:
            sched.run()
    print(sched.table())
    st = sched.stats
    shares = ", ".join(f"{k} {v:.0%}" for k, v in st.shares().items())
    errors = ", ".join(f"{k} {v}" for k, v in sorted(st.errors.items())) or "none"
    retimed = f"; the fastest timed {st.retimed} more times at the end" if st.retimed else ""
    print(f"{st.trials} trials in {st.wall_s:.1f} s ({shares}); errors: {errors}{retimed}; records: {where}")
    if not math.isfinite(sched.estimated_latency):
        print(estimate_line(sched, args.trials, args.time_budget))
    if args.model_file and hasattr(model, "save"):
        model.save(args.model_file)
        print(f"cost model saved to {args.model_file}")
    if st.trials and sum(st.errors.values()) >= st.trials:
        print(f"error: every one of the {st.trials} measurements failed ({errors}): see the messages above",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _model_timer(graph, db, target, args: argparse.Namespace):
    """What times the model compiled with the records so far while it is tuned (TaskScheduler's model_timer): a model
    tuned on this host, unless --no-model-timing; None for a kernel (tune-kernel has no model)."""
    if graph is None or getattr(args, "no_model_timing", False) or target.kind != host_target().kind:
        return None  # a model for another kind of hardware (a GPU) does not run on this host's CPU
    from compiler.artifact.in_model import time_in_model

    disabled = tuple(args.disable_pass or ())

    def timer(rounds: int, untuned: bool = False):
        records = None if untuned else db
        return time_in_model(graph, records, target, args.threads, disabled_passes=disabled, rounds=rounds)

    return timer


def _take_prior(db, args: argparse.Namespace, where: str) -> None:
    """tvmc's `tune --tuning-records PRIOR`: the prior file's records join those of the output (a record held already
    is skipped, so the output alone gives compile the best of both), and tuning resumes from them: no program of
    theirs is measured again, and the cost model starts trained on them."""
    from compiler.costs.records import read_records

    prior = Path(args.tuning_records)
    if not prior.exists():
        raise SystemExit(f"error: no such records file: {prior}")
    if args.records and prior.resolve() == Path(args.records).resolve():
        added = 0
    else:
        added = db.import_file(prior) if args.database else db.import_records(read_records(prior))
    print(f"prior records {prior}: {added} new to {where}; tuning resumes from them")
    args.resume = True


def _cost_model(args: argparse.Namespace, database=None, target=None):
    """The model named by the options; with a SQL database (and no --model-file or --no-transfer), an XGBoost model
    whose prior is pre-trained on every record of the tuning target's host class (default: this host's) in that
    database."""
    from compiler.costs.cost_model import RandomModel, XGBModel
    from compiler.costs.records import RecordError

    if args.cost_model == "random":
        return RandomModel(args.seed)
    if args.model_file and Path(args.model_file).exists():
        try:
            return XGBModel.load(args.model_file)
        except (OSError, ValueError, KeyError) as e:
            raise RecordError(f"cannot load the cost model {args.model_file}: {e}") from None
    prior = None
    if database is not None and not args.no_transfer:
        from compiler.search.transfer import ModelCache

        prior, line = ModelCache().load_or_train(database, database.identity, target or host_target())
        print(line, flush=True)
    return XGBModel(seed=args.seed, prior=prior)


def _print_feature_edits() -> None:
    """Say so where TILEFARM_CPU_FEATURES narrows the code: its records are filed apart from the host's own."""
    edits = os.environ.get(FEATURES_ENV, "").strip()
    if edits:
        host = host_target()
        print(f"code for {host.mcpu} with {edits} ({FEATURES_ENV}): records filed under host {host.fingerprint()}")


def cmd_tune(args: argparse.Namespace) -> int:
    """Tune every task of an ONNX model; records go to a JSON-lines file that `compile --records` uses."""
    from compiler.search.task_scheduler import refuse_unguarded_main

    refuse_unguarded_main()  # before the model's summary, which a worker importing the script would print again
    return tune_graph(_load_model(args.model, args.input_shapes, args.model_format), args.model, args)


def tune_graph(graph, label: str, args: argparse.Namespace) -> int:
    """Tune a loaded model (`label` names it in what is printed) with the options of `tilefarm tune`."""
    from compiler.search.task_scheduler import weights_timed_cold
    from compiler.tensor.tasks import FORM_MARGIN, constant_bytes, kernel_calls, tuning_plan, weights_arrive_cold

    _check_target(args.target, runs_here=True)
    plan = tuning_plan(graph, args.disable_pass, args.conv_forms)
    print(f"{label}: {len(plan.tasks)} tasks, {len(kernel_calls(plan.calls))} kernel calls")
    _print_feature_edits()
    if plan.choices:
        print(
            f"{len(plan.choices)} convs can be compiled in another form: {len(plan.other_forms)} more tasks tuned "
            "beside the model's (weight 0 until faster); compile takes the other form where it is faster by more "
            f"than {FORM_MARGIN:.0%}"
        )
    if args.weights == "auto":
        l3 = host_target().l3_bytes
        args.weights = "cold" if weights_timed_cold("auto", plan.calls, l3) else "warm"
        mb, l3_mb = constant_bytes(plan.calls) / 2**20, (l3 or 0) / 2**20
        measured = args.weights == "cold" and not weights_arrive_cold(plan.calls, l3)
        kept = ", not kept cached here (measured)" if measured else ""
        print(f"weights {mb:.1f} MiB, last-level cache {l3_mb:.0f} MiB{kept}: kernels timed with weights", args.weights)
    return _run_tuning(plan.all_tasks, args, plan.choices, graph)


def cmd_tune_kernel(args: argparse.Namespace) -> int:
    """Tune one kernel (gemm, conv2d or a test kernel) at a given shape."""
    from compiler.tensor.tasks import Task

    inputs, output, _, _ = _kernel(args.name, [int(x) for x in args.shape.split(",")] if args.shape else [])
    dag = ComputeDAG([*inputs, output])
    _print_feature_edits()
    return _run_tuning([Task(dag.workload_key, dag, args.name)], args)


def cmd_db(args: argparse.Namespace) -> int:
    """Manage the SQL records database: `upgrade` brings its schema to this tilefarm's newest revision."""
    from server.database import SQLDatabase
    from server.migrate import head_revision

    with SQLDatabase(args.database, upgrade_schema=True) as db:
        print(f"{db}: schema at revision {head_revision()}")
    return 0


def cmd_records(args: argparse.Namespace) -> int:
    """Export records to a JSON-lines file with their provenance, or import one (importing twice adds nothing)."""
    from compiler.costs.records import read_records

    if args.action == "import" and not Path(args.file).exists():
        raise SystemExit(f"error: no such records file: {args.file}")
    if args.action == "export" and args.records and not Path(args.records).exists():
        raise SystemExit(f"error: no such records file: {args.records}")
    if args.records:
        from compiler.costs.records import JSONLinesDatabase

        db = JSONLinesDatabase(args.records)
    else:
        db = _open_database(args.database)
    where = args.records or str(db)
    if args.action == "export":
        n = db.export(args.output, best_only=args.best_only)
        print(f"exported {n} {'best ' if args.best_only else ''}records from {where} to {args.output}")
    else:
        added = db.import_records(read_records(args.file)) if args.records else db.import_file(args.file)
        print(f"imported {args.file} into {where}: {added} new records")
    return 0


def cmd_example(args: argparse.Namespace) -> int:
    """Write a ready-made ONNX model (random weights) to try tilefarm with, no download needed."""
    from tilefarm import examples

    if args.name not in examples.EXAMPLES:
        raise SystemExit(f"error: unknown example {args.name!r}; choose from {', '.join(examples.EXAMPLES)}")
    examples.save(args.name, args.output)
    print(f"wrote {args.output}")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    """quantize an ONNX model to int8 with onnxruntime's tools (static QDQ calibrated on your inputs, or dynamic)"""
    from tilefarm.quantize import quantize

    calibration = Path(args.calibration) if args.calibration else None
    report = quantize(Path(args.model), Path(args.output), calibration, args.per_channel, args.method, args.dynamic)
    print(f"wrote {args.output}")
    for line in report:
        print(f"  {line}")
    return 0


def _at_least(lowest: int):
    """An argparse type: an integer no smaller than `lowest`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {value}")
        return value

    return parse


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilefarm")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The `tilefarm` command's parser: tilefarm's own options and, beside them, tvmc's (docs/tvmc.md)."""
    from compiler.search.task_scheduler import TRIALS_PER_TASK
    from tilefarm.remote import add_remote_parser
    from tilefarm.serve import add_serve_parser

    p = argparse.ArgumentParser(prog="tilefarm", description="a deep-learning compiler with an auto-scheduler")
    p.add_argument("--version", action="version", version=f"tilefarm {_version()}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (also TILEFARM_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernel", help=cmd_kernel.__doc__)
    k.add_argument("name", help=f"one of: {', '.join([*BUILDERS, *ops.KERNELS])}")
    k.add_argument("--shape", help="gemm: M,N,K; conv2d (3x3, pad 1): N,C,H,W,F")
    k.add_argument("--schedule", default="hand", help="naive, hand, or a JSON file of step records")
    k.add_argument("--show", choices=["loopir", "llvm", "asm"], help="also print this stage")
    k.add_argument("--repeat", type=_at_least(1), default=10)
    k.add_argument("--save-steps", help="write the schedule's step records (JSON) here")
    k.add_argument("--emit-lib", help="also link the kernel into this shared library")
    c = sub.add_parser("compile", help=cmd_compile.__doc__)
    c.add_argument("model")
    c.add_argument("--input-shapes", help='fix symbolic dims, e.g. "input:[1,3,224,224],mask:[1,128]"')
    c.add_argument(
        "--target",
        default="llvm",
        help="code generation target: llvm (this host's CPU), llvm -mcpu=NAME, cuda [-arch=sm_80|sm_90]",
    )
    rec = c.add_mutually_exclusive_group()
    rec.add_argument("--records", help="tuning records (JSON lines): the best per task replaces the default schedule")
    rec.add_argument("--tuning-records", dest="records", metavar="RECORDS", help="tvmc's name for --records")
    rec.add_argument("--database", metavar="URL", help="take the records from this SQL database instead")
    c.add_argument("-o", "--output", required=True, help="artifact path (.tar)")
    _model_format_option(c)
    _disable_pass_option(c)
    r = sub.add_parser("run", help=cmd_run.__doc__)
    r.add_argument("artifact")
    r.add_argument("--inputs", help=".npz with one array per model input, or .npy for one input (default: random)")
    r.add_argument("-o", "--output", "--outputs", help="write outputs to this .npz (each also as tvmc's output_<i>)")
    r.add_argument(
        "--repeat",
        type=_at_least(0),
        default=0,
        help="time this many runs and print the median (with --print-time: tvmc's summary of them)",
    )
    r.add_argument("--number", type=_at_least(1), default=1, help="each timing is the mean of this many runs")
    r.add_argument(
        "--print-time", action="store_true", help="print tvmc's timing summary: mean, median, max, min, std in ms"
    )
    r.add_argument("--print-top", type=_at_least(1), metavar="N", help="print each output's N largest values")
    r.add_argument(
        "--fill-mode",
        choices=["random", "zeros", "ones"],
        default="random",
        help="inputs not given by --inputs: random (seeded), zeros or ones",
    )
    r.add_argument("--device", choices=["cpu"], default="cpu", help="where it runs: an artifact runs on this CPU")
    r.add_argument(
        "--end-to-end",
        action="store_true",
        help="tvmc: time the inputs' transfer too; an artifact's inputs are in host memory, so every timing counts "
        "the whole call anyway",
    )
    r.add_argument("--profile", action="store_true", help="time every kernel call")
    i = sub.add_parser("inspect", help=cmd_inspect.__doc__)
    i.add_argument("model")
    i.add_argument("--input-shapes")
    i.add_argument("--target", default="llvm", help="the target records must be for (this host's CPU: llvm)")
    _disable_pass_option(i)
    src = i.add_mutually_exclusive_group()
    src.add_argument("--records", help="report what this JSON-lines records file holds per task")
    src.add_argument("--database", metavar="URL", help="report what this SQL database holds per task")
    i.add_argument(
        "--trials-per-task",
        type=int,
        default=TRIALS_PER_TASK,
        help="a task counts as tuned once it has this many error-free records for this target measured on a host "
        "with this machine's fingerprint; trials still needed = this minus the records it has, never below 0 "
        f"(default {TRIALS_PER_TASK})",
    )
    for name, fn in (("tune", cmd_tune), ("tune-kernel", cmd_tune_kernel)):
        t = sub.add_parser(name, help=fn.__doc__)
        if name == "tune":
            t.add_argument("model")
            t.add_argument("--input-shapes")
            t.add_argument(
                "--target",
                default="llvm",
                help="the target to tune for: llvm (this host's CPU), cuda [-arch=sm_80|sm_90]",
            )
            _model_format_option(t)
            _disable_pass_option(t)
            t.add_argument(
                "--conv-forms",
                choices=CONV_FORM_MODES,
                default="measure",
                help="measure (default): tune each 3x3 stride-1 conv in its other form too (direct against Winograd "
                "F(4x4), or F(2x2) against direct for small images), and compile takes the faster; rule: tune only "
                "the form the winograd_convs pass gives by rule",
            )
        else:
            t.add_argument("name", help=f"one of: {', '.join([*BUILDERS, *ops.KERNELS])}")
            t.add_argument("--shape", help="gemm: M,N,K; conv2d (3x3, pad 1): N,C,H,W,F")
        t.add_argument("--trials", type=_at_least(1), default=1000, help="measurement budget over all tasks")
        t.add_argument(
            "--time-budget", type=float, help="measure new programs for this many seconds (then --retime-best)"
        )
        dest = t.add_mutually_exclusive_group(required=True)
        dest.add_argument("--records", help="JSON-lines records file (appended to)")
        dest.add_argument(
            "-o", "--output", dest="records", metavar="RECORDS", help="tvmc's --records (.json: JSON lines)"
        )
        dest.add_argument("--database", metavar="URL", help="SQL database (sqlite:///file, postgresql://...)")
        t.add_argument(
            "--tuning-records",
            metavar="PRIOR",
            help="earlier records to start from (tvmc's option): they join the output's and tuning resumes from them",
        )
        t.add_argument(
            "--enable-autoscheduler",
            action="store_true",
            help="accepted for tvmc's command lines: the auto-scheduler is tilefarm's only tuner",
        )
        t.add_argument(
            "--resume",
            action="store_true",
            help="continue from the records; no program is measured again (but for --retime-best at the end)",
        )
        t.add_argument(
            "--threads", type=_at_least(1), help="threads kernels run on while measured (default: all cores)"
        )
        t.add_argument("--per-round", type=_at_least(1), default=64, help="programs measured per round")
        t.add_argument("--population", type=_at_least(2), default=512, help="evolutionary search population")
        t.add_argument(
            "--early-stopping", type=_at_least(1), help="stop a task after this many trials without improvement"
        )
        t.add_argument(
            "--retime-best",
            type=int,
            default=3,
            metavar="K",
            help="when tuning ends, time each task's K fastest programs again, side by side, so that its best rests "
            "on more than one lucky timing (0: off)",
        )
        t.add_argument("--repeat", type=_at_least(1), default=1, help="timed repeats per program (of >= 100 ms each)")
        t.add_argument("--number", type=_at_least(1), default=3, help="calls per timed repeat, at the least")
        t.add_argument(
            "--min-repeat-ms", type=_at_least(0), default=100, help="calls per repeat until they take this many ms"
        )
        t.add_argument(
            "--timeout", type=_at_least(1), default=10, help="seconds one program's measurement may take at most"
        )
        t.add_argument(
            "--cache-flush",
            action="store_true",
            help="time each call after overwriting the caches (weights arrive cold, as in a whole model)",
        )
        t.add_argument(
            "--weights",
            choices=WEIGHT_MODES,
            default="auto",
            help="cold: flush the model's weights (only) from the caches before each timed call, as a run of a model "
            "whose weights exceed the last-level cache meets them; auto (default): cold exactly then",
        )
        t.add_argument("--seed", type=_at_least(0), default=0)
        if name == "tune":
            t.add_argument(
                "--no-model-timing",
                action="store_true",
                help="never compile and time the whole model while tuning (by default it is timed after the first "
                "round of every task, each quarter of the trials and at the end, and the estimate follows its run)",
            )
        t.add_argument(
            "--no-sibling-sharing",
            action="store_true",
            help="tune every task alone (by default tasks of one anchor shape, e.g. a conv under two epilogues, "
            "try each other's best programs)",
        )
        t.add_argument("--cost-model", choices=["xgb", "random"], default="xgb", help="random: ablation baseline")
        t.add_argument("--model-file", help="load the XGBoost cost model from here if it exists; save it after")
        t.add_argument(
            "--no-transfer",
            action="store_true",
            help="with --database: start the cost model from scratch instead of pre-training it on the database's "
            "records of this host (cached, refreshed as records arrive)",
        )
    d = sub.add_parser("db", help=cmd_db.__doc__)
    d.add_argument("action", choices=["upgrade"])
    d.add_argument("--database", metavar="URL", help="default: TILEFARM_DATABASE_URL, else ~/.local/share/tilefarm")
    rs = sub.add_parser("records", help=cmd_records.__doc__).add_subparsers(dest="action", required=True)
    ex = rs.add_parser("export", help="write records as JSON lines (each with its host's details and who ran it)")
    im = rs.add_parser("import", help="add a JSON-lines file's records; records already held are skipped")
    im.add_argument("file", help="an export, or a `tune --records` file")
    for a in (ex, im):
        where = a.add_mutually_exclusive_group(required=True)
        where.add_argument("--database", metavar="URL", help="the SQL database to read from / add to")
        where.add_argument("--records", help="a JSON-lines records file instead (holds no host details)")
    ex.add_argument("-o", "--output", required=True, help="the JSON-lines file to write")
    ex.add_argument("--best-only", action="store_true", help="only the fastest record per workload, target and host")
    qz = sub.add_parser("quantize", help=cmd_quantize.__doc__)
    qz.add_argument("model", help="the float ONNX model")
    qz.add_argument("--calibration", metavar="NPZ", help="one array per model input, N samples along the first axis")
    qz.add_argument("--per-channel", action="store_true", help="weights quantized per output channel")
    qz.add_argument("--method", choices=("minmax", "entropy", "percentile"), default="minmax", help="calibration")
    qz.add_argument("--dynamic", action="store_true", help="dynamic quantization (no calibration needed)")
    qz.add_argument("-o", "--output", required=True, help="the int8 ONNX model to write")
    e = sub.add_parser("example", help=cmd_example.__doc__)
    e.add_argument("name")
    e.add_argument("-o", "--output", required=True)
    add_serve_parser(sub)
    add_remote_parser(sub)
    sub.add_parser("worker", help="start a measurement-farm worker (Celery); see tilefarm worker --help")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # the worker's options are its own (workers/worker.py), --help included
        from workers.worker import main as worker_main

        return worker_main(argv[1:])
    args = build_parser().parse_args(argv)
    commands = {
        "kernel": cmd_kernel,
        "compile": cmd_compile,
        "run": cmd_run,
        "inspect": cmd_inspect,
        "tune": cmd_tune,
        "tune-kernel": cmd_tune_kernel,
        "example": cmd_example,
        "quantize": cmd_quantize,
        "db": cmd_db,
        "records": cmd_records,
    }
    try:
        output = getattr(args, "output", None)
        if output:  # a missing folder for what a command writes is made, not a traceback
            Path(output).parent.mkdir(parents=True, exist_ok=True)
        return args.func(args) if "func" in args else commands[args.command](args)
    except (TilefarmError, OSError) as e:
        if args.debug or os.environ.get("TILEFARM_DEBUG") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was stored stays (records are written as each batch is measured)
        if args.debug or os.environ.get("TILEFARM_DEBUG") == "1":
            raise
        print(f"\ninterrupted: tilefarm {args.command} stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
