"""Per-op report of the ONNX conformance suite (tests/test_conformance.py), printed after the run.

Each conformance test records its ONNX op types with `record_property`; user_properties travel with the report
from xdist workers to the controller, so the table is built from reports, never from worker state."""

from __future__ import annotations

import collections

OUTCOMES = ("passed", "failed", "skipped")
_by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_cases: collections.Counter = collections.Counter()


def _outcome(report) -> str | None:
    """The test's outcome from the one report that decides it (a setup skip or error, else the call)."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        return "failed" if report.failed else report.outcome
    return None


def pytest_runtest_logreport(report):
    ops = dict(report.user_properties).get("onnx_ops")
    outcome = _outcome(report)
    if ops is None or outcome is None:
        return
    _cases[outcome] += 1
    for op in ops:
        _by_op[op][outcome] += 1


def pytest_terminal_summary(terminalreporter):
    if not _cases:
        return
    write = terminalreporter.write_line
    terminalreporter.section("ONNX conformance per op (a case counts once for each op type in its graph)")
    width = max(len(op) for op in _by_op)
    write(f"{'op':<{width}}  " + "  ".join(f"{o:>7}" for o in OUTCOMES))
    for op in sorted(_by_op):
        write(f"{op:<{width}}  " + "  ".join(f"{_by_op[op][o]:>7}" for o in OUTCOMES))
    write(f"{'cases':<{width}}  " + "  ".join(f"{_cases[o]:>7}" for o in OUTCOMES))
