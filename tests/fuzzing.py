"""What the differential fuzzers share: how many cases they draw and hypothesis's settings for them. CI draws the same
cases every run; a run by hand with TILEFARM_FUZZ_EXAMPLES set draws that many new ones."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

BY_HAND = "TILEFARM_FUZZ_EXAMPLES" in os.environ
FUZZ_EXAMPLES = int(os.environ.get("TILEFARM_FUZZ_EXAMPLES", "0")) or None  # None: each fuzzer's CI share


def fuzz_settings(ci_examples: int, share: int = 1) -> settings:
    """Hypothesis settings for a fuzzer: `ci_examples` cases in CI, else TILEFARM_FUZZ_EXAMPLES // `share` (a fuzzer
    split over `share` tests)."""
    examples = max(1, FUZZ_EXAMPLES // share) if FUZZ_EXAMPLES else ci_examples
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                    derandomize=not BY_HAND)  # fmt: skip
