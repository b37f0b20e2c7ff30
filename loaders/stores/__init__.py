"""mmfeed.loaders.stores: what is kept about a dataset beside its data.

- :mod:`~mmfeed.loaders.stores.index`: the parquet index of webdataset shards (episodes, members, byte ranges,
  stats), written by ``mmfeed index`` and the shard writer;
- :mod:`~mmfeed.loaders.stores.index_arrays`: that index as flat columns, mapped from a per-node cache;
- :mod:`~mmfeed.loaders.stores.derived`: columns derived from a dataset's metadata, kept once per node, and
  :mod:`~mmfeed.loaders.stores.parquet_direct` and :mod:`~mmfeed.loaders.stores.parquet_children`: the columns
  of large parquet files read from their bytes by compiled kernels, or else in child processes;
- :mod:`~mmfeed.loaders.stores.frame_store`: decoded frames kept on local disk for later epochs;
- :mod:`~mmfeed.loaders.stores.stats` and :mod:`~mmfeed.loaders.stores.quantiles`: feature statistics and quantile
  sketches that merge exactly across episodes, shards and datasets.

It reads through :mod:`mmfeed.loaders.transport` and knows no format's reader.
"""
