"""``mmfeed compare``: crafted regressions are caught, noise is not, unreadable files exit 2."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from mmfeed.bench.compare import ReportError, compare, figures, format_comparison, load_report, phase_of


def bench_report(samples: float = 200.0, stall: float = 0.01, decode: float = 0.05, *, spread: float = 0.0,
                 settings: dict | None = None) -> dict:
    """A report shaped like ``mmfeed bench --json``: figures, per-repeat values (median +- spread), baseline."""
    def reps(x: float) -> list[float]:
        return [x * (1 - spread), x, x * (1 + spread)]

    return {
        "benchmark": "mmfeed bench",
        "samples_per_s": samples, "tokens_per_s": samples * 1000, "frames_per_s": samples * 4,
        "packing_efficiency": 0.93, "stall_fraction": stall, "wait_s": 0.002,
        "stage_s": {"read": 0.0001, "decode": decode, "collate": 0.01},
        "repeats": {"samples_per_s": reps(samples), "tokens_per_s": reps(samples * 1000),
                    "frames_per_s": reps(samples * 4), "stall_fraction": reps(stall), "stage_s.decode": reps(decode)},
        "baseline": {"samples_per_s": 40.0, "stall_fraction": 0.6, "stage_s": {"decode": 0.5}},
        "ratios": {"samples_per_s": samples / 40.0},
        "settings": settings or {"workers": 2, "capacity": 8192},
        "environment": {"git_revision": "abc123", "cpu_count": 2},
    }


def run_compare(tmp_path, base, new, *extra: str) -> subprocess.CompletedProcess:
    a, b = tmp_path / "base.json", tmp_path / "new.json"
    for path, doc in ((a, base), (b, new)):
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return subprocess.run([sys.executable, "-m", "mmfeed", "compare", str(a), str(b), *extra], capture_output=True,
                          text=True, timeout=60)


def test_throughput_down_30_percent_is_a_regression_exit_1(tmp_path):
    out = run_compare(tmp_path, bench_report(200.0), bench_report(140.0))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "REGRESSED" in out.stdout and "samples_per_s" in out.stdout
    result = compare(bench_report(200.0), bench_report(140.0))
    assert {"samples_per_s", "tokens_per_s", "frames_per_s"} <= set(result.regressed)


def test_stall_up_is_a_regression_exit_1(tmp_path):
    out = run_compare(tmp_path, bench_report(stall=0.01), bench_report(stall=0.10))
    assert out.returncode == 1, out.stdout + out.stderr
    assert compare(bench_report(stall=0.01), bench_report(stall=0.10)).regressed == ["stall_fraction"]


def test_stage_time_up_is_a_regression():
    assert compare(bench_report(decode=0.05), bench_report(decode=0.08)).regressed == ["stage_s.decode"]


def test_three_percent_wobble_within_tolerance_exits_0(tmp_path):
    base = bench_report(200.0, stall=0.010, decode=0.050)
    new = bench_report(194.0, stall=0.0103, decode=0.0515)  # every figure 3% worse
    out = run_compare(tmp_path, base, new, "--tolerance", "0.1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no regression" in out.stdout


def test_drop_beyond_tolerance_but_within_observed_spread_is_noise_not_regression():
    """-15% median change, but the repeats of both runs spread by +-20%: not a regression; the same medians with
    tight repeats are one."""
    noisy = compare(bench_report(200.0, spread=0.2), bench_report(170.0, spread=0.2))
    assert "samples_per_s" not in noisy.regressed
    status = {c.name: c.status for c in noisy.changes}
    assert status["samples_per_s"] == "noise"
    tight = compare(bench_report(200.0, spread=0.005), bench_report(170.0, spread=0.005))
    assert "samples_per_s" in tight.regressed


def test_repeats_medians_are_compared_not_the_headline_value():
    base = bench_report(200.0)
    new = bench_report(200.0)
    new["repeats"]["samples_per_s"] = [120.0, 130.0, 125.0]  # the median of the repeats fell 37%
    assert figures(new)["samples_per_s"].value == 125.0
    assert "samples_per_s" in compare(base, new).regressed


def test_tiny_stall_change_below_the_absolute_floor_is_not_a_regression():
    result = compare(bench_report(stall=0.002), bench_report(stall=0.004))  # +100%, but 0.2 points
    assert result.regressed == []
    strict = compare(bench_report(stall=0.002), bench_report(stall=0.004), min_stall=0.001)
    assert strict.regressed == ["stall_fraction"]


def test_baseline_and_ratio_figures_are_shown_but_never_fail():
    base, new = bench_report(), bench_report()
    new["baseline"]["samples_per_s"] = 10.0
    new["baseline"]["stall_fraction"] = 0.99
    new["ratios"]["samples_per_s"] = 0.5
    result = compare(base, new)
    assert result.regressed == []
    kinds = {c.name: c.kind for c in result.changes}
    assert kinds["baseline.samples_per_s"] == kinds["ratios.samples_per_s"] == "info"
    assert "baseline.samples_per_s" in format_comparison(result)


def test_improvement_is_reported_and_exits_0(tmp_path):
    out = run_compare(tmp_path, bench_report(200.0), bench_report(300.0))
    assert out.returncode == 0
    assert {c.name: c.status for c in compare(bench_report(200.0), bench_report(300.0)).changes}["samples_per_s"] \
        == "improved"


def test_settings_that_differ_are_reported_not_refused(tmp_path):
    new = bench_report(settings={"workers": 4, "capacity": 8192})
    out = run_compare(tmp_path, bench_report(), new)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "settings that differ" in out.stdout and "workers: 2 -> 4" in out.stdout
    assert compare(bench_report(), new).settings == [("workers", 2, 4)]


def test_figures_in_one_report_only_are_listed_without_failing():
    base, new = bench_report(), bench_report()
    new["stage_s"]["pack"] = 0.2
    del base["stage_s"]["read"]
    status = {c.name: c.status for c in compare(base, new).changes}
    assert status["stage_s.pack"] == "only in new" and status["stage_s.read"] == "only in new"
    assert compare(new, base).regressed == []


def test_packing_benchmark_rows_are_judged_by_unit():
    rows = [{"name": "bfd lognormal n=1e+06", "value": 50.0, "unit": "M seq/s"},
            {"name": "block_mask(), 1x8192, 200 docs", "value": 2.0, "unit": "ms"},
            {"name": "bfd rows over lower bound lognormal n=1e+06", "value": 0.01, "unit": "%"},
            {"name": "python bfd lognormal n=1e+06 (baseline)", "value": 1.0, "unit": "M seq/s"}]
    base = {"rows": rows, "settings": {"capacity": 8192}}
    new = copy.deepcopy(base)
    assert compare(base, new).regressed == []
    new["rows"][0]["value"] = 35.0   # throughput -30%
    new["rows"][1]["value"] = 4.0    # 2 ms -> 4 ms (above the 1 ms floor)
    new["rows"][2]["value"] = 0.5    # the gap is a quality figure: info
    new["rows"][3]["value"] = 0.1    # the pure-Python baseline: info
    assert compare(base, new).regressed == ["bfd lognormal n=1e+06", "block_mask(), 1x8192, 200 docs"]


@pytest.mark.parametrize("content, why", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ("[1, 2, 3]", "JSON object"),
    ('{"name": "x", "settings": {"workers": 2}}', "no numeric figures"),
    ('{"samples_per_s": 1.0, "repeats": {"samples_per_s": "fast"}}', "list of numbers"),
    ('{"rows": [{"value": 3}]}', r"rows\[0\]"),
])
def test_unreadable_reports_raise_a_clear_error(tmp_path, content, why):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReportError, match=why):
        load_report(path)


@pytest.mark.slow  # several console-script processes
def test_unreadable_files_exit_2_with_one_line(tmp_path):
    good = bench_report()
    for bad in ("{not json", "[1]"):
        out = run_compare(tmp_path, good, bad)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.strip().count("\n") == 0 and out.stderr.startswith("mmfeed: error:")
        assert "Traceback" not in out.stderr
    missing = subprocess.run([sys.executable, "-m", "mmfeed", "compare", str(tmp_path / "nope.json"),
                              str(tmp_path / "base.json")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_negative_tolerance_is_an_argument_error(tmp_path):
    out = run_compare(tmp_path, bench_report(), bench_report(), "--tolerance", "-0.1")
    assert out.returncode == 2 and "--tolerance" in out.stderr and "Traceback" not in out.stderr


# -- phases: which part of the step regressed -----------------------------------------------------------------
def scaling_report(compute: float = 0.050, comm: float = 0.004, wait: float = 0.0002, *, spread: float = 0.01) -> dict:
    """A report shaped like ``mmfeed bench scaling --measure --json``: one row of figures per world size, each
    figure's per-stretch values (median +- spread) under ``measured.repeats``."""
    rows, repeats = [], {}
    for world in (1, 2):
        row = {"name": f"w{world}", "world_size": world, "step_s": wait + compute + comm * (world - 1),
               "wait_s": wait, "copy_s": None, "compute_s": compute, "comm_s": comm * (world - 1),
               "comm_total_s": comm * (world - 1), "stall_fraction": wait / (wait + compute),
               "stage_s": {"decode": 0.004}, "efficiency": 1.0}
        rows.append(row)
        for key in ("step_s", "wait_s", "compute_s", "comm_s", "comm_total_s", "stall_fraction"):
            repeats[f"w{world}.{key}"] = [row[key] * (1 - spread), row[key], row[key] * (1 + spread)]
        repeats[f"w{world}.stage_s.decode"] = [0.004, 0.004, 0.004]
    return {"benchmark": "mmfeed bench scaling --measure", "measured": {"world_sizes": [1, 2], "rows": rows,
                                                                        "repeats": repeats},
            "settings": {"compute_ms": compute * 1e3}}


