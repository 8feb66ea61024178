"""What a target kind must provide: the `Backend` protocol. The compiler outside `targets/` reaches a kind's hardware
only through it: a new kind is one folder here implementing it, plus a line in `compiler.targets.BACKENDS`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from compiler.base.target import Target
from compiler.costs.measure import Builder, Runner
from compiler.schedule.loopir import Func
from compiler.schedule.state import State
from compiler.tensor.dag import ComputeDAG


class SearchSpace(Protocol):
    """One task's programs on a target: its sketches (the kind's sketch rules) and their annotation and mutation
    (the kind's annotation rules), for the evolutionary search. Decisions are the kind's own, opaque outside it."""

    sketches: tuple[Any, ...]

    def sample(self, sketch: int, rng: Any) -> tuple[Any, State]:
        """Random decisions for sketch `sketch` and their program; raises InvalidProgram."""

    def materialize(self, sketch: int, decisions: Any) -> State:
        """The program these decisions make of sketch `sketch`; raises InvalidProgram."""

    def mutate(self, sketch: int, decisions: Any, state: State, rng: Any) -> Any | None:
        """New decisions one mutation away (None where the drawn mutation does not apply)."""

    def keeps(self, sketch: int, child: State, parent: State) -> bool:
        """Whether a mutated program stays in the space the kind's rules draw from (given its parent's program)."""

    def decisions_from_json(self, data: Any) -> Any:
        """Decisions from their JSON form in a record's trace."""

    def rename_stages(self, decisions: Any, rename: Callable[[str], str | None]) -> Any | None:
        """The decisions with every stage name mapped by `rename` (a sibling task's stages), None if one has none."""


class Backend(Protocol):
    """A target kind: its host, its search space, its code generator, builder and runner, and its artifact's code."""

    kind: str
    alignment: int  # bytes every buffer a kernel gets (weights, workspace, inputs) starts on
    library_env: Mapping[str, str]  # environment the artifact's library runs with (meta.json's "environment")

    def host(self) -> Target:
        """The target of this kind this process runs on; `Target.fingerprint()` names the host class of a timing."""

    def check_runs_here(self, target: Target, host: Target | None = None) -> None:
        """Raise InvalidTarget unless `host` (default: this process's) can run code built for `target`, naming why."""

    def runtime_requirements(self, target: Target) -> dict:
        """What a machine must report to run `target`'s code, written into the artifact for its loader to check
        (compiler.artifact.runtime: "cpuinfo_flags", LLVM feature -> the /proc/cpuinfo flag that says it is there)."""

    def search_space(self, dag: ComputeDAG, target: Target, params: Any) -> SearchSpace:
        """The task's search space on `target`, shaped by the search's SearchParams."""

    def default_schedule(self, dag: ComputeDAG, target: Target | None = None) -> State:
        """The rule-based schedule, used untuned and as every candidate's reference."""

    def builder(self, **options: Any) -> Builder:
        """Builds candidates into code loadable here (its options: parallelism, timeout, the target to build for,
        which this host must be able to run)."""

    def runner(self, **options: Any) -> Runner:
        """Checks candidates against the default schedule and times them (options: repeat, cache flush, threads…)."""

    def keeps_cached(self, nbytes: int) -> bool:
        """Whether `nbytes` read over and over stay cached on this host (timing a model's weights warm or cold)."""

    def compile_kernels(self, funcs: Sequence[Func], target: Target | None = None) -> Mapping[str, Callable]:
        """Kernels callable on numpy arrays in this process (tests and `run_in_process`)."""

    def scratch_bytes(self, func: Func) -> int:
        """Bytes of the workspace the kernel takes as its last argument (0: none)."""

    def link_artifact(
        self, funcs: Sequence[Func], entry_c: str, params: bytes, folder: Path, name: str, target: Target | None = None
    ) -> Path:
        """The artifact's library `name`.so in `folder` with code for `target` (default: this host): the kernels, the
        C entry point that calls them, and the weights (`params`, 64-byte aligned at symbol tilefarm_params)."""
