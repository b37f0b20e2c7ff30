"""mmfeed.loaders.transport: bytes from where a dataset keeps them, for every format.

- :mod:`~mmfeed.loaders.transport.files`: a dataset's files by relative path, local or at an fsspec URL
  (:class:`DatasetFiles`, :class:`RemoteFile`), confined to the dataset's root;
- :mod:`~mmfeed.loaders.transport.remote`: byte ranges of remote files through a bounded block cache, with retries;
- :mod:`~mmfeed.loaders.transport.tar`: tar members by byte range (a shard's members, its ``meta.json``);
- :mod:`~mmfeed.loaders.transport.confine`: paths a dataset names stay inside it (templates, shard paths, links);
- :mod:`~mmfeed.loaders.transport.json_limits`: metadata JSON within size and depth limits;
- :mod:`~mmfeed.loaders.transport.errors`: what a read raises when one sample cannot be read (:class:`SampleError`).

A room below every other of the loaders: it imports only :mod:`mmfeed.codecs`.
"""