def test_every_figure_gets_its_phase_from_its_name():
    assert [phase_of(name) for name in ("wait_s", "stall_fraction", "stage_s.decode", "stages.read.mean_s",
                                        "copy_s", "compute_s", "gpu_compute_s", "comm_s", "comm_total_s",
                                        "ranks.max.comm_s.mean", "step_s", "samples_per_s", "packing_efficiency")] \
        == ["input", "input", "input", "input", "copy", "compute", "compute", "comm", "comm", "comm", None, None,
            None]
    phases = {name: f.phase for name, f in figures(bench_report()).items()}
    assert phases["wait_s"] == phases["stall_fraction"] == phases["stage_s.decode"] == "input"
    assert phases["samples_per_s"] is None and phases["baseline.stall_fraction"] == "input"
    measured = figures(scaling_report())
    assert measured["measured.w2.compute_s"].phase == "compute" and measured["measured.w2.comm_s"].phase == "comm"
    assert measured["measured.w2.compute_s"].samples == (0.0495, 0.05, 0.0505)  # the stretches, as noise
    assert "measured.w2.copy_s" not in measured  # None on CPU: not a figure


def test_regressed_phase_is_named_with_its_worst_figure(tmp_path):
    base, slow = scaling_report(compute=0.050), scaling_report(compute=0.0605)  # +21%
    result = compare(base, slow)
    assert result.regressed_phases == ["compute"]
    assert {"measured.w1.compute_s", "measured.w2.compute_s", "measured.w2.step_s"} <= set(result.regressed)
    assert "regressed: compute (measured.w1.compute_s +21%)" in format_comparison(result)
    out = run_compare(tmp_path, base, slow)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "regressed: compute (measured.w" in out.stdout and "+21%)" in out.stdout
    assert "regressed: comm" not in out.stdout and "regressed: input" not in out.stdout


