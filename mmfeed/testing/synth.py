"""Seeded synthetic robot episodes and the two on-disk formats mmfeed reads: webdataset shards and LeRobot v3.0.

Every episode has smooth state trajectories (sums of sines), actions that are the next-step change of the
state, a task string, and one or more cameras whose pixels carry a frame index (:func:`frame_pattern`), so a test
can check from decoded pixels alone that the frame it got is the frame it asked for::

    >>> eps = make_episodes(2, seed=0, min_length=20, max_length=30)
    >>> eps[0].state.shape[1], eps[0].cameras["cam_high"].shape[1:]
    (14, (48, 64, 3))
    >>> shards = write_webdataset(tmp_dir, eps)                       # doctest: +SKIP
    >>> root = write_lerobot(tmp_dir / "lerobot", eps, codec="av1")   # doctest: +SKIP

What the pattern index means, per format:

- In memory (``ep.cameras[camera]``, ``ep.frames(camera)``) and in webdataset shards
  (``<key>.observation.images.<camera>.mp4``):
  the frame number within the episode's stream for that camera, ``0 .. ep.num_frames(camera) - 1``.
- In a LeRobot directory: the GLOBAL frame number within the concatenated video file, which is also the
  dataset-wide ``index`` column: frame ``i`` of episode ``e`` reads ``dataset_from_index[e] + i``
  (``ep.frames(camera, start=dataset_from_index)``).

Frames are not stored; they are generated on access, so hundreds of episodes cost only their states and actions.

This module gathers three parts: the episodes (:mod:`mmfeed.testing.synth_episodes`), the webdataset writer
(:mod:`mmfeed.testing.synth_webdataset`) and the LeRobot writer (:mod:`mmfeed.testing.synth_lerobot`).
"""

from mmfeed.testing.synth_episodes import DEFAULT_TASKS, SyntheticEpisode, make_episodes
from mmfeed.testing.synth_lerobot import write_lerobot
from mmfeed.testing.synth_webdataset import write_webdataset, write_webdataset_v1

__all__ = ["DEFAULT_TASKS", "SyntheticEpisode", "make_episodes", "write_lerobot", "write_webdataset",
           "write_webdataset_v1"]
