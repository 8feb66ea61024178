"""bench.search_ab: an A/B of a search switch tunes both arms per seed and times their bests side by side."""

from __future__ import annotations

import json

import pytest

from bench.search_ab import SWITCHES, main


def test_both_arms_are_tuned_and_timed_side_by_side(tmp_path, capsys):
    rows_path = tmp_path / "ab.json"
    main(
        ["--switch", "register_tiles", "--workload", "gemm_512", "--trials", "4", "--seeds", "0", "--population", "16",
         "--repeat", "1", "--records-dir", str(tmp_path), "--json", str(rows_path)]
    )  # fmt: skip
    rows = json.loads(rows_path.read_text())
    assert [(r["seed"], r["on"]) for r in rows] == [(0, False), (0, True)]
    for r in rows:
        assert r["median_ms"] > 0 and len(r["ratios"]) == 3 and r["ratio"] > 0 and r["measured"] >= 3
    assert rows[1]["over_budget"] == 0  # with the rule no measured program's register block spills
    out = capsys.readouterr().out
    assert "register_tiles=False: ratio to numpy-openblas median" in out
    assert "register_tiles=True: ratio to numpy-openblas median" in out


def test_the_switches_are_the_search_params_booleans_and_a_bad_workload_is_named(capsys):
    assert {"register_tiles", "lane_tiles", "ragged_rows", "unrolled_blocks"} <= set(SWITCHES)
    with pytest.raises(SystemExit) as e:
        main(["--switch", "register_tiles", "--workload", "gemm_7"])
    assert e.value.code == 2
    assert "no tuning workload named 'gemm_7'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--switch", "register_tiles", "--seeds", "0,one"])
    assert e.value.code == 2
    assert "--seeds: '0,one' is not a comma-separated list of integers" in capsys.readouterr().err
