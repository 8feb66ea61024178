"""What code is generated for: a `Target` record (kind, LLVM triple, CPU name and features, cores, vector width,
cache sizes) and the host fingerprint a tuning record's timing is valid for. Which host this process runs on, and
what a target kind's hardware can do, each backend says (compiler.targets)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

DEFAULT_L3_BYTES = 32 << 20  # the last-level cache assumed where sysfs does not give its size


@dataclass(frozen=True)
class Target:
    """A code generation target: the processor code is tuned for and the sizes schedules are sized against."""

    kind: str = "cpu"
    triple: str = ""
    mcpu: str = "generic"
    features: str = ""
    cores: int = 1
    vector_bytes: int = 16
    cache_line: int = 64
    l1_bytes: int | None = None
    l2_bytes: int | None = None
    l3_bytes: int | None = None
    cpu_model: str = ""
    mattr: str = ""  # the feature edits a target string made ("-mattr=+a,-b"), part of its name; features has them

    def has(self, feature: str) -> bool:
        """True if LLVM feature `feature` (e.g. "avx512f") is enabled."""
        return f"+{feature}" in self.features.split(",")

    def fingerprint(self) -> str:
        """Stable short hash of what a timing depends on: CPU model, LLVM cpu name and features, core count."""
        key = "|".join((self.kind, self.cpu_model, self.mcpu, self.features, str(self.cores)))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def __str__(self):
        return f"{self.kind}:{self.mcpu}x{self.cores}"
