"""Write the HDF5 and Zarr demonstration fixtures with the tools research code writes them with (h5py, zarr, and
cv2 for ALOHA's JPEG pictures), each beside its oracle: the arrays written, per episode, in ``<name>.npz``.

    python tests/demo_fixtures/make_fixtures.py          # rewrites every fixture in this folder

- ``robomimic.hdf5``: robomimic's layout (as its ``dataset_states_to_obs`` writes: pictures gzip-compressed):
  eleven demos ``data/demo_0`` .. ``demo_10`` (so natural order is not name order), ``mask/train`` and
  ``mask/valid``, ``env_args`` and LIBERO's ``problem_info`` with a ``language_instruction``.
- ``libero/``: two LIBERO task files (``*_demo.hdf5``, one instruction each, with the wrist camera), two demos
  each, in HDF5's newer file format (``libver="latest"``).
- ``aloha_raw/``: three ACT/ALOHA episode files (``episode_<k>.hdf5``) with raw uint8 cameras, as
  ``record_sim_episodes.py`` writes them.
- ``aloha_jpeg/``: three ALOHA episode files with ``cv2.imencode`` JPEG cameras zero-padded to the longest picture
  and ``/compress_len``, as ``record_episodes.py`` writes them (oracle: ``cv2.imdecode`` of each row, what ACT's
  loader gets, and the raw pictures).
- ``pusht.zarr``: diffusion_policy's ReplayBuffer (zarr format 2, as diffusion_policy's zarr 2 wrote it):
  ``data/{img, state, action, keypoint, n_contacts}`` cut by ``meta/episode_ends``; ``replay_v3.zarr``: the same
  layout in zarr format 3.

Everything is seeded; the oracles hold ``e<k>/<feature>`` arrays and ``tasks`` (one per episode).
"""

from __future__ import annotations

import json
import os
import shutil

import cv2
import h5py
import numpy as np
import zarr

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = (8, 12)  # picture height, width


def pictures(rng: np.random.Generator, n: int, size: tuple[int, int] = SIZE) -> np.ndarray:
    """``n`` smooth uint8 pictures (gradients with a little noise: small after compression, exact to compare)."""
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    base = rng.integers(0, 200, size=(n, 1, 1, 3))
    slope = rng.integers(1, 4, size=(n, 1, 1, 3))
    out = base + slope * (y[None, :, :, None] + x[None, :, :, None]) + rng.integers(0, 3, size=(n, h, w, 3))
    return np.clip(out, 0, 255).astype(np.uint8)


def save_oracle(name: str, episodes: list[dict[str, np.ndarray]], tasks: list[str]) -> None:
    arrays = {f"e{k}/{f}": v for k, ep in enumerate(episodes) for f, v in ep.items()}
    np.savez_compressed(os.path.join(HERE, f"{name}.npz"), tasks=np.asarray(tasks), **arrays)


def robomimic_file(path: str, rng: np.random.Generator, demos: int, instruction: str, masks: bool, wrist: bool,
                   libver: str = "earliest") -> list[dict[str, np.ndarray]]:
    """A robomimic/LIBERO file of ``demos`` demos (``wrist``: with LIBERO's wrist camera; ``libver``: h5py's file
    format version, its default or "latest"); returns each demo's arrays under their feature names."""
    episodes = []
    with h5py.File(path, "w", libver=libver) as f:
        data = f.create_group("data")
        env_args = {"env_name": "Libero_Kitchen_Tabletop_Manipulation", "type": 1,
                    "env_kwargs": {"control_freq": 20, "camera_heights": SIZE[0], "camera_widths": SIZE[1]}}
        data.attrs["env_args"] = json.dumps(env_args)
        data.attrs["problem_info"] = json.dumps({"problem_name": "libero_kitchen_tabletop_manipulation",
                                                 "domain_name": "kitchen", "language_instruction": instruction})
        data.attrs["bddl_file_name"] = "tasks/kitchen.bddl"
        total = 0
        for k in range(demos):
            t = int(rng.integers(4, 9))
            arrays = {
                "actions": rng.uniform(-1, 1, size=(t, 7)),
                "dones": (np.arange(t) == t - 1).astype(np.uint8),
                "obs.agentview_rgb": pictures(rng, t),
                "obs.gripper_states": rng.normal(size=(t, 2)),
                "obs.joint_states": rng.normal(size=(t, 7)),
                "rewards": (np.arange(t) == t - 1).astype(np.uint8),
                "states": rng.normal(size=(t, 9)),
            }
            if wrist:
                arrays["obs.eye_in_hand_rgb"] = pictures(rng, t)
            demo = data.create_group(f"demo_{k}")
            demo.attrs["num_samples"] = t
            demo.attrs["model_file"] = "<mujoco model='kitchen'/>"
            demo.attrs["init_state"] = arrays["states"][0]
            for name, values in arrays.items():  # pictures gzip-compressed, as robomimic's converter writes them
                picture = values.ndim == 4
                demo.create_dataset(name.replace(".", "/"), data=values, compression="gzip" if picture else None)
            episodes.append(arrays)
            total += t
        data.attrs["total"] = total
        if masks:
            names = [f"demo_{k}" for k in range(demos)]
            valid = names[::4]
            f.create_dataset("mask/valid", data=np.array(valid, dtype="S"))
            f.create_dataset("mask/train", data=np.array([n for n in names if n not in valid], dtype="S"))
    return episodes


