"""Write an Open X-Embodiment-shaped RLDS dataset with TFDS's own builder, for read benchmarks (not committed).

Run in the TensorFlow venv: ``python tests/rlds_corpus/make_bench_dataset.py OUT [EPISODES]``. It writes
``OUT/mmfeed_rlds_bench/1.0.0/``: EPISODES episodes (default 200) of 20-60 steps, a 256x256 and a 128x128 JPEG
camera (smooth scenes with texture, so the JPEGs have the sizes real ones have), an 8-dim float32 state, 7-dim
float32 actions, the RLDS bools, reward, discount and the instruction text, over 16 shards (fewer for fewer
episodes).
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow_datasets as tfds


def scene(rng: np.random.Generator, size: int, t: int) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([np.sin(3 * x + t * 0.1), np.cos(2 * y - t * 0.05), np.sin(4 * (x + y))], -1) * 80 + 128
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


class MmfeedRldsBench(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")
    EPISODES = 200

    def _info(self) -> tfds.core.DatasetInfo:
        F = tfds.features
        return tfds.core.DatasetInfo(builder=self, features=F.FeaturesDict({
            "steps": F.Dataset({
                "observation": F.FeaturesDict({
                    "image": F.Image(shape=(256, 256, 3), encoding_format="jpeg"),
                    "wrist_image": F.Image(shape=(128, 128, 3), encoding_format="jpeg"),
                    "state": F.Tensor(shape=(8,), dtype=np.float32),
                }),
                "action": F.Tensor(shape=(7,), dtype=np.float32),
                "reward": F.Scalar(dtype=np.float32),
                "discount": F.Scalar(dtype=np.float32),
                "is_first": F.Scalar(dtype=np.bool_),
                "is_last": F.Scalar(dtype=np.bool_),
                "is_terminal": F.Scalar(dtype=np.bool_),
                "language_instruction": F.Text(),
            }),
            "episode_metadata": F.FeaturesDict({"file_path": F.Text()}),
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        rng = np.random.default_rng(0)
        for k in range(self.EPISODES):
            n = int(rng.integers(20, 61))
            steps = [{
                "observation": {"image": scene(rng, 256, t), "wrist_image": scene(rng, 128, t + 7),
                                "state": rng.normal(size=8).astype(np.float32)},
                "action": rng.normal(size=7).astype(np.float32), "reward": np.float32(t == n - 1),
                "discount": np.float32(1), "is_first": t == 0, "is_last": t == n - 1, "is_terminal": t == n - 1,
                "language_instruction": "pick up the red block and put it in the bowl",
            } for t in range(n)]
            yield k, {"steps": steps, "episode_metadata": {"file_path": f"/data/episode_{k}.npy"}}


if __name__ == "__main__":
    MmfeedRldsBench.EPISODES = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    builder = MmfeedRldsBench(data_dir=sys.argv[1])
    shards = min(16, MmfeedRldsBench.EPISODES)  # TFDS refuses more shards than episodes
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=shards))
