"""Feature transforms, and the L2 norm bound some privacy proofs need.

The sensitivity bound of a peer's exact regularised logistic regression model released with
output perturbation (DESIGN.md section 3) holds only if every training row, *including* the
appended bias feature, has ``||x||_2 <= 1``; a norm step (``project_unit_ball`` or
``scale_sqrt_d``) gives it. Where nothing depends on the row norm (a non-private run, or
iterative steps whose per-record gradients are clipped) the norm step may be left out; which
runs need it is decided by the scenario (:class:`p2pdp.config.ScenarioConfig`), not here.
A :class:`Preprocessor` names the steps; :meth:`Preprocessor.fit` fits it on training rows only
and returns a :class:`FittedPreprocessor` that is then applied unchanged to training and test
rows. Test rows are never seen by ``fit``.

Steps, always applied in this order:

``log1p``
    ``sign(x) * log1p(|x|)`` elementwise. Equal to ``log1p`` on non-negative features (all of
    Spambase, Australian and a9a) and, being odd and monotone, also defined for negative values,
    so test rows never fail on a value the training rows did not have.
``minmax``
    ``(x - low) / (high - low)`` per feature, clipped to ``[0, 1]``. ``low``/``high`` are the
    training minimum/maximum (a global, non-private step: ``data_dependent=True``) or
    data-independent bounds given by the user. A constant feature (``high == low``) maps to 0.
    Test values outside the training range are clipped so that test rows live in the same
    domain as training rows; privacy concerns only training rows, so this costs nothing.
``standardize``
    ``(x - mean) / std`` per feature: mean 0 and unit variance on the training rows (population
    standard deviation, ``ddof = 0``), like scikit-learn's ``StandardScaler``. The mean and
    standard deviation are training statistics (a global, non-private step:
    ``data_dependent=True``); a constant feature maps to 0. Not bounded: rows keep no norm
    bound unless a norm step follows. Exclusive with ``minmax`` (one rescaling per feature).
``bias``
    Appends a constant 1.0 feature (regularised like the others).
``project_unit_ball``
    Divides only rows whose L2 norm exceeds 1 by their norm: a per-record, data-independent
    projection onto the unit ball.
``scale_sqrt_d``
    Divides every row by ``sqrt(n_columns)`` (the seed's scaling). Requires ``minmax`` so that
    every entry is in ``[0, 1]`` and the norm bound holds; it shrinks the signal of typical rows
    far more than the projection does.

At most one of ``project_unit_ball`` / ``scale_sqrt_d`` (:data:`NORM_STEPS`) may be given;
:attr:`Preprocessor.bounds_row_norms` says whether the steps bound every row's norm by 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.typing import ArrayLike, NDArray

from p2pdp.core.boundary import read_only
from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import current_workers, forked_map, is_shared, shared_empty

#: Preprocessing steps ``data.transform`` may list, in the order they are applied.
TRANSFORM_STEPS: tuple[str, ...] = (
    "log1p",
    "minmax",
    "standardize",
    "bias",
    "project_unit_ball",
    "scale_sqrt_d",
)
DEFAULT_STEPS: tuple[str, ...] = ("log1p", "minmax", "bias", "project_unit_ball")
SEED_STEPS: tuple[str, ...] = ("minmax", "bias", "scale_sqrt_d")
NORM_STEPS: tuple[str, ...] = ("project_unit_ball", "scale_sqrt_d")


def _signed_log1p(X: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.sign(X) * np.log1p(np.abs(X))


#: Rows fitted and transformed at a time, the default ``block_rows`` of
#: :meth:`Preprocessor.fit` and :meth:`FittedPreprocessor.transform`: blocks bound the
#: temporaries and are shared out to the local workers; the numbers do not depend on them.
ROW_BLOCK = 65_536


def _check_block_rows(block_rows: int) -> None:
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise ConfigError(f"block_rows must be an integer >= 1, got {block_rows!r}")


#: Rows :meth:`FittedPreprocessor._transform_rows` takes at a time: 1,024 rows of 58 features
#: (0.5 MB) stay in a core's L2 cache through every step.
_CHUNK_ROWS = 1024


def _as_matrix(values: ArrayLike, name: str) -> NDArray[np.float64]:
    """``values`` as a float64 2-D array with at least one row (finiteness unchecked)."""
    X = np.asarray(values, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ConfigError(f"{name} must be a 2-D array with at least one row, got shape {X.shape}")
    return X


def _check_finite(X: NDArray[np.float64], name: str) -> None:
    if not np.all(np.isfinite(X)):
        raise ConfigError(f"{name} must contain only finite values, got a NaN or infinity")


def _block_bounds(
    X: NDArray[np.float64], rows: slice
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    block = X[rows]
    return block.min(axis=0), block.max(axis=0)


def _column_bounds(
    X: NDArray[np.float64], name: str, block_rows: int
) -> tuple[NDArray[np.float64], ...]:
    """Each column's minimum and maximum, (d,) each, from the extremes of blocks of
    ``block_rows`` rows computed in the local worker processes (exact in any order, so the
    same for any number of workers and any blocks), with no N x d temporary. A NaN or
    infinity anywhere shows in an extreme: ConfigError."""
    starts = [slice(a, a + block_rows) for a in range(0, X.shape[0], block_rows)]
    blocks = forked_map(_block_bounds, X, starts, workers=min(current_workers(), len(starts)))
    low = np.min([block[0] for block in blocks], axis=0)
    high = np.max([block[1] for block in blocks], axis=0)
    _check_finite(np.concatenate([low, high]), name)
    return low, high


@dataclass(frozen=True, slots=True, kw_only=True)
class Preprocessor:
    """Which transform steps to apply, and optional data-independent min-max bounds.

    Parameters
    ----------
    steps : tuple of str
        A subsequence of :data:`TRANSFORM_STEPS`, in that order, with at most one of
        ``"minmax"`` / ``"standardize"`` and at most one of ``"project_unit_ball"`` /
        ``"scale_sqrt_d"`` (the latter requires ``"minmax"``).
    bounds : (ndarray, ndarray) or None
        Data-independent ``(low, high)`` per *raw* feature, each of shape ``(d,)``, finite,
        ``low <= high``. When given, ``minmax`` uses them (after ``log1p`` if that step is on)
        and :meth:`fit` reads only the shape of the training matrix, so the pipeline's only
        access to the data is the privacy mechanism. Requires the ``minmax`` step.
    """

    steps: tuple[str, ...] = DEFAULT_STEPS
    bounds: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        object.__setattr__(self, "steps", steps)
        for step in steps:
            if step not in TRANSFORM_STEPS:
                raise ConfigError(f"preprocess step must be one of {TRANSFORM_STEPS}, got {step!r}")
        for earlier, later in pairwise(steps):
            if TRANSFORM_STEPS.index(earlier) >= TRANSFORM_STEPS.index(later):
                raise ConfigError(
                    f"preprocess step {later!r} may not follow {earlier!r}; steps must be in "
                    f"the order {TRANSFORM_STEPS} without repeats, got {steps}"
                )
        for exclusive in (("minmax", "standardize"), NORM_STEPS):
            if all(step in steps for step in exclusive):
                raise ConfigError(
                    f"preprocess steps may contain at most one of {exclusive}, got {steps}"
                )
        if "scale_sqrt_d" in steps and "minmax" not in steps:
            raise ConfigError(
                "preprocess step 'scale_sqrt_d' bounds row norms only for entries in [0, 1]; "
                f"it requires 'minmax', got {steps}"
            )
        if self.bounds is not None:
            self._validate_bounds(self.bounds)

    @property
    def bounds_row_norms(self) -> bool:
        """Whether every transformed row has L2 norm <= 1 (a norm step is on)."""
        return any(step in NORM_STEPS for step in self.steps)

    def _validate_bounds(self, bounds: Sequence[ArrayLike]) -> None:
        """Store ``bounds`` (any pair of array-likes) as read-only float64 arrays, or raise."""
        if "minmax" not in self.steps:
            raise ConfigError(
                f"preprocess bounds are used only by the 'minmax' step, got {self.steps}"
            )
        if len(bounds) != 2:
            raise ConfigError(
                f"preprocess bounds must be a (low, high) pair, got {len(bounds)} items"
            )
        low, high = (read_only(np.array(b, dtype=np.float64)) for b in bounds)
        if low.ndim != 1 or low.shape != high.shape or low.size == 0:
            raise ConfigError(
                "preprocess bounds low and high must be non-empty 1-D arrays of equal length, "
                f"got shapes {low.shape} and {high.shape}"
            )
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ConfigError("preprocess bounds must be finite, got a NaN or infinity")
        bad = np.flatnonzero(low > high)
        if bad.size:
            j = bad[0]
            raise ConfigError(
                f"preprocess bounds need low <= high, got low={low[j]} > high={high[j]} "
                f"for feature {j}"
            )
        object.__setattr__(self, "bounds", (low, high))

    def fit(self, X_train: ArrayLike, *, block_rows: int = ROW_BLOCK) -> FittedPreprocessor:
        """Fit the transform on training rows only.

        Parameters
        ----------
        X_train : ndarray of shape (n, d)
            Raw training features, finite. With ``bounds`` set only ``X_train.shape`` is read.
        block_rows : int, default :data:`ROW_BLOCK`
            Rows whose extremes are taken at a time (``minmax``): the same bounds for any.

        Returns
        -------
        FittedPreprocessor
            Read-only fitted state. ``low``/``high`` have shape ``(d,)`` (after ``log1p`` if
            that step is on) or are None when ``minmax`` is off.
        """
        if self.bounds is not None:
            shape = np.shape(X_train)
            if len(shape) != 2 or shape[1] != self.bounds[0].size:
                raise ConfigError(
                    f"X_train must have shape (n, {self.bounds[0].size}) to match the bounds, "
                    f"got {shape}"
                )
            low, high = self.bounds
            if "log1p" in self.steps:
                low, high = read_only(_signed_log1p(low)), read_only(_signed_log1p(high))
            return FittedPreprocessor(
                steps=self.steps, n_features_in=shape[1], low=low, high=high, data_dependent=False
            )
        if "standardize" in self.steps:
            X = _as_matrix(X_train, "X_train")
            _check_finite(X, "X_train")
            Z = _signed_log1p(X) if "log1p" in self.steps else X
            mean, std = Z.mean(axis=0), Z.std(axis=0)
            # a feature constant up to the rounding of its mean is constant: it maps to 0
            std[std <= 10 * np.finfo(np.float64).eps * np.abs(mean)] = 0.0
            return FittedPreprocessor(
                steps=self.steps,
                n_features_in=X.shape[1],
                low=None,
                high=None,
                mean=read_only(mean),
                std=read_only(std),
                data_dependent=True,
            )
        _check_block_rows(block_rows)
        X = _as_matrix(X_train, "X_train")
        low, high = _column_bounds(X, "X_train", block_rows)
        if "minmax" not in self.steps:
            return FittedPreprocessor(
                steps=self.steps,
                n_features_in=X.shape[1],
                low=None,
                high=None,
                data_dependent=False,
            )
        if "log1p" in self.steps:  # monotone: the bounds of log1p(X) are log1p of X's
            low, high = _signed_log1p(low), _signed_log1p(high)
        return FittedPreprocessor(
            steps=self.steps,
            n_features_in=X.shape[1],
            low=read_only(low),
            high=read_only(high),
            data_dependent=True,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedPreprocessor:
    """A fitted transform; apply it to training and test rows alike.

    Attributes
    ----------
    steps : tuple of str
        The validated steps of the :class:`Preprocessor` it came from.
    n_features_in : int
        Number of raw features ``d``.
    low, high : ndarray of shape (d,) or None
        Min-max bounds (after ``log1p`` if on); None when ``minmax`` is off.
    mean, std : ndarray of shape (d,) or None
        Per-feature training mean and standard deviation (``ddof = 0``, after ``log1p`` if
        on) of the ``standardize`` step; None when it is off.
    data_dependent : bool
        True when ``low``/``high`` or ``mean``/``std`` were computed from the pooled training
        data: a global, non-private step that results must label as such.
    """

    steps: tuple[str, ...]
    n_features_in: int
    low: NDArray[np.float64] | None
    high: NDArray[np.float64] | None
    mean: NDArray[np.float64] | None = None
    std: NDArray[np.float64] | None = None
    data_dependent: bool

    def __post_init__(self) -> None:
        for step, names in (("minmax", ("low", "high")), ("standardize", ("mean", "std"))):
            given = [getattr(self, name) is not None for name in names]
            if given != [step in self.steps] * 2:
                raise ConfigError(
                    f"FittedPreprocessor {' and '.join(names)} must be given exactly when the "
                    f"{step!r} step is on, got steps {self.steps}, "
                    + ", ".join(f"{n} given: {g}" for n, g in zip(names, given, strict=True))
                )

    @property
    def n_features_out(self) -> int:
        """Number of output columns: ``d + 1`` with ``bias``, else ``d``."""
        return self.n_features_in + ("bias" in self.steps)

    def transform(
        self, X: ArrayLike, *, out: NDArray[np.float64] | None = None, block_rows: int = ROW_BLOCK
    ) -> NDArray[np.float64]:
        """Apply the fitted steps to rows ``X`` without changing the fitted state.

        Parameters
        ----------
        X : ndarray of shape (n, d)
            Raw features, finite.
        out : ndarray of shape (n, n_features_out), optional
            Where to write the result. It may be the memory of ``X`` itself (``X`` the first
            ``d`` columns of ``out``): each block of rows is read before it is written, so
            the rows are transformed in place, with no second copy. Blocks of rows are
            transformed in the local worker processes
            (:func:`p2pdp.core.parallel.local_workers`) when ``out`` is shared memory
            (:func:`p2pdp.core.parallel.shared_empty`, or not given): the same numbers.
        block_rows : int, default :data:`ROW_BLOCK`
            Rows transformed at a time: the same numbers for any.

        Returns
        -------
        ndarray of shape (n, n_features_out), float64
            ``out`` if given. With a norm step every row has L2 norm <= 1 (up to rounding,
            ~1e-16).
        """
        _check_block_rows(block_rows)
        rows_in = _as_matrix(X, "X")  # finite: checked block by block
        if rows_in.shape[1] != self.n_features_in:
            raise ConfigError(
                f"X must have {self.n_features_in} columns like the training rows, "
                f"got {rows_in.shape[1]}"
            )
        # Row blocks into one output array: peak memory is the input, the output and one block.
        shape = (rows_in.shape[0], self.n_features_out)
        starts = [slice(a, a + block_rows) for a in range(0, rows_in.shape[0], block_rows)]
        workers = min(current_workers(), len(starts))
        if out is None:
            out = shared_empty(shape) if workers > 1 else np.empty(shape)
        elif out.shape != shape or out.dtype != np.float64:
            raise ConfigError(f"out must be a float64 array of shape {shape}, got {out.shape}")
        # blocks in the local workers when they can write into out (each block reads and
        # writes its own rows only, so in place is safe in any order)
        forked_map(
            self._transform_block, (rows_in, out), starts, workers=workers if is_shared(out) else 1
        )
        return out

    def _transform_block(
        self, arrays: tuple[NDArray[np.float64], NDArray[np.float64]], rows: slice
    ) -> None:
        rows_in, out = arrays
        # a contiguous block: the same numpy kernels whether X is an array of its own or
        # the first columns of ``out`` (strided), so the numbers do not depend on it
        block = np.ascontiguousarray(rows_in[rows])
        _check_finite(block, "X")
        self._transform_rows(block, out=out[rows])

    def transform_logged(
        self, logged: NDArray[np.float64], *, out: NDArray[np.float64] | None = None
    ) -> NDArray[np.float64]:
        """:meth:`transform` of non-negative rows ``X`` (n, d), given ``log1p(X)`` (n, d)
        instead of ``X``: the ``log1p`` step (``sign(x) log1p(|x|)``, which is ``log1p(x)``
        bit for bit for ``x >= 0``) is not computed again. In this process (a block of rows),
        into ``out`` (n, n_features_out) float64 if given. Returns the rows :meth:`transform`
        gives for ``X``, bit for bit; with the ``minmax`` step, in one compiled pass over the
        rows (:func:`p2pdp.data.compiled.minmax_rows`: numba, which this method then
        imports). ConfigError without a ``log1p`` step, or for a non-finite entry."""
        if "log1p" not in self.steps:
            raise ConfigError(f"transform_logged needs the 'log1p' step, got {self.steps}")
        Z = _as_matrix(logged, "logged")
        if Z.shape[1] != self.n_features_in:
            raise ConfigError(
                f"logged must have {self.n_features_in} columns like the training rows, "
                f"got {Z.shape[1]}"
            )
        shape = (Z.shape[0], self.n_features_out)
        if out is not None and (out.shape != shape or out.dtype != np.float64):
            raise ConfigError(f"out must be a float64 array of shape {shape}, got {out.shape}")
        from p2pdp.data import compiled  # numba: loaded by the training in blocks anyway

        if (
            self.low is None
            or self.high is None
            or shape[1] > compiled.MAX_WIDTH
            or (out is not None and not out.flags.c_contiguous)
        ):
            _check_finite(Z, "logged")
            return self._transform_rows(Z, logged=True, out=out)
        # minmax (never with standardize) and what follows it, compiled: the same bits, each
        # value checked finite on the way
        norm = compiled.NORM_SCALE if "scale_sqrt_d" in self.steps else compiled.NORM_NONE
        norm = compiled.NORM_UNIT_BALL if "project_unit_ball" in self.steps else norm
        out = np.empty(shape) if out is None else out
        return compiled.minmax_rows(
            Z, self.low, self.high, bias="bias" in self.steps, norm=norm, out=out
        )

    def _transform_rows(
        self,
        Z: NDArray[np.float64],
        *,
        logged: bool = False,
        out: NDArray[np.float64] | None = None,
    ) -> NDArray[np.float64]:
        """The steps on rows ``Z`` (n, d) into ``out`` (n, n_features_out), a new array if
        None, :data:`_CHUNK_ROWS` rows at a time through one scratch array that stays in
        cache: every step is elementwise or a reduction along a row, so the numbers are the
        ones of the steps on all the rows at once, without their n x d temporaries."""
        n, d_in = Z.shape
        if out is None:
            out = np.empty((n, self.n_features_out))
        scratch = np.empty((min(n, _CHUNK_ROWS), self.n_features_out))
        low, high = self.low, self.high
        for start in range(0, n, _CHUNK_ROWS):
            rows = Z[start : start + _CHUNK_ROWS]
            chunk = scratch[: len(rows)]
            body = chunk[:, :d_in]
            if "log1p" in self.steps and not logged:
                np.multiply(np.sign(rows), np.log1p(np.abs(rows)), out=body)
            else:
                body[...] = rows
            if low is not None and high is not None:  # the minmax step (__post_init__)
                # overflow (tiny span) gives +-inf, which the clip maps to the right end of
                # [0, 1]; a constant feature (span 0) maps to 0
                span = high - low
                np.subtract(body, low, out=body)
                with np.errstate(over="ignore"):
                    np.divide(body, span, out=body, where=span > 0)
                body[:, span <= 0] = 0.0
                np.clip(body, 0.0, 1.0, out=body)
            if self.mean is not None and self.std is not None:  # the standardize step
                np.subtract(body, self.mean, out=body)
                np.divide(body, self.std, out=body, where=self.std > 0)
                body[:, self.std <= 0] = 0.0
            if "bias" in self.steps:
                chunk[:, d_in] = 1.0
            if "project_unit_ball" in self.steps:
                chunk /= np.maximum(np.linalg.norm(chunk, axis=1), 1.0)[:, None]
            elif "scale_sqrt_d" in self.steps:
                chunk /= np.sqrt(chunk.shape[1])
            out[start : start + len(rows)] = chunk
        return out
