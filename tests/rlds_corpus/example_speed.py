"""Decode speed of mmfeed's ``tf.train.Example`` decoder against TensorFlow's protobuf, in MB/s of records.

Run in the TensorFlow venv that writes the corpus (it imports mmfeed's decoder from the repository by path, with
numpy only), from the repository root:

    python tests/rlds_corpus/example_speed.py

The records are OXE-shaped episodes (60 steps: a 256x256 and a 128x128 JPEG camera, 8-dim float state, 7-dim
float actions, bools, a reward, the instruction text per step), serialized by TensorFlow. Three figures per
record: ``tf.train.Example.FromString`` (a message, no arrays), the same plus numpy arrays of every key (what a
reader needs), and mmfeed's ``parse_example``: with every value (numpy arrays, a memoryview per picture), and as a
reader uses it (bytes lists split only when a sample asks for one of their values).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_decoder():
    path = os.path.join(ROOT, "loaders", "formats", "rlds", "example.py")
    spec = importlib.util.spec_from_file_location("rlds_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlds_example"] = module
    spec.loader.exec_module(module)
    return module


def jpeg(rng, size):
    base = rng.integers(0, 256, size=(size // 16, size // 16, 3)).astype(np.uint8)
    picture = np.kron(base, np.ones((16, 16, 1), np.uint8))
    picture = np.clip(picture.astype(np.int16) + rng.integers(-12, 12, picture.shape), 0, 255).astype(np.uint8)
    return tf.io.encode_jpeg(picture, quality=90).numpy()


def record(rng, steps=60):
    f = tf.train.Feature
    floats = lambda v: f(float_list=tf.train.FloatList(value=np.asarray(v, np.float32).ravel()))  # noqa: E731
    ints = lambda v: f(int64_list=tf.train.Int64List(value=np.asarray(v, np.int64).ravel()))  # noqa: E731
    blobs = lambda v: f(bytes_list=tf.train.BytesList(value=list(v)))  # noqa: E731
    features = {
        "steps/observation/image": blobs(jpeg(rng, 256) for _ in range(steps)),
        "steps/observation/wrist_image": blobs(jpeg(rng, 128) for _ in range(steps)),
        "steps/observation/state": floats(rng.normal(size=(steps, 8))),
        "steps/action": floats(rng.normal(size=(steps, 7))),
        "steps/reward": floats(np.zeros(steps)),
        "steps/discount": floats(np.ones(steps)),
        "steps/is_first": ints(np.arange(steps) == 0),
        "steps/is_last": ints(np.arange(steps) == steps - 1),
        "steps/is_terminal": ints(np.arange(steps) == steps - 1),
        "steps/language_instruction": blobs([b"pick up the red block and put it in the bowl"] * steps),
        "episode_metadata/file_path": blobs([b"/data/episode_0.npy"]),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def to_numpy(example):
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value
        out[key] = list(values) if kind == "bytes_list" else np.asarray(values)
    return out


def rate(fn, records, repeat):
    size = sum(len(r) for r in records) * repeat
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeat):
            for r in records:
                fn(r)
        best = min(best, time.perf_counter() - start)
    return size / best / 1e6, best / (repeat * len(records)) * 1e6


def main() -> None:
    ours = load_decoder()
    rng = np.random.default_rng(0)
    records = [record(rng) for _ in range(8)]
    mean_kb = np.mean([len(r) for r in records]) / 1e3
    figures = {
        "tf.train.Example.FromString": rate(tf.train.Example.FromString, records, 20),
        "FromString + numpy arrays": rate(lambda r: to_numpy(tf.train.Example.FromString(r)), records, 20),
        "mmfeed parse_example, every value": rate(lambda r: [v.values for v in ours.parse_example(r).values()],
                                                   records, 20),
        "mmfeed parse_example (lazy bytes)": rate(ours.parse_example, records, 20),
    }
    print(f"{len(records)} records of {mean_kb:.0f} KB (60 steps, 256x256 and 128x128 JPEG cameras), one core")
    for name, (mb_s, us) in figures.items():
        print(f"  {name:<36} {mb_s:8.0f} MB/s  {us:8.0f} us/record")


if __name__ == "__main__":
    main()
