"""LeRobot datasets named as LeRobot names them: by Hub id (``"lerobot/pusht"``).

:func:`resolve` finds what to open for an id, in LeRobot's order: LeRobot's own local copy
(``$HF_LEROBOT_HOME/<id>``, by default ``~/.cache/huggingface/lerobot/<id>``, what ``LeRobotDataset(id)`` downloaded),
read without any network; else, with ``download=True``, a snapshot downloaded into that same place
(``huggingface_hub.snapshot_download``); else the Hub's copy read in place, ``hf://datasets/<id>[@revision]``,
through huggingface_hub's fsspec filesystem, with byte ranges, the range cache and retries of every remote read.
Offline (``HF_HUB_OFFLINE=1``) or without huggingface_hub (the ``hub`` extra), an id with no local copy is one
error naming the id and every place looked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mmfeed.loaders.formats.lerobot.source import is_lerobot_dir

__all__ = ["is_hub_id", "lerobot_home", "resolve"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` reads as a Hub id (``org/name``) rather than a path: two plain names joined by one slash,
    no local file or folder of that name, no scheme, pattern or file suffix of a shard or index."""
    return (bool(_ID.fullmatch(spec)) and ".." not in spec and not spec.endswith((".tar", ".parquet", ".json"))
            and not os.path.exists(spec))


def lerobot_home() -> Path:
    """LeRobot's local datasets folder: ``$HF_LEROBOT_HOME``, else ``$HF_HOME/lerobot`` (``~/.cache/huggingface``)."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "lerobot"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(repo_id: str, *, revision: str | None = None, download: bool = False) -> str:
    """The directory or URL to open for the Hub id ``repo_id`` (see the module docstring); FileNotFoundError
    naming the id and every place looked when there is none."""
    local = lerobot_home() / repo_id
    if (local / "meta" / "info.json").is_file():
        return str(local)
    looked = [f"{local} (LeRobot's local copy, $HF_LEROBOT_HOME)", f"./{repo_id} (a local path)"]
    try:
        import huggingface_hub
    except ImportError:
        huggingface_hub = None
    if huggingface_hub is None:
        why = "huggingface_hub is not installed (pip install 'mmfeed[hub]')"
    elif _offline():
        why = "HF_HUB_OFFLINE is set"
    elif download:
        huggingface_hub.snapshot_download(repo_id, repo_type="dataset", revision=revision, local_dir=local)
        if (local / "meta" / "info.json").is_file():
            return str(local)
        why = f"the snapshot downloaded into {local} has no meta/info.json"
    else:
        url = f"hf://datasets/{repo_id}" + (f"@{revision}" if revision else "")
        try:
            if is_lerobot_dir(url):
                return url
            why = f"{url} has no meta/info.json"
        except (FileNotFoundError, PermissionError) as err:
            why = f"{url}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'not found'}"
    raise FileNotFoundError(f"{repo_id}: no such file or directory, nor a LeRobot dataset of that Hub id: looked in "
                            f"{'; '.join(looked)}; and on the Hub: {why}")
