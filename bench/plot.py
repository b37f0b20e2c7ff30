"""How ``mmfeed bench`` shows a report: :func:`render`, the tables it prints, and ``--plot FILE.png``
(:func:`plot_report`), the worker-scaling curve and the stall breakdown.

Four panels (matplotlib, Agg backend, no display needed):

1. samples/s against worker processes, mmfeed and the baseline (``--sweep workers=1,2,4``; without a sweep the
   one measured point of each);
2. the mean training step split into compute (the simulated step, in proportion to the batch's token slots) and
   input wait, per system, labelled with the stall fraction;
3. the worker seconds per batch of each stage (read, decode, collate), per system, and beside them the decode
   limit of mmfeed's batches (decode and RGB conversion, plain PyAV);
4. the phases step by step (input wait stacked on compute, one bar per step) of the stepped stretch nearest
   the median stall, per system: where stalls cluster (an epoch start, a slow shard) shows here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

__all__ = ["plot_report", "render"]

_COLORS = {"mmfeed": "#1f77b4", "baseline": "#ff7f0e"}


def plot_report(report: dict[str, Any], path: str | Path) -> Path:
    """Draw the panels of ``report`` (from :func:`mmfeed.bench.run.run_bench`) into the PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    systems = {"mmfeed": report, "baseline": report["baseline"]}
    step_s = report["details"]["step_s"]
    fig, ((ax1, ax2), (ax3, ax4)) = plt.subplots(2, 2, figsize=(14, 9))

    sweep = report.get("sweep")
    if sweep:
        workers = sweep["workers"]
        for name in systems:
            ax1.plot(workers, sweep[name]["samples_per_s"], "o-", color=_COLORS[name], label=name)
        ax1.set_title("worker scaling")
    else:
        w = report["settings"]["workers"]
        for name, figs in systems.items():
            ax1.plot([w], [figs["samples_per_s"]], "o", color=_COLORS[name], label=name)
        ax1.set_title("worker scaling (one point: run with --sweep workers=1,2,4)", fontsize=9)
    ax1.set_xticks(sweep["workers"] if sweep else [report["settings"]["workers"]])
    ax1.set_xlabel("worker processes")
    ax1.set_ylabel("samples/s (no step)")
    ax1.set_ylim(bottom=0)
    ax1.legend()
    ax1.grid(alpha=0.3)

    names = list(systems)
    waits = [systems[n]["wait_s"] * 1e3 for n in names]
    steps = report["details"].get("per_step") or {}
    # the simulated step grows with a batch's token slots: each system's mean step of its stepped stretch
    computes = [1e3 * (sum(steps[n]["compute_s"]) / len(steps[n]["compute_s"]) if steps.get(n, {}).get("compute_s")
                       else step_s) for n in names]
    ax2.barh(names, computes, color="#999999", label="compute (simulated step)")
    ax2.barh(names, waits, left=computes, color="#d62728", label="input wait")
    for i, n in enumerate(names):
        ax2.text(computes[i] + waits[i], i, f" stall {systems[n]['stall_fraction']:.1%}", va="center")
    ax2.invert_yaxis()
    ax2.set_xlabel("ms per step")
    ax2.set_title("where a step goes")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8, frameon=False)
    ax2.set_xlim(0, max((c + w for c, w in zip(computes, waits)), default=0) * 1.35 or 1)

    per_batch = {n: dict(systems[n]["stage_s"]) for n in names}
    breakdown = report["details"].get("breakdown")
    if breakdown:  # the decode limit of mmfeed's batches: what decoding (and converting) them takes at least
        per_batch["limit"] = {"decode": breakdown["limit_decode_s"], "convert": max(breakdown["limit_convert_s"], 0)}
    rows = list(per_batch)
    stages = sorted({s for n in rows for s in per_batch[n]})
    left = [0.0] * len(rows)
    palette = ["#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2"]
    for k, stage in enumerate(stages):
        values = [per_batch[n].get(stage, 0.0) * 1e3 for n in rows]
        ax3.barh(rows, values, left=left, color=palette[k % len(palette)], label=stage)
        left = [a + b for a, b in zip(left, values)]
    ax3.invert_yaxis()
    ax3.set_xlabel("worker ms per batch")
    ax3.set_title("stage breakdown (worker time per batch; limit: plain PyAV on mmfeed's batches)", fontsize=9)
    if stages:
        ax3.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(stages), fontsize=8, frameon=False)

    per_step = report["details"].get("per_step") or {}
    offset = 0
    for name in names:
        steps = per_step.get(name)
        if not steps:
            continue
        xs = [offset + i for i in range(len(steps["wait_s"]))]
        compute = [v * 1e3 for v in steps["compute_s"]]
        ax4.bar(xs, compute, width=1.0, color="#999999", label="compute" if offset == 0 else None)
        ax4.bar(xs, [v * 1e3 for v in steps["wait_s"]], bottom=compute, width=1.0, color=_COLORS[name],
                label=f"input wait ({name})")
        offset += len(xs) + 2
    ax4.set_xlabel("step (mmfeed, then the baseline)")
    ax4.set_ylabel("ms")
    ax4.set_title("phases step by step")
    if per_step:
        ax4.legend(fontsize=8)

    fig.suptitle(f"mmfeed bench: {report['settings']['workers']} workers, capacity {report['settings']['capacity']}, "
                 f"step {step_s * 1e3:.1f} ms", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return ""
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "ms":
        return f"{value * 1e3:.2f}"
    if kind == "x":
        return f"{value:.2f}x"
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"


def _note(text: str) -> str:
    """A line that explains a figure, indented and wrapped at 116 columns."""
    return textwrap.fill(text, 116, initial_indent="  ", subsequent_indent="    ")


NOISY_SPREAD = 0.5
"""A rate whose stretches disagree by more than this share of its median gets a line saying the load changed."""


def _range(report: dict[str, Any], name: str, key: str, kind: str = "") -> str:
    """The spread of a figure's repeats, in the figure's own terms: for a rate (max - min) / median; for a
    fraction max - min in percentage points and for a time max - min in ms (a relative spread of a figure near 0,
    a stall of 0.1% or a wait of 0.03 ms, says nothing: 0.03 ms against 0.5 ms would read 1500%)."""
    got = report["details"].get("spread", {}).get(name, {}).get(key)
    if not got:
        return ""
    if kind == "pct":
        return f"{(got['max'] - got['min']) * 100:.1f} pt"
    if kind == "ms":
        return f"{(got['max'] - got['min']) * 1e3:.2f} ms"
    return "" if got["range"] is None else f"{got['range']:.1%}"


def _between(report: dict[str, Any], key: str, kind: str = "") -> str:
    """``min-max`` of mmfeed's repeats of ``key`` (a fraction in %, else a number), or ""."""
    got = report["details"].get("spread", {}).get("mmfeed", {}).get(key)
    if not got:
        return ""
    if kind == "pct":
        return f"{got['min']:.1%}-{got['max']:.1%}"
    return f"{got['min']:.4g}-{got['max']:.4g}"


def _signed(label: str, value: float, negative: str, why: str, notes: list[str]) -> tuple[str, float]:
    """A breakdown part that is a difference (of medians, or of two timings) and can come out below 0: as it is
    when >= 0; else its size under the label ``negative``, marked ``*`` with ``why`` added to ``notes``."""
    if value >= 0:
        return label, value
    notes.append(f"* {negative.strip()}: {why}")
    return f"{negative} *", -value


def render(report: dict[str, Any]) -> str:
    """The tables ``mmfeed bench`` prints: every figure of mmfeed and the baseline, their spread over the repeats
    (rates: (max - min) / median; fractions: max - min in points; times: max - min in ms) and their ratio; the
    decode limit; where a batch's worker time goes; each with lines saying what its figures are."""
    from mmfeed.bench.common import table

    base = report["baseline"]
    rows = [("samples/s", "samples_per_s", ""), ("useful tokens/s", "tokens_per_s", ""),
            ("delivered frames/s", "delivered_frames_per_s", ""), ("decoded frames/s", "decoded_frames_per_s", ""),
            ("useful tokens per CPU-second", "tokens_per_cpu_second", ""),
            ("packing efficiency", "packing_efficiency", "pct"), ("padding fraction", "padding_fraction", "pct"),
            ("stall fraction", "stall_fraction", "pct"), ("wait per step (ms)", "wait_s", "ms")]
    out = []
    for label, key, kind in rows:
        ours, theirs = report.get(key), base.get(key)
        ratio = report["ratios"].get(key) if key in report["ratios"] else (
            ours / theirs if ours is not None and theirs else None)
        out.append({"figure": label, "mmfeed": _fmt(ours, kind), "m_spread": _range(report, "mmfeed", key, kind),
                    "baseline": _fmt(theirs, kind), "b_spread": _range(report, "baseline", key, kind),
                    "ratio": _fmt(ratio, "x")})
    for name in sorted(set(report["stage_s"]) | set(base["stage_s"])):
        ours, theirs = report["stage_s"].get(name), base["stage_s"].get(name)
        key = f"stage_s.{name}"
        out.append({"figure": f"{name} (ms/batch, workers)", "mmfeed": _fmt(ours, "ms"),
                    "m_spread": _range(report, "mmfeed", key, "ms"), "baseline": _fmt(theirs, "ms"),
                    "b_spread": _range(report, "baseline", key, "ms"),
                    "ratio": _fmt(ours / theirs if ours and theirs else None, "x")})
    s, d = report["settings"], report["details"]
    step = (f"{d['step_s'] * 1e3:.1f} ms ({s['load_fraction']:.0%} of mmfeed's capacity)"
            if s["step_ms"] is None else f"{d['step_s'] * 1e3:.1f} ms (--step-ms)")
    what = ("given dataset" if s["format"] == "given" else
            " + ".join(f"{e['name']} ({len(e['cameras'])} cam {e['width']}x{e['height']})" for e in s["embodiments"])
            or f"{s['width']}x{s['height']} {s['codec']}")
    kinds = "windows + world-model chunks" if s["chunk_steps"] else "windows"
    n = s["repeats"]
    head = (f"mmfeed bench: {s['data']}\n  {what}, {kinds}, {s['workers']} workers, capacity {s['capacity']} x "
            f"{s['rows_per_batch']} rows (baseline batch {s['baseline_batch_size']}), episode_block "
            f"{s['episode_block']}, step {step}; median of {n} interleaved stretches "
            f"(of {d['steps']['mmfeed']} mmfeed / {d['steps']['baseline']} baseline batches each)")
    text = [head, "", table(out, [("figure", "figure"), ("mmfeed", "mmfeed"), ("m_spread", "spread"),
                                  ("baseline", "baseline"), ("b_spread", "spread"), ("ratio", "mmfeed/baseline")])]
    text.append(f"  mmfeed, baseline: a figure's median over the {n} measured stretches of that loader (taken in "
                "turn)\n"
                f"  spread: how far the {n} stretches disagree: (max - min) / median for a rate; max - min in "
                "points for a %, in ms for a time\n"
                "  mmfeed/baseline: mmfeed's median over the baseline's (above 1.00x: mmfeed's is the larger)\n"
                "  (ms/batch, workers): worker seconds a stage took per batch, summed over the workers")
    spreads = d.get("spread", {})
    noisy = [got["range"] for _, key, kind in rows if not kind for name in ("mmfeed", "baseline")
             for got in [spreads.get(name, {}).get(key)] if got and (got["range"] or 0) > NOISY_SPREAD]
    if noisy:
        load = d.get("loadavg", {})
        cpus = report.get("environment", {}).get("cpu_count")
        seen = (f" (load average {load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end, on "
                f"{cpus} CPUs)" if load and cpus else "")
        text.append(_note(f"a spread above {NOISY_SPREAD:.0%} (up to {max(noisy):.0%} here): the stretches ran "
                          f"under different loads{seen}; the medians stand, but read a ratio from the "
                          "round-by-round figures below, where both loaders saw the same moment"))
    paired = d.get("paired_ratios")
    if paired:
        text.append("\nmmfeed / baseline round by round (each round both loaders in turn): " + "; ".join(
            f"{label} " + ", ".join(f"{v:.2f}x" for v in paired[k]) for label, k in
            (("useful tokens/s", "tokens_per_s"), ("per CPU-second", "tokens_per_cpu_second"))))
    if report.get("decode_limit_frames_per_s") is not None:
        lim, b = d["limit"], d["breakdown"]
        fraction, per_cpu = report["limit_fraction"], report["limit_fraction_cpu"]
        text.append(f"\ndecode limit: the frames of mmfeed's batches decoded by plain PyAV and nothing else (no "
                    f"copy, collate or transfer),\nevery other batch of each mmfeed stretch, right after it, in "
                    f"{lim['processes']} processes:\n"
                    f"  {report['decode_limit_frames_per_s']:.4g} delivered frames/s with RGB conversion "
                    f"({_between(report, 'decode_limit_frames_per_s')} across the stretches), "
                    f"{report['decode_limit_raw_frames_per_s']:.4g} without;\n  {lim['decoded_frames_per_s']:.4g} "
                    f"decoded frames/s ({lim['decoded_per_delivered']:.2f} decoded per delivered frame: GOP "
                    "dependencies)\n"
                    f"mmfeed delivers {fraction:.1%} of the limit: its delivered frames/s over the limit's, stretch "
                    f"by stretch ({_between(report, 'limit_fraction', 'pct')} across the {n} stretches)\n"
                    f"per CPU-second {per_cpu:.1%} of the limit ({_between(report, 'limit_fraction_cpu', 'pct')}): "
                    "the same ratio in frames per CPU-second, which other processes disturb less\n"
                    f"  (the limit's processes had {lim['cpu_share']:.0%} of a CPU each)")
        # why mmfeed can come out ahead of plain PyAV on the same batches: another moment, or fewer frames decoded
        fewer, ours = "", report.get("decoded_frames_per_s")
        if ours and report.get("delivered_frames_per_s"):
            mine = ours / report["delivered_frames_per_s"]
            if mine < lim["decoded_per_delivered"]:
                fewer = (f"; and mmfeed decoded fewer frames per delivered frame ({mine:.2f} against the limit's "
                         f"{lim['decoded_per_delivered']:.2f}: its readers go on from where an earlier read left "
                         "them, the limit seeks afresh for every batch)")
        moment = (f"the limit runs after mmfeed's stretch, at another moment of the machine's load (its processes "
                  f"had {lim['cpu_share']:.0%} of a CPU each){fewer}")
        if fraction > 1 or per_cpu > 1:
            text.append(_note(f"above 100% does not mean mmfeed decodes faster than plain PyAV can: {moment}"))
        notes: list[str] = []
        parts = [("limit: decode (seek + demux + decode)", b["limit_decode_s"]),
                 ("  of which seeking", b["limit_seek_s"]),
                 _signed("limit: RGB conversion", b["limit_convert_s"], "limit: RGB conversion below 0, by",
                         "the batches decoded with conversion took less than without it; the two timings differ by "
                         "the machine's noise", notes),
                 *[(f"mmfeed stage {k[6:-2]}", v) for k, v in b.items() if k.startswith("stage_")],
                 _signed("  decode stage beyond the limit's decode + conversion", b["decode_beyond_limit_s"],
                         "  decode stage below the limit's decode + conversion, by",
                         f"mmfeed's decode stage took less than plain PyAV's decode and conversion of the same "
                         f"batches: {moment}", notes),
                 (f"  of the decode stage, reopening videos ({report['readers_opened_per_batch']:.2g} per batch, "
                  f"{lim['open_s'] * 1e3:.1f} ms each)", b["reopen_s"]),
                 _signed("unstaged worker time (plan, requests, send to main, idle)", b["unstaged_s"],
                         "stages beyond the worker budget, by", "the stages' medians and the wall time per batch "
                         "come from different stretches; nothing is unaccounted for", notes),
                 (f"worker budget ({s['workers']} workers x wall per batch)", b["worker_budget_s"])]
        text.append(f"\nwhere a batch goes: worker ms per mmfeed batch, summed over the {s['workers']} workers "
                    "(capacity stretches);\nthe limit's rows: plain PyAV's time for the same batches")
        text.append(table([{"part": p, "ms": _fmt(v, "ms")} for p, v in parts], [("part", "part"), ("ms", "ms")]))
        text.extend(_note(note) for note in notes)
    text.append(f"\nbottleneck: {report['bottleneck']['recommendation']}")
    if "sweep" in report:
        sw = report["sweep"]
        text.append("workers scaling (samples/s, mmfeed vs baseline): " + ", ".join(
            f"{w}: {a:.4g} vs {b:.4g}" for w, a, b in zip(sw["workers"], sw["mmfeed"]["samples_per_s"],
                                                           sw["baseline"]["samples_per_s"])))
    text.append(f"(the run took {d['wall_s']['total']:.1f} s)")
    return "\n".join(text)
