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

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    **{m: f"mmfeed.loaders.transport.{m}" for m in ("files", "remote", "tar", "confine", "json_limits", "errors")},
    **{m: f"mmfeed.loaders.stores.{m}" for m in ("index", "index_arrays", "frame_store", "stats", "quantiles")},
    "lerobot": "mmfeed.loaders.formats.lerobot.source",
    "webdataset": "mmfeed.loaders.formats.webdataset.source",
}
"""Old module name under ``mmfeed.loaders.sources`` -> where it lives now."""


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``mmfeed.loaders.sources.<old>`` as the module now at ``MOVED[old]`` (the same module object, so
    classes, pickles and ``isinstance`` agree)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, leaf = fullname.rpartition(".")
        if prefix != __name__ or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())
