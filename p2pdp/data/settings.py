"""Settings of the data a scenario reads: the ``[data]`` and ``[partition]`` tables.

:class:`DataConfig` and :class:`PartitionConfig` live with the data layer (not in
:mod:`p2pdp.config`) because the loaders and :mod:`p2pdp.data.partition` read them;
:mod:`p2pdp.config` composes them into a :class:`~p2pdp.config.ScenarioConfig` like every other
section. Fields declare their constraints (:mod:`p2pdp.core.validation`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When
from p2pdp.core.validation import (
    Boolean,
    ComponentName,
    IntAtLeast,
    OneOf,
    Optional,
    Positive,
    as_list,
    check,
    invalid,
    validate_fields,
)
from p2pdp.data.partition import PARTITION_SCHEMES
from p2pdp.data.preprocess import TRANSFORM_STEPS, Preprocessor


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """Which data set, and how rows are transformed before training.

    ``dataset`` names a registered loader (``p2pdp components dataset``: ``spambase``,
    ``australian``, ``adult``, ``synthetic``, ``csv``, ``libsvm``, ``numpy``) or gives an
    import string ``"package.module:function"`` of your own loader (see
    :class:`p2pdp.data.datasets.DatasetLoader`). ``path`` is where a built-in data set's files are
    searched first, the file ``csv``, ``libsvm`` and ``numpy`` read (required for them), and
    free for your own loader to read.

    Options of the file loaders (an error for any other data set unless left at the default):
    ``test_path`` a second file in the same format, the predefined test split (``csv``,
    ``libsvm``, ``numpy``); ``delimiter`` a single character or ``"whitespace"`` (``csv``);
    ``header`` skip a first line of column names (``csv``); ``label_column`` 0-based column of
    the label, negative from the end, default -1: the last (``csv``, a ``.npy`` file of
    ``numpy``); ``n_features`` the number of features d, default: the largest index in the
    file(s) (``libsvm``); ``peer_column`` the column holding each row's peer id, read by
    ``partition.scheme = "column"`` and not a feature: a 0-based index or, with ``header``,
    a column name (``csv``), an index (a ``.npy`` file) or the name of an array (a ``.npz``
    file) (``numpy``).

    ``transform`` steps are applied in order (see :mod:`p2pdp.data.preprocess`). A norm step
    (``project_unit_ball`` or ``scale_sqrt_d``) bounds every row's L2 norm by 1; a scenario
    whose privacy depends on that bound (a one-shot release of exact local models) refuses a
    transform without one (:class:`p2pdp.config.ScenarioConfig`). ``bounds = "data"`` fits
    min-max on the pooled training fold (a global, non-private step, recorded in results);
    ``"manifest"`` uses the data set's data-independent feature bounds. ``standardize``
    is always fitted on the pooled training fold (the same kind of non-private step).
    ``synthetic_*`` size the ``synthetic`` data set (a logistic model with lognormal features);
    another built-in data set refuses them (a loader of your own may read them).
    """

    dataset: str = field(default="spambase", metadata=check(ComponentName("dataset")))
    path: str | None = None
    test_path: str | None = None
    delimiter: str = ","
    header: bool = field(default=False, metadata=check(Boolean()))
    label_column: int = -1
    n_features: int | None = field(default=None, metadata=check(Optional(IntAtLeast(1))))
    peer_column: int | str | None = None
    transform: tuple[str, ...] = ("log1p", "minmax", "bias", "project_unit_ball")
    bounds: str = field(default="data", metadata=check(OneOf(("data", "manifest"))))
    synthetic_rows: int = field(default=4000, metadata=check(IntAtLeast(2)))
    synthetic_test_rows: int = field(default=1000, metadata=check(IntAtLeast(1)))
    synthetic_features: int = field(default=57, metadata=check(IntAtLeast(1)))

    def __post_init__(self) -> None:
        for key in ("path", "test_path"):
            value = getattr(self, key)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, key, os.fspath(value))
        validate_fields(self, "data")
        for key in ("path", "test_path"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, str) and value):
                raise invalid(f"data.{key}", "a non-empty path string", value)
        if self.dataset in FILE_LOADER_OPTIONS and self.path is None:
            raise ConfigError(
                f"data.path is required for data.dataset = {self.dataset!r}: "
                f"the {self.dataset} file to read"
            )
        if not isinstance(self.delimiter, str) or not (
            self.delimiter == "whitespace"
            or (len(self.delimiter) == 1 and self.delimiter not in '\r\n"0123456789.+-eE')
        ):
            raise invalid(
                "data.delimiter",
                "one character (not a digit, sign, '.', 'e', quote or newline) or 'whitespace'",
                self.delimiter,
            )
        if not isinstance(self.label_column, int) or isinstance(self.label_column, bool):
            requirement = "an integer (0-based; -1 is the last column)"
            raise invalid("data.label_column", requirement, self.label_column)
        self._check_peer_column()
        for key, default in _FILE_OPTION_DEFAULTS.items():
            value = getattr(self, key)
            if value != default and key not in FILE_LOADER_OPTIONS.get(self.dataset, ()):
                users = [name for name, keys in FILE_LOADER_OPTIONS.items() if key in keys]
                raise ConfigError(
                    f"data.{key} is an option of data.dataset = {' or '.join(map(repr, users))}; "
                    f"got data.{key} = {value!r} with data.dataset = {self.dataset!r}"
                )
        if self.dataset == "synthetic" and self.path is not None:
            raise ConfigError(
                f"data.path = {self.path!r} is not read by data.dataset = 'synthetic', which "
                "draws its rows (sized by data.synthetic_*): remove it, or set data.dataset "
                "to the loader of the file"
            )
        if self.dataset != "synthetic" and components.is_builtin("dataset", self.dataset):
            for key in SYNTHETIC_OPTIONS:  # a loader of your own may read them
                value = getattr(self, key)
                if value != _SYNTHETIC_DEFAULTS[key]:
                    raise ConfigError(
                        f"data.{key} sizes data.dataset = 'synthetic'; got data.{key} = "
                        f"{value!r} with data.dataset = {self.dataset!r}, which it would not "
                        f"change: remove it"
                    )
        if self.dataset == "numpy":
            self._check_numpy_options()
        object.__setattr__(self, "transform", as_list("data.transform", self.transform))
        if not self.transform:
            raise invalid("data.transform", "a non-empty list of steps", list(self.transform))
        for step in self.transform:
            OneOf(TRANSFORM_STEPS).check("data.transform", step)
        try:
            Preprocessor(steps=self.transform)
        except ConfigError as exc:
            raise ConfigError(f"data.transform = {list(self.transform)}: {exc}") from None
        if self.bounds == "manifest" and "minmax" not in self.transform:
            raise ConfigError(
                "data.bounds = 'manifest' gives the bounds of the 'minmax' step; got "
                f"data.transform = {list(self.transform)} without it"
            )

    def _check_peer_column(self) -> None:
        value = self.peer_column
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
            requirement = "a 0-based column index or a non-empty column name"
            raise invalid("data.peer_column", requirement, value)
        if isinstance(value, int) and value == self.label_column:
            raise ConfigError(
                f"data.peer_column must differ from data.label_column, got {value!r} for both"
            )
        if self.dataset == "csv" and isinstance(value, str) and not self.header:
            raise ConfigError(
                f"data.peer_column = {value!r} names a column, which needs data.header = true "
                "(a first line of column names); or give its 0-based index"
            )

    def _check_numpy_options(self) -> None:
        """A ``.npz`` file holds named arrays, a ``.npy`` file one table of columns."""
        suffixes = {Path(p).suffix.lower() for p in (self.path, self.test_path) if p is not None}
        if not suffixes <= {".npy", ".npz"} or len(suffixes) != 1:
            raise ConfigError(
                "data.path (and data.test_path) of data.dataset = 'numpy' must both be .npy or "
                f"both be .npz files, got {self.path!r}"
                + (f" and {self.test_path!r}" if self.test_path is not None else "")
            )
        if suffixes == {".npz"}:
            if self.label_column != -1:
                raise ConfigError(
                    "data.label_column picks a column of a .npy table; a .npz file holds its "
                    f"labels in the array 'y', got data.label_column = {self.label_column!r}"
                )
            if self.peer_column is not None and not isinstance(self.peer_column, str):
                raise invalid(
                    "data.peer_column", "the name of an array of the .npz file", self.peer_column
                )
        elif isinstance(self.peer_column, str):
            raise invalid(
                "data.peer_column", "a 0-based column index of the .npy table", self.peer_column
            )


#: Options of the built-in file loaders (data.dataset = "csv" / "libsvm" / "numpy") and their
#: defaults.
FILE_LOADER_OPTIONS = {
    "csv": ("test_path", "delimiter", "header", "label_column", "peer_column"),
    "libsvm": ("test_path", "n_features"),
    "numpy": ("test_path", "label_column", "peer_column"),
}
#: Settings of the ``synthetic`` data set: refused with another built-in one.
SYNTHETIC_OPTIONS = ("synthetic_rows", "synthetic_test_rows", "synthetic_features")
_SYNTHETIC_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(DataConfig) if f.name in SYNTHETIC_OPTIONS
}
_FILE_OPTION_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(DataConfig)
    if any(f.name in options for options in FILE_LOADER_OPTIONS.values())
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionConfig:
    """How training rows are split into peer shards (:mod:`p2pdp.data.partition`).

    ``scheme``: ``"iid"``, ``"label_skew"`` / ``"quantity_skew"`` (Dirichlet ``alpha``),
    ``"contiguous"`` (consecutive rows in their order: iid only for exchangeable rows such as
    ``synthetic``'s), or a partition the user gives, one peer id in ``0..n_peers-1`` per row
    of the data set (the rows the folds are cut from; a fold's test rows are simply not used
    for training):
    ``"column"`` takes it from the data set (``data.peer_column``, or a loader's
    ``RawData.peers``), ``"file"`` from the text file ``path`` (one id per line). Every peer
    id must be used, and every peer must hold at least ``min_shard_size`` training rows in
    every fold.
    """

    n_peers: int = field(default=100, metadata=check(IntAtLeast(1)))
    scheme: str = field(default="iid", metadata=check(OneOf(PARTITION_SCHEMES)))
    alpha: float = field(default=0.5, metadata=check(Positive()))
    min_shard_size: int = field(default=1, metadata=check(IntAtLeast(1)))
    path: str | None = None

    #: Settings read only for some values of this table's options, while the option itself is
    #: read (:func:`p2pdp.config.settings_read`).
    option_reads: ClassVar[tuple[When, ...]] = (
        When("partition.scheme", "label_skew", ("partition.alpha",)),
        When("partition.scheme", "quantity_skew", ("partition.alpha",)),
        When("partition.scheme", "file", ("partition.path",)),
    )

    def __post_init__(self) -> None:
        if isinstance(self.path, os.PathLike):
            object.__setattr__(self, "path", os.fspath(self.path))
        validate_fields(self, "partition")
        if self.path is not None and not (isinstance(self.path, str) and self.path):
            raise invalid("partition.path", "a non-empty path string", self.path)
        if self.scheme == "file" and self.path is None:
            raise ConfigError(
                "partition.path is required for partition.scheme = 'file': the file of "
                "peer ids, one per row of the data set"
            )
        if self.scheme != "file" and self.path is not None:
            raise ConfigError(
                f"partition.path is read only by partition.scheme = 'file'; got "
                f"partition.path = {self.path!r} with partition.scheme = {self.scheme!r}"
            )
