"""Typed errors; each message names what the user must fix."""


class TilefarmError(Exception):
    """Base of every error tilefarm raises on purpose."""


class UnsupportedDType(TilefarmError):
    pass


class InvalidExpr(TilefarmError):
    """A tensor expression that cannot be computed (bad shape, reduction without axis, …)."""


class IllegalStep(TilefarmError):
    """A transform step that cannot be applied to the current State."""

    def __init__(self, index: int | None, step: object, why: str):
        self.index, self.step, self.why = index, step, why
        where = f"step {index} " if index is not None else "step "
        super().__init__(f"{where}{step}: {why}")


class LoweringError(TilefarmError):
    """A State that cannot be turned into loop IR (e.g. a stage computed where its consumers cannot see it)."""


class UnknownPass(TilefarmError):
    """A graph pass asked to be turned off that is not one of passes.OPTIONAL_PASSES."""


class InvalidTarget(TilefarmError):
    """A target tilefarm cannot build code for (a CPU or feature LLVM does not know, another architecture), or that
    this host cannot time code for (an AVX-512 target on an AVX2 host; TILEFARM_CPU_FEATURES naming a feature it
    lacks)."""


class MissingExtra(TilefarmError):
    """An optional dependency a feature needs is not installed; the message names the extra that brings it."""


class BuildError(TilefarmError):
    """Code generation or linking failed."""


class InvalidModel(TilefarmError):
    """A model that is not valid ONNX, or whose shapes cannot be made static; the message says what to fix."""


class UnsupportedOp(TilefarmError):
    """Operators tilefarm cannot compile. `ops` maps every offending op type (with its domain when not the default
    one) to the names of its nodes, so one error lists all of them; `notes` say why where it is not just the op.
    `shape_bound`: every op listed is one tilefarm has, refused only because a value it needs at compile time (a
    shape, a slice bound) is computed at run time."""

    def __init__(self, ops: dict[str, list[str]], notes: list[str] | tuple[str, ...] = (), shape_bound: bool = False):
        self.ops = {op: list(names) for op, names in ops.items()}
        self.notes = list(notes)
        self.shape_bound = shape_bound
        listing = "; ".join(f"{op} ({'nodes' if len(n) > 1 else 'node'} {', '.join(n)})" for op, n in ops.items())
        message = f"the model uses {len(ops)} unsupported operator type{'s' if len(ops) != 1 else ''}: {listing}"
        super().__init__("\n  ".join([message, *self.notes]))


class InvalidProgram(TilefarmError):
    """A (sketch, decisions) pair that does not give a legal program."""
