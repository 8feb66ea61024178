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


class BuildError(TilefarmError):
    """Code generation or linking failed."""
