"""Data: data sets and loaders (built-in, your own files, plug-ins), the ``[data]`` settings,
preprocessing and partitions of rows over peers.

:mod:`.loaders` the ``dataset`` component kind (:class:`~.loaders.RawData`,
:func:`~.loaders.load_data`, what a data set provides before it is loaded); the built-in
loaders: :mod:`.benchmarks` (Spambase, Australian, Adult: their :mod:`.manifests`, the
:mod:`.files` that hold them, their :mod:`.parsing`), :mod:`.synthetic` and :mod:`.own_files`
(CSV, LIBSVM, NumPy). :mod:`.settings` the ``[data]`` and ``[partition]`` tables,
:mod:`.preprocess` the transforms, :mod:`.partition` rows over peers.
"""
