"""LeRobot v3 directories (local, or at an fsspec URL): ``meta/info.json``, ``meta/episodes/``, parquet data and mp4
video files, and LeRobot v2.x ones (``meta/episodes.jsonl``, a parquet file and a video per episode). :mod:`.metadata`
reads and checks the metadata against the data; :mod:`.v21` reads v2.x metadata into the same episode columns;
:mod:`.source` is the episode reader (:class:`~mmfeed.loaders.formats.lerobot.source.LeRobotSource`)."""

from __future__ import annotations

from mmfeed.loaders.formats import Format
from mmfeed.loaders.formats.lerobot.source import LeRobotSource, is_lerobot_dir

__all__ = ["FORMAT", "LeRobotSource", "is_lerobot_dir"]


def detect(path: str) -> str | None:
    """``path`` when it is a LeRobot dataset root (a directory or fsspec URL with ``meta/info.json``)."""
    return path if is_lerobot_dir(path) else None


FORMAT = Format("lerobot", LeRobotSource, detect)
