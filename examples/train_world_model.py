"""Train a tiny block-causal world model on packed robot episodes: the whole mmfeed loop in one file.

Synthetic episodes are written as webdataset shards: a 15 fps overhead camera beside a 30 fps wrist camera,
the state, velocity, reward, done flag and action at the 30 Hz control clock, and a task string, every feature
under its own name. ``mmfeed.DataLoader`` plans the epoch from the shard index, takes windows in seconds (two
overhead frames of the last 1/15 s, the current wrist frame and state, the next 8 actions), normalizes the state
and actions with the dataset's stats in the workers, packs the windows into rows of ``--capacity`` tokens,
decodes in worker processes, moves batches to the device ahead of the step and times every step. The model
(:mod:`mmfeed.testing.model`) embeds frames as patch tokens, arrays linearly and the task text as bytes, attends
within each packed document only (block-causal: the tokens of one time see each other), and learns next-token
text and action-chunk regression. At the end the stall report says how much of the step time went to waiting
for data, and why.

    python examples/train_world_model.py              # CPU: well under a minute; CUDA when present
    python examples/train_world_model.py --quick      # a few steps (what the tests run)
    python examples/train_world_model.py --attention flex   # FlexAttention with the batch's BlockMask (CUDA)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from mmfeed import DataLoader
from mmfeed.loaders import Normalize, Packing, PlanConfig, StepTimer, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_webdataset
from mmfeed.testing.model import TinyModelConfig, TinyWorldModel, model_features

HIGH, WRIST = "observation.images.cam_high", "observation.images.cam_wrist"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")),
                   help="a few steps on a few episodes (also: MMFEED_EXAMPLE_QUICK=1)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 40, quick 4)")
    p.add_argument("--episodes", type=int, default=None, help="synthetic episodes (default 16, quick 4)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (default 2, quick 0)")
    p.add_argument("--capacity", type=int, default=512, help="tokens per packed row")
    p.add_argument("--rows", type=int, default=2, help="packed rows per batch")
    p.add_argument("--attention", choices=["sdpa", "flex"], default="sdpa",
                   help="sdpa: dense attention_mask(); flex: FlexAttention with block_mask() (needs CUDA to train)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    steps = args.steps or (4 if args.quick else 40)
    n_episodes = args.episodes or (4 if args.quick else 16)
    workers = args.workers if args.workers is not None else (0 if args.quick else 2)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)

    flex = None
    if args.attention == "flex":
        if device.type != "cuda":
            print("note: FlexAttention has no backward pass on the CPU; training with --attention sdpa instead")
            args.attention = "sdpa"
        else:
            from torch.nn.attention.flex_attention import flex_attention

            flex = torch.compile(flex_attention)

    # What a sample reads, in seconds from its anchor step: each feature at its own rate (the overhead camera's
    # frames at or before -1/15 s and 0 s, the 30 Hz state now, the next 8 actions). What it costs: 16 patch
    # tokens per overhead frame, 4 per wrist frame, one token per state and per action; the action chunk is one
    # attention step (predicted jointly).
    window = WindowSpec.from_delta_timestamps({
        HIGH: [-1 / 15, 0.0],
        WRIST: [0.0],
        "observation.state": [0.0],
        "action": [i / 30 for i in range(8)],
    })
    layout = TokenLayout(tokens_per_frame={HIGH: 16, WRIST: 4})

    with tempfile.TemporaryDirectory(prefix="mmfeed-world-model-") as tmp:
        t0 = time.perf_counter()
        episodes = make_episodes(n_episodes, seed=args.seed, min_length=30, max_length=60, fps=30.0,
                                 camera_fps={"cam_high": 15.0})
        write_webdataset(tmp, episodes, episodes_per_shard=4)
        ds = open_dataset(tmp)
        rates = {name: f.fps for name, f in ds.features.items() if f.kind == "video"}
        print(f"wrote {n_episodes} episodes as webdataset shards in {time.perf_counter() - t0:.1f}s; "
              f"{len(ds.features)} features, video rates {rates}")

        packing = Packing(layout=layout, window=window, stride=3, seed=args.seed,
                          transform=Normalize(ds.stats),  # state and action to zero mean, unit std, in the workers
                          plan=PlanConfig(capacity=args.capacity, rows_per_batch=args.rows, episode_block=4))
        timer = StepTimer(warmup=1 if steps > 2 else 0)  # leave worker start-up out of the report
        loader = DataLoader(ds, packing=packing, num_workers=workers, device=device, prefetch=2, timer=timer,
                            persistent_workers=workers > 0)
        model = TinyWorldModel(TinyModelConfig(layout=layout, features=model_features(ds), width=64, depth=2,
                                               heads=4, max_positions=args.capacity),
                               flex_attention=flex).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        print(f"device={device} attention={args.attention} workers={workers} capacity={args.capacity} "
              f"rows/batch={args.rows} steps/epoch={len(loader)}")

        step, epoch, t0 = 0, 0, time.perf_counter()
        while step < steps:
            for batch in loader:
                out = model.loss(batch, attention=args.attention)
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                opt.step()
                real = int(batch.cu_seqlens[-1])
                action = out.chunk_sum["action"] / out.chunk_count["action"].clamp(min=1)
                # .item() waits for the device: fine for an example; log every N steps in real training
                print(f"step {step:3d}  epoch {epoch}  loss {out.loss.item():.4f}  "
                      f"text {(out.text_sum / out.text_count.clamp(min=1)).item():.3f}  "
                      f"action {action.item():.4f}  "
                      f"docs {batch.num_documents:2d}  tokens {real}/{batch.num_rows * batch.capacity}")
                step += 1
                if step >= steps:
                    break
            epoch += 1
        print(f"trained {step} steps in {time.perf_counter() - t0:.1f}s")
        print_stall_report(loader.timer.report())


def print_stall_report(report: dict) -> None:
    """The timer's report in a few lines: stall fraction, per-batch worker stages, the bottleneck."""
    wait, compute = report["wait_s"], report["compute_s"]
    print(f"stall report: stall_fraction {report['stall_fraction']:.1%} over {report['steps']} steps "
          f"(wait {wait['mean'] * 1e3:.1f} ms, compute {compute['mean'] * 1e3:.1f} ms per step)")
    for name, stage in sorted(report["stages"].items()):
        print(f"  stage {name:<8} {stage['mean_s'] * 1e3:8.2f} ms/batch  ({stage['share']:.0%} of worker time)")
    if report["copy_s"]:
        print(f"  host-to-device copy {report['copy_s']['mean'] * 1e3:.2f} ms/batch")
    print(f"  bottleneck: {report['bottleneck']['stage']}: {report['bottleneck']['recommendation']}")


if __name__ == "__main__":
    main()
