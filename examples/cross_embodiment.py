"""Train one small policy on three robots at once: a 7-dim arm with one camera, a 14-dim bimanual robot with two
and a 2-dim mobile base with none, as cross-embodiment pretraining does.

The three datasets are opened as one mixture: ``pad_to`` widens state and action to 32 with zeros and every
sample carries ``<feature>_dim_mask`` (which elements are the robot's own), ``rename`` maps each robot's cameras
onto shared slots (primary, wrist), and a camera a robot lacks comes as zeros flagged in ``<feature>_is_pad``. Each
robot's statistics (``compute_stats``, what ``mmfeed stats`` prints) normalize its own samples (quantiles to
[-1, 1], the grippers left as they are), ``SizeWeights(0.5)`` tempers the mixture, ``CameraDropout`` drops a
camera now and then. The policy predicts a chunk of future actions from the state, the cameras and an embedding
of the robot; its loss counts only real elements of real steps (``action_dim_mask & ~action_is_pad``).

    python examples/cross_embodiment.py
    python examples/cross_embodiment.py --quick
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from torch import nn

from mmfeed import DataLoader
from mmfeed.loaders import (CameraDropout, Compose, Normalize, Packing, PlanConfig, SizeWeights, TokenLayout,
                            WindowSpec, compute_stats, open_dataset)
from mmfeed.testing.synth_embodiments import write_embodiments

PRIMARY, WRIST = "observation.images.primary", "observation.images.wrist"
STATE, ACTION = "observation.state", "action"
WIDTH, HORIZON = 32, 8
CAMERAS = {"franka": {"observation.images.front": PRIMARY},
           "aloha": {"observation.images.top": PRIMARY}}  # aloha's wrist camera keeps its name
GRIPPERS = {"franka": {ACTION: [6]}, "aloha": {ACTION: [6, 13]}}  # already in [0, 1]: left as they are


class Policy(nn.Module):
    """Cameras pooled to colour means, the state and the robot's embedding -> an action chunk ``[HORIZON, 32]``."""

    def __init__(self, embodiments: int, hidden: int = 128) -> None:
        super().__init__()
        self.robot = nn.Embedding(embodiments, 16)
        self.net = nn.Sequential(nn.Linear(WIDTH + 2 * 3 + 2 + 16, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, HORIZON * WIDTH))

    def forward(self, state, cameras, camera_pad, robot):
        x = torch.cat([state, cameras, camera_pad, self.robot(robot)], dim=-1)
        return self.net(x).view(-1, HORIZON, WIDTH)


def per_document(batch, feature, frames):
    """A packed batch's flat payload of ``feature`` as ``[documents, frames, ...]`` (every document has it)."""
    return batch.data[feature].view(batch.num_documents, frames, *batch.data[feature].shape[1:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 300, quick 60)")
    args = p.parse_args(argv)
    steps = args.steps or (60 if args.quick else 300)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="mmfeed-robots-") as tmp:
        paths = write_embodiments(tmp, episodes=4 if args.quick else 12, min_length=20, max_length=40)
        embodiments = list(paths)
        mix = open_dataset(paths, pad_to={STATE: WIDTH, ACTION: WIDTH, "observation.velocity": WIDTH}, rename=CAMERAS,
                           embodiments=embodiments)
        for d, name in enumerate(mix.dataset_names):
            own = mix.sources[d]
            cams = [f for f in own.features if f.startswith("observation.images.")]
            print(f"{name}: {len(own)} episodes, {STATE} {own.features[STATE].shape[-1]} dims, cameras {cams}")
        stats = compute_stats(paths, embodiments=embodiments)  # from the arrays alone, with quantiles
        window = WindowSpec.from_delta_timestamps({PRIMARY: [0.0], WRIST: [0.0], STATE: [0.0],
                                                   ACTION: [i / 30 for i in range(HORIZON)]})
        packing = Packing(layout=TokenLayout(tokens_per_frame={PRIMARY: 16, WRIST: 16}), window=window,
                          plan=PlanConfig(capacity=1024, rows_per_batch=1), weights=SizeWeights(0.5), seed=0,
                          transform=Compose(Normalize(stats, mode="quantile", clip=True, leave=GRIPPERS,
                                                      features=[STATE, ACTION]), CameraDropout(0.2)))
        loader = DataLoader(mix, packing=packing, num_workers=0 if args.quick else 2)
        policy = Policy(len(embodiments))
        optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
        losses, step, epoch, windows = [], 0, 0, torch.zeros(len(embodiments), dtype=torch.int64)
        while step < steps:  # each pass over the loader is the next epoch, its own plan
            for batch in loader:
                state = per_document(batch, STATE, 1)[:, 0]
                action = per_document(batch, ACTION, HORIZON)
                real = per_document(batch, f"{ACTION}_dim_mask", HORIZON) & ~per_document(
                    batch, f"{ACTION}_is_pad", HORIZON)[..., None]
                frames = [per_document(batch, c, 1)[:, 0].float().mean(dim=(1, 2)) / 255 for c in (PRIMARY, WRIST)]
                pads = [per_document(batch, f"{c}_is_pad", 1)[:, 0].float()[:, None] for c in (PRIMARY, WRIST)]
                robot = batch.metadata["embodiment"]
                windows += torch.bincount(robot, minlength=len(embodiments))
                predicted = policy(state, torch.cat(frames, -1), torch.cat(pads, -1), robot)
                loss = ((predicted - action) ** 2 * real).sum() / real.sum().clamp(min=1)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if step == 0:
                    dims = real[:, 0].sum(-1)
                    print(f"batch 0: {batch.num_documents} windows from robots {robot.tolist()}; real action dims "
                          f"{dims.tolist()}; {ACTION} {tuple(batch.data[ACTION].shape)}")
                step += 1
                if step >= steps:
                    break
            epoch += 1
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print("windows per robot: " + ", ".join(f"{n} {int(c)}" for n, c in zip(embodiments, windows)))
    print(f"{steps} steps over {epoch} epoch(s): masked loss {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