def test_phases_are_listed_worst_first_and_improvements_name_none():
    result = compare(scaling_report(compute=0.050, comm=0.004), scaling_report(compute=0.058, comm=0.008))
    assert result.regressed_phases == ["comm", "compute"]  # +100% before +16%
    text = format_comparison(result)
    assert text.index("regressed: comm (measured.w2.comm") < text.index("regressed: compute")
    faster = compare(scaling_report(compute=0.050), scaling_report(compute=0.035))
    assert faster.regressed_phases == [] and "regressed:" not in format_comparison(faster)
    assert {c.name: c.status for c in faster.changes}["measured.w2.compute_s"] == "improved"


def test_a_phase_within_the_stretches_spread_is_noise_and_names_nothing(tmp_path):
    """+21% compute, but the stretches of both runs spread by +-25%: noise, no phase named, exit 0; the same change
    with tight stretches names compute."""
    noisy = compare(scaling_report(compute=0.050, spread=0.25), scaling_report(compute=0.0605, spread=0.25))
    assert noisy.regressed_phases == [] and noisy.regressed == []
    assert {c.name: c.status for c in noisy.changes}["measured.w2.compute_s"] == "noise"
    out = run_compare(tmp_path, scaling_report(compute=0.050, spread=0.25), scaling_report(compute=0.0605,
                                                                                           spread=0.25))
    assert out.returncode == 0 and "regressed:" not in out.stdout, out.stdout
    assert compare(scaling_report(compute=0.050, spread=0.02),
                   scaling_report(compute=0.0605, spread=0.02)).regressed_phases == ["compute"]


def test_unchanged_scaling_report_names_nothing():
    result = compare(scaling_report(), scaling_report())
    assert result.regressed == [] and result.regressed_phases == []


def test_rows_of_figure_groups_need_a_name():
    report = scaling_report()
    del report["measured"]["rows"][1]["name"]
    with pytest.raises(ValueError, match=r"measured\.rows\[1\]"):
        figures(report)
