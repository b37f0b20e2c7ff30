"""mmfeed.loaders.sources: one reader per format, and the writer.

- :mod:`~mmfeed.loaders.sources.base`: what every source is (:class:`Feature`, :class:`EpisodeRequest`,
  :class:`EpisodeSource`): features under the dataset's own names, each at its own rate.
- :mod:`~mmfeed.loaders.sources.webdataset`: indexed webdataset tar shards (byte-range reads, local or remote);
  :mod:`~mmfeed.loaders.sources.index` their parquet index; :mod:`~mmfeed.loaders.conversion.writer` the
  :class:`ShardWriter` that makes them from a user's own episodes; :mod:`~mmfeed.loaders.sources.remote` the
  bounded range cache for URLs.
- :mod:`~mmfeed.loaders.sources.lerobot`: LeRobot v3 directories.
- :mod:`~mmfeed.loaders.sources.arrays`: episodes already in memory; :mod:`~mmfeed.loaders.sources.concat`: several
  datasets read as one (mixtures); :mod:`~mmfeed.loaders.sources.stats`: feature statistics that merge exactly.

:func:`mmfeed.loaders.open_dataset` picks the reader for a path.
"""
