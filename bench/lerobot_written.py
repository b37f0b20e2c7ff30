r"""Write a LeRobot v3 directory with LeRobot itself, for ``lerobot_compare --root``: ``--episodes`` episodes of
120-180 steps (seeded) at 30 fps, one 240x320 camera encoded as LeRobot records (libsvtav1, GOP 2), a 6-d state
and action. ``--content wave`` draws a smooth travelling wave (cheap to decode, like
:func:`mmfeed.testing.frame_pattern`); ``--content blocks`` a panning mosaic of 8x8 blocks (about four times the
bits, dearer to decode); ``--content scene`` a fixed camera's view of a still textured table with a small square
(the gripper) moving over it (the cheapest: most of each picture repeats the last one). Run with the LeRobot
venv's python (``lerobot_compare``'s docstring says how to build it); it imports nothing of mmfeed::

    HF_HUB_OFFLINE=1 LD_LIBRARY_PATH=/work/lerobot-venv/ffmpeg-links /work/lerobot-venv/bin/python \
        bench/lerobot_written.py /tmp/lr30 --episodes 30 --content wave
"""

from __future__ import annotations

import argparse

import numpy as np


def frames(content: str, steps: int, start: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One episode's frames, uint8 ``[240, 320, 3]`` each."""
    if content == "scene":
        yy, xx = np.mgrid[0:240, 0:320].astype(np.float32)
        table = (110 + 40 * np.sin(xx[:, :, None] / 17.0) * np.cos(yy[:, :, None] / 23.0)
                 + np.array([10.0, 0.0, -20.0])).astype(np.uint8)
        out = []
        for t in range(steps):
            frame = table.copy()
            y, x = int(100 + 60 * np.sin((start + t) / 20.0)), int(140 + 100 * np.cos((start + t) / 27.0))
            frame[y : y + 32, x : x + 32] = (200, 60, 40)
            out.append(frame)
        return out
    if content == "blocks":
        base = np.repeat(np.repeat(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8), 8, 0), 8, 1)
        return [np.roll(base, 2 * t, axis=1) for t in range(steps)]
    yy, xx = np.mgrid[0:240, 0:320].astype(np.float32)
    return [(96 + 64 * np.sin(xx[:, :, None] / 9.0 + yy[:, :, None] / 13.0 + (start + t) / 5.0
                              + np.array([0.5, 2.0, 4.0]))).astype(np.uint8) for t in range(steps)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the directory to write (must not exist)")
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--content", choices=("wave", "blocks", "scene"), default="wave")
    args = parser.parse_args(argv)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(0)
    features = {"observation.images.top": {"dtype": "video", "shape": (240, 320, 3),
                                           "names": ["height", "width", "channels"]},
                "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"s{i}" for i in range(6)]},
                "action": {"dtype": "float32", "shape": (6,), "names": [f"a{i}" for i in range(6)]}}
    ds = LeRobotDataset.create("local/written", fps=30, features=features, root=args.out, use_videos=True)
    start = 0
    for steps in rng.integers(120, 181, args.episodes).tolist():
        for frame in frames(args.content, steps, start, rng):
            ds.add_frame({"observation.images.top": frame, "task": "pick the cube",
                          "observation.state": rng.standard_normal(6).astype(np.float32),
                          "action": rng.standard_normal(6).astype(np.float32)})
        start += steps
        ds.save_episode()
    ds.finalize()
    print(f"{args.out}: {args.episodes} episodes, {start} frames")


if __name__ == "__main__":
    main()
