"""mmfeed.loaders.sources: the episode-source core, which every format shares and no format is.

- :mod:`~mmfeed.loaders.sources.base`: what every source is (:class:`Feature`, :class:`EpisodeSource`): features
  under the dataset's own names, each at its own rate;
- :mod:`~mmfeed.loaders.sources.requests`: :class:`EpisodeRequest`, what a source reads, and where windows and
  chunks of steps become reads; :mod:`~mmfeed.loaders.sources.windows`: ``ds.windows(...)``, a map-style view;
- :mod:`~mmfeed.loaders.sources.concat`: several datasets read as one (mixtures, ``pad_to``);
  :mod:`~mmfeed.loaders.sources.renamed`: a dataset's features under other names;
  :mod:`~mmfeed.loaders.sources.arrays`: episodes already in memory;
- :mod:`~mmfeed.loaders.sources.options`: :class:`ReadOptions`, the one read-options object of every format;
  :mod:`~mmfeed.loaders.sources.readers`: the video decoders a source keeps;
  :mod:`~mmfeed.loaders.sources.consistency`: what metadata checks share (a verdict, the skip policy).

The formats themselves are rooms of :mod:`mmfeed.loaders.formats`; bytes come through
:mod:`mmfeed.loaders.transport`; the index, the frame store and the stats live in :mod:`mmfeed.loaders.stores`.
:func:`mmfeed.loaders.open_dataset` picks the format for a path.

The modules that lived here before 0.5 (``sources.lerobot``, ``sources.webdataset``, ``sources.index``, ...) are
still importable under their old names, as aliases of their new homes, with a DeprecationWarning.
"""

from __future__ import annotations

from mmfeed._lazy import moved_modules

MOVED = {
    **{m: f"mmfeed.loaders.transport.{m}" for m in ("files", "remote", "tar", "confine", "json_limits", "errors")},
    **{m: f"mmfeed.loaders.stores.{m}" for m in ("index", "index_arrays", "frame_store", "stats", "quantiles")},
    "lerobot": "mmfeed.loaders.formats.lerobot.source",
    "webdataset": "mmfeed.loaders.formats.webdataset.source",
}
"""Old module name under ``mmfeed.loaders.sources`` -> where it lives now."""
moved_modules(__name__, MOVED)
