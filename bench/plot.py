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


def _range(report: dict[str, Any], name: str, key: str, kind: str = "") -> str:
    """The spread of a figure's repeats: (max - min) / median, or for a fraction max - min in points (a relative
    spread of a fraction near 0, a stall of 0.1%, says nothing)."""
    got = report["details"].get("spread", {}).get(name, {}).get(key)
    if not got:
        return ""
    if kind == "pct":
        return f"{(got['max'] - got['min']) * 100:.1f} pt"
    return "" if got["range"] is None else f"{got['range']:.1%}"


def render(report: dict[str, Any]) -> str:
    """The tables ``mmfeed bench`` prints: every figure of mmfeed and the baseline, their spread over the repeats
    ((max - min) / median; fractions: max - min in points) and their ratio; the decode limit; where a batch's
    worker time goes."""
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
        out.append({"figure": f"{name} (ms/batch, workers)", "mmfeed": _fmt(ours, "ms"),
                    "baseline": _fmt(theirs, "ms"), "ratio": _fmt(ours / theirs if ours and theirs else None, "x")})
    s, d = report["settings"], report["details"]
    step = (f"{d['step_s'] * 1e3:.1f} ms ({s['load_fraction']:.0%} of mmfeed's capacity)"
            if s["step_ms"] is None else f"{d['step_s'] * 1e3:.1f} ms (--step-ms)")
    what = ("given dataset" if s["format"] == "given" else
            " + ".join(f"{e['name']} ({len(e['cameras'])} cam {e['width']}x{e['height']})" for e in s["embodiments"])
            or f"{s['width']}x{s['height']} {s['codec']}")
    kinds = "windows + world-model chunks" if s["chunk_steps"] else "windows"
    head = (f"mmfeed bench: {s['data']}\n  {what}, {kinds}, {s['workers']} workers, capacity {s['capacity']} x "
            f"{s['rows_per_batch']} rows (baseline batch {s['baseline_batch_size']}), episode_block "
            f"{s['episode_block']}, step {step}; median of {s['repeats']} interleaved stretches "
            f"({d['steps']['mmfeed']} mmfeed / {d['steps']['baseline']} baseline batches)")
    text = [head, "", table(out, [("figure", "figure"), ("mmfeed", "mmfeed"), ("m_spread", "spread"),
                                  ("baseline", "baseline"), ("b_spread", "spread"), ("ratio", "mmfeed/baseline")])]
    paired = d.get("paired_ratios")
    if paired:
        text.append("\nmmfeed / baseline round by round (each round both loaders in turn): " + "; ".join(
            f"{label} " + ", ".join(f"{v:.2f}x" for v in paired[k]) for label, k in
            (("useful tokens/s", "tokens_per_s"), ("per CPU-second", "tokens_per_cpu_second"))))
    if report.get("decode_limit_frames_per_s") is not None:
        lim, b = d["limit"], d["breakdown"]
        text.append(f"\ndecode limit ({lim['processes']} processes, plain PyAV, the same batches): "
                    f"{report['decode_limit_frames_per_s']:.4g} delivered frames/s with RGB conversion "
                    f"(spread {_range(report, 'mmfeed', 'decode_limit_frames_per_s')}), "
                    f"{report['decode_limit_raw_frames_per_s']:.4g} without; {lim['decoded_frames_per_s']:.4g} "
                    f"decoded frames/s ({lim['decoded_per_delivered']:.2f} decoded per delivered frame)\n"
                    f"mmfeed delivers {report['limit_fraction']:.1%} of the limit "
                    f"(spread {_range(report, 'mmfeed', 'limit_fraction')}); per CPU-second "
                    f"{report['limit_fraction_cpu']:.1%} (spread {_range(report, 'mmfeed', 'limit_fraction_cpu')}; "
                    f"the limit's processes had {lim['cpu_share']:.0%} of a CPU each)")
        parts = [("limit: decode (seek + demux + decode)", b["limit_decode_s"]),
                 ("limit: RGB conversion", b["limit_convert_s"]), ("  of which seeking", b["limit_seek_s"]),
                 *[(f"mmfeed stage {k[6:-2]}", v) for k, v in b.items() if k.startswith("stage_")],
                 ("  decode stage beyond the limit", b["decode_beyond_limit_s"]),
                 (f"    of which reopening videos ({report['readers_opened_per_batch']:.2g} per batch, "
                  f"{lim['open_s'] * 1e3:.1f} ms each)", b["reopen_s"]),
                 ("unstaged worker time (plan, requests, send to main, idle)", b["unstaged_s"]),
                 (f"worker budget ({s['workers']} workers x wall per batch)", b["worker_budget_s"])]
        text.append("\nwhere a batch goes (worker ms per mmfeed batch, capacity stretches):")
        text.append(table([{"part": p, "ms": _fmt(v, "ms")} for p, v in parts], [("part", "part"), ("ms", "ms")]))
    text.append(f"\nbottleneck: {report['bottleneck']['recommendation']}")
    if "sweep" in report:
        sw = report["sweep"]
        text.append("workers scaling (samples/s): " + ", ".join(
            f"{w}: {a:.4g} vs {b:.4g}" for w, a, b in zip(sw["workers"], sw["mmfeed"]["samples_per_s"],
                                                           sw["baseline"]["samples_per_s"])))
    text.append(f"({d['wall_s']['total']:.1f} s)")
    return "\n".join(text)
