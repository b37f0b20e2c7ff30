"""``mmfeed bench --plot FILE.png``: the worker-scaling curve and the stall breakdown of one bench report.

Three panels (matplotlib, Agg backend, no display needed):

1. samples/s against worker processes, mmfeed and the baseline (``--sweep workers=1,2,4``; without a sweep the
   one measured point of each);
2. the mean training step split into compute (the simulated step) and input wait, per system, labelled with
   the stall fraction;
3. the worker seconds per batch of each stage (read, decode, collate), per system;
4. the phases step by step (input wait stacked on compute, one bar per step) of the stepped stretch nearest
   the median stall, per system: where stalls cluster (an epoch start, a slow shard) shows here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_report"]

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
    ax2.barh(names, [step_s * 1e3] * len(names), color="#999999", label="compute (simulated step)")
    ax2.barh(names, waits, left=[step_s * 1e3] * len(names), color="#d62728", label="input wait")
    for i, n in enumerate(names):
        ax2.text(step_s * 1e3 + waits[i], i, f" stall {systems[n]['stall_fraction']:.1%}", va="center")
    ax2.invert_yaxis()
    ax2.set_xlabel("ms per step")
    ax2.set_title("where a step goes")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8, frameon=False)
    ax2.set_xlim(0, (step_s * 1e3 + max(waits, default=0)) * 1.35 or 1)

    stages = sorted({s for n in names for s in systems[n]["stage_s"]})
    left = [0.0] * len(names)
    palette = ["#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2"]
    for k, stage in enumerate(stages):
        values = [systems[n]["stage_s"].get(stage, 0.0) * 1e3 for n in names]
        ax3.barh(names, values, left=left, color=palette[k % len(palette)], label=stage)
        left = [a + b for a, b in zip(left, values)]
    ax3.invert_yaxis()
    ax3.set_xlabel("worker ms per batch")
    ax3.set_title("stage breakdown (worker time per batch)")
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
