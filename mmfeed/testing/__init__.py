"""Test helpers that ship with mmfeed: synthetic videos, episodes, shards and hypothesis strategies.

Everything here is seeded and writes only where it is told to, so users can build the same fixtures in their own
research tests (``from mmfeed.testing import write_video``).
"""

from mmfeed.testing.synth import (DEFAULT_TASKS, SyntheticEpisode, make_episodes, write_lerobot, write_webdataset,
                                  write_webdataset_v1)
from mmfeed.testing.synth_embodiments import EMBODIMENTS, write_embodiments
from mmfeed.testing.synth_lerobot import grow_lerobot
from mmfeed.testing.video import INDEX_BITS, frame_pattern, read_index, write_video

__all__ = sorted(
    [
        "DEFAULT_TASKS",
        "EMBODIMENTS",
        "INDEX_BITS",
        "SyntheticEpisode",
        "frame_pattern",
        "grow_lerobot",
        "make_episodes",
        "read_index",
        "write_embodiments",
        "write_lerobot",
        "write_video",
        "write_webdataset",
        "write_webdataset_v1",
    ]
)
