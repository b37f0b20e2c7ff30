"""Three robots' datasets, each in a format mmfeed reads, for cross-embodiment tests and examples.

``write_embodiments(root)`` writes

- ``franka``: a 7-dim arm with one camera (``observation.images.front``), a LeRobot v3 directory;
- ``aloha``: a 14-dim bimanual robot with two cameras (``observation.images.top``, ``observation.images.wrist``),
  webdataset shards with their index;
- ``base``: a 2-dim mobile base with no camera, a LeRobot v3 directory.

Each holds ``observation.state``, ``action`` and ``observation.velocity`` of its own width (and ``next.reward``,
``next.done``; :meth:`~mmfeed.testing.synth_episodes.SyntheticEpisode.arrays`), at 30 fps, so a mixture of them
needs ``pad_to`` for the three vectors::

    >>> paths = write_embodiments(tmp_dir)                                              # doctest: +SKIP
    >>> mix = open_dataset(paths, pad_to={"action": 32, "observation.state": 32,
    ...                                   "observation.velocity": 32})                   # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

from mmfeed.testing.synth_episodes import make_episodes
from mmfeed.testing.synth_lerobot import write_lerobot
from mmfeed.testing.synth_webdataset import write_webdataset

__all__ = ["EMBODIMENTS", "write_embodiments"]

EMBODIMENTS = {"franka": (7, ("front",)), "aloha": (14, ("top", "wrist")), "base": (2, ())}
"""Each robot's state and action width and its cameras."""


def write_embodiments(root: str | os.PathLike, *, episodes: int = 4, min_length: int = 12, max_length: int = 30,
                      height: int = 32, width: int = 48, seed: int = 0) -> dict[str, str]:
    """Write the three robots' datasets under ``root`` (``episodes`` each; frames ``height x width``, H.264) and
    return ``{name: path}`` in the order of :data:`EMBODIMENTS`."""
    root = Path(root)
    out = {}
    for k, (name, (dim, cameras)) in enumerate(EMBODIMENTS.items()):
        eps = make_episodes(episodes, seed=seed + k, cameras=cameras, state_dim=dim, action_dim=dim,
                            min_length=min_length, max_length=max_length, height=height, width=width)
        path = root / name
        if name == "aloha":
            write_webdataset(path, eps, episodes_per_shard=2)
        else:
            write_lerobot(path, eps, codec="h264", gop=10)
        out[name] = str(path)
    return out
