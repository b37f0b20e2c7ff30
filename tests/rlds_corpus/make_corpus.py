"""Write the RLDS conformance corpus with TensorFlow Datasets' own builder, and TFDS's decoded episodes as the oracle.

Run in a venv with TensorFlow and TFDS (tensorflow-cpu 2.21, tensorflow-datasets 4.9.10), from the repository root:

    python tests/rlds_corpus/make_corpus.py

It writes ``tests/rlds_corpus/mmfeed_rlds_corpus/1.0.0/`` (``dataset_info.json``, ``features.json`` and the
tfrecord shards of two splits, as an RLDS dataset is built: one record per episode, its steps a
``tfds.features.Dataset``) and ``tests/rlds_corpus/oracle-<split>.npz``: every episode as
``builder.as_dataset(split, shuffle_files=False)`` decodes it, flattened to ``<episode>/<feature path>`` arrays
(pictures decoded by TensorFlow). The reader's tests compare against these files without TensorFlow.
Regenerated shards decode to the same oracle but need not be the same bytes (TensorFlow serializes an Example's
feature map in no fixed order).
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import tensorflow_datasets as tfds

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "mmfeed_rlds_corpus"
TASKS = ["pick up the red block", "put it in the bowl", "open the drawer", "wave"]


class MmfeedRldsCorpus(tfds.core.GeneratorBasedBuilder):
    """A small RLDS dataset with every feature type an OXE dataset uses."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "mmfeed's RLDS conformance corpus."}

    def _info(self) -> tfds.core.DatasetInfo:
        F = tfds.features
        steps = F.Dataset({
            "observation": F.FeaturesDict({
                "image": F.Image(shape=(32, 40, 3), encoding_format="jpeg"),
                "wrist_image": F.Image(shape=(16, 16, 3), encoding_format="png"),
                "state": F.Tensor(shape=(8,), dtype=np.float64),
                "depth": F.Tensor(shape=(4, 5), dtype=np.float32, encoding=F.Encoding.ZLIB),
                "joint_ids": F.Tensor(shape=(3,), dtype=np.uint16, encoding=F.Encoding.BYTES),
            }),
            "action": F.Tensor(shape=(7,), dtype=np.float32),
            "reward": F.Scalar(dtype=np.float32),
            "discount": F.Scalar(dtype=np.float64),
            "is_first": F.Scalar(dtype=np.bool_),
            "is_last": F.Scalar(dtype=np.bool_),
            "is_terminal": F.Scalar(dtype=np.bool_),
            "counter": F.Scalar(dtype=np.int64),
            "language_instruction": F.Text(),
            "language_embedding": F.Tensor(shape=(4,), dtype=np.float32),
            "gripper": F.ClassLabel(names=["open", "closed"]),
            "contacts": F.Sequence(F.Tensor(shape=(), dtype=np.int32)),
        })
        return tfds.core.DatasetInfo(
            builder=self,
            features=F.FeaturesDict({
                "steps": steps,
                "episode_metadata": F.FeaturesDict({"file_path": F.Text(), "episode_id": F.Scalar(dtype=np.int32)}),
            }),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples("train", 9, seed=1), "val": self._generate_examples("val", 4, seed=2)}

    def _generate_examples(self, split: str, count: int, seed: int):
        rng = np.random.default_rng(seed)
        for k in range(count):
            length = 1 if k == 3 else int(rng.integers(2, 9))
            steps = []
            switch = int(rng.integers(1, length)) if length > 2 else length
            first, second = TASKS[k % len(TASKS)], TASKS[(k + 1) % len(TASKS)]
            for t in range(length):
                base = rng.integers(0, 256, size=(4, 5, 3))
                image = np.kron(base, np.ones((8, 8, 1))).astype(np.uint8)  # blocks: JPEG-friendly
                steps.append({
                    "observation": {
                        "image": image,
                        "wrist_image": rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8),
                        "state": rng.normal(size=8).astype(np.float64),
                        "depth": rng.normal(size=(4, 5)).astype(np.float32),
                        "joint_ids": rng.integers(0, 65535, size=3).astype(np.uint16),
                    },
                    "action": rng.normal(size=7).astype(np.float32),
                    "reward": np.float32(t == length - 1),
                    "discount": 0.99 ** t,
                    "is_first": t == 0,
                    "is_last": t == length - 1,
                    "is_terminal": bool(t == length - 1 and k % 2 == 0),
                    "counter": int(rng.integers(-2**40, 2**40)),
                    "language_instruction": first if t < switch else second,
                    "language_embedding": rng.normal(size=4).astype(np.float32),
                    "gripper": int(rng.integers(0, 2)),
                    "contacts": rng.integers(-5, 1000, size=int(rng.integers(0, 4))).astype(np.int32),
                })
            key = f"{split}-{k}"
            yield key, {"steps": steps,
                        "episode_metadata": {"file_path": f"/data/{split}/episode_{k}.npy", "episode_id": k}}


def flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}/{key}" if prefix else key, item, out)
    else:
        out[prefix] = value


def main() -> None:
    work = os.path.join(HERE, "_build")
    shutil.rmtree(work, ignore_errors=True)
    builder = MmfeedRldsCorpus(data_dir=work)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
    version_dir = os.path.join(work, NAME, "1.0.0")
    target = os.path.join(HERE, NAME, "1.0.0")
    shutil.rmtree(os.path.join(HERE, NAME), ignore_errors=True)
    os.makedirs(target)
    for name in sorted(os.listdir(version_dir)):
        shutil.copy(os.path.join(version_dir, name), os.path.join(target, name))
    for split in ("train", "val"):
        arrays = {}
        for e, episode in enumerate(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))):
            flat: dict = {}
            flatten("", {"episode_metadata": episode["episode_metadata"]}, flat)
            steps = episode["steps"]
            collected: dict[str, list] = {}
            for step in steps:
                one: dict = {}
                flatten("", step, one)
                for key, value in one.items():
                    collected.setdefault(f"steps/{key}", []).append(value)
            for key, values in collected.items():
                if key == "steps/contacts":  # ragged: flat values and row lengths
                    flat[f"{key}/flat"] = np.concatenate([np.asarray(v, np.int32) for v in values])
                    flat[f"{key}/lengths"] = np.array([len(v) for v in values], np.int64)
                else:
                    flat[key] = np.stack([np.asarray(v) for v in values])
            for key, value in flat.items():
                value = np.asarray(value)
                if value.dtype.kind in "OS":  # text: utf-8 bytes as str
                    value = np.array([v.decode() if isinstance(v, bytes) else v for v in value.reshape(-1)],
                                     dtype=str).reshape(value.shape)
                arrays[f"{e}/{key}"] = value
        np.savez_compressed(os.path.join(HERE, f"oracle-{split}.npz"), **arrays)
    shutil.rmtree(work)
    print("wrote", target, sorted(os.listdir(target)), file=sys.stderr)


if __name__ == "__main__":
    main()