def aloha_episode(path: str, rng: np.random.Generator, jpeg: bool) -> tuple[dict[str, np.ndarray], dict]:
    """One ALOHA episode file; returns the arrays (JPEG cameras: as ``cv2.imdecode`` gives them back) and the raw
    pictures."""
    t = int(rng.integers(5, 9))
    cameras = ("cam_high", "cam_left_wrist", "cam_right_wrist")
    arrays = {"action": rng.uniform(-1, 1, size=(t, 14)), "base_action": rng.normal(size=(t, 2)),
              "observations.effort": rng.normal(size=(t, 14)), "observations.qpos": rng.normal(size=(t, 14)),
              "observations.qvel": rng.normal(size=(t, 14))}
    raw = {c: pictures(rng, t) for c in cameras}
    with h5py.File(path, "w", rdcc_nbytes=1024 ** 2 * 2) as root:
        root.attrs["sim"] = False
        root.attrs["compress"] = jpeg
        obs = root.create_group("observations")
        image = obs.create_group("images")
        if jpeg:
            encoded = {c: [cv2.imencode(".jpg", p, [int(cv2.IMWRITE_JPEG_QUALITY), 50])[1] for p in raw[c]]
                       for c in cameras}
            padded = max(len(b) for c in cameras for b in encoded[c])
            lengths = np.zeros((len(cameras), t), dtype=np.float32)  # record_episodes.py's default dtype
            for i, c in enumerate(cameras):
                rows = np.zeros((t, padded), dtype=np.uint8)
                for j, b in enumerate(encoded[c]):
                    rows[j, : len(b)] = b.reshape(-1)
                    lengths[i, j] = len(b)
                image.create_dataset(c, (t, padded), dtype="uint8", chunks=(1, padded))[...] = rows
                arrays[f"observations.images.{c}"] = np.stack([cv2.imdecode(rows[j], 1) for j in range(t)])
            root.create_dataset("compress_len", (len(cameras), t), dtype="f4")[...] = lengths
        else:
            for c in cameras:
                image.create_dataset(c, (t, *SIZE, 3), dtype="uint8", chunks=(1, *SIZE, 3))[...] = raw[c]
                arrays[f"observations.images.{c}"] = raw[c]
        for name in ("qpos", "qvel", "effort"):
            obs.create_dataset(name, (t, 14), dtype="f4")[...] = arrays[f"observations.{name}"]
            arrays[f"observations.{name}"] = obs[name][()]  # float32, as written
        root.create_dataset("action", (t, 14), dtype="f4")[...] = arrays["action"]
        arrays["action"] = root["action"][()]
        root.create_dataset("base_action", (t, 2), dtype="f4")[...] = arrays["base_action"]
        arrays["base_action"] = root["base_action"][()]
    return arrays, raw


def replay_buffer(path: str, rng: np.random.Generator, zarr_format: int, episodes: int
                  ) -> list[dict[str, np.ndarray]]:
    """diffusion_policy's ReplayBuffer layout: ``data/<column>`` of every step back to back, ``meta/episode_ends``."""
    lengths = [int(rng.integers(4, 11)) for _ in range(episodes)]
    n = sum(lengths)
    columns = {"img": pictures(rng, n, (12, 12)), "state": rng.uniform(0, 512, size=(n, 5)).astype(np.float32),
               "action": rng.uniform(0, 512, size=(n, 2)).astype(np.float32),
               "keypoint": rng.uniform(0, 512, size=(n, 9, 2)).astype(np.float32),
               "n_contacts": rng.integers(0, 3, size=(n, 1)).astype(np.float32)}
    shutil.rmtree(path, ignore_errors=True)
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    data, meta = root.require_group("data"), root.require_group("meta")
    for name, values in columns.items():
        chunks = (8, *values.shape[1:]) if name == "img" else values.shape
        data.create_array(name, shape=values.shape, dtype=values.dtype, chunks=chunks)[...] = values
    ends = np.cumsum(lengths).astype(np.int64)
    meta.create_array("episode_ends", shape=ends.shape, dtype=np.int64, chunks=ends.shape)[...] = ends
    starts = np.concatenate([[0], ends[:-1]])
    return [{k: v[s:e] for k, v in columns.items()} for s, e in zip(starts, ends)]


def main() -> None:
    rng = np.random.default_rng(43)
    episodes = robomimic_file(os.path.join(HERE, "robomimic.hdf5"), rng, 11, "put the black bowl on the plate",
                              masks=True, wrist=False)
    save_oracle("robomimic", episodes, ["put the black bowl on the plate"] * len(episodes))

    folder = os.path.join(HERE, "libero")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    episodes, tasks = [], []
    for name, instruction in (("open_the_top_drawer_demo", "open the top drawer of the cabinet"),
                              ("turn_on_the_stove_demo", "turn on the stove")):
        eps = robomimic_file(os.path.join(folder, f"{name}.hdf5"), rng, 2, instruction, masks=False, wrist=True,
                             libver="latest")
        episodes += eps
        tasks += [instruction] * len(eps)
    save_oracle("libero", episodes, tasks)

    for jpeg, name in ((False, "aloha_raw"), (True, "aloha_jpeg")):
        folder = os.path.join(HERE, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        episodes, raws = [], []
        for k in range(3):
            arrays, raw = aloha_episode(os.path.join(folder, f"episode_{k}.hdf5"), rng, jpeg)
            episodes.append(arrays)
            raws.append({f"observations.images.{c}": v for c, v in raw.items()})
        save_oracle(name, episodes, [""] * 3)
        if jpeg:
            save_oracle(f"{name}_raw_pictures", raws, [""] * 3)

    save_oracle("pusht", replay_buffer(os.path.join(HERE, "pusht.zarr"), rng, 2, 5), [""] * 5)
    save_oracle("replay_v3", replay_buffer(os.path.join(HERE, "replay_v3.zarr"), rng, 3, 3), [""] * 3)


if __name__ == "__main__":
    main()
