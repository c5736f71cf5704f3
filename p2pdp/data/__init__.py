"""Data: data sets and loaders (built-in, your own files, plug-ins), the ``[data]`` settings,
preprocessing and partitions of rows over peers.
"""
