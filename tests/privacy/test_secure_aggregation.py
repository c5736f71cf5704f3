from __future__ import annotations

import math
import re

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats
from sklearn.linear_model import LogisticRegression

import p2pdp.privacy.secure_aggregation as sa
from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.privacy.secure_aggregation import (
    FixedPoint,
    SecureAggregationAborted,
    draw_noise_shares,
    protocol_cost,
    secure_noisy_mean,
    secure_sum,
    share,
)

CODEC = FixedPoint()


def _narrow_share(values: np.ndarray, n_shares: int, *, rng: np.random.Generator) -> np.ndarray:
    """Broken sharing: masks from [0, 100) instead of the whole ring."""
    values = np.asarray(values, dtype=np.uint64)
    shares = rng.integers(0, 100, size=(*values.shape[:-1], n_shares, values.shape[-1]))
    shares = shares.astype(np.uint64)
    shares[..., -1, :] = values - shares[..., :-1, :].sum(axis=-2)
    return shares


def _unmasked_share(values: np.ndarray, n_shares: int, *, rng: np.random.Generator) -> np.ndarray:
    """Broken sharing: no masks at all, the last member receives the value itself."""
    values = np.asarray(values, dtype=np.uint64)
    shares = np.zeros((*values.shape[:-1], n_shares, values.shape[-1]), dtype=np.uint64)
    shares[..., -1, :] = values
    return shares


def _byte_uniformity_pvalues(words: np.ndarray) -> tuple[float, float]:
    """Chi-square p-values of the low and the high byte of uint64 words being uniform."""
    words = np.asarray(words, dtype=np.uint64).ravel()
    low = np.bincount((words & np.uint64(0xFF)).astype(np.intp), minlength=256)
    high = np.bincount((words >> np.uint64(56)).astype(np.intp), minlength=256)
    return stats.chisquare(low).pvalue, stats.chisquare(high).pvalue


def _curator_view(models: np.ndarray, noise: np.ndarray, curator: int, seed: int) -> np.ndarray:
    """Everything the curator receives in one round, as floats in [0, 1)."""
    result = secure_noisy_mean(
        models, noise, curator=curator, rng=np.random.default_rng(seed), record=True
    )
    received = [m.payload for m in result.transcript if m.receiver == curator]
    return np.concatenate(received) / 2.0**64


def _leaks(transcript: tuple[sa.Message, ...], secrets: np.ndarray) -> bool:
    """Whether any word of any message equals any word of ``secrets``."""
    return any(np.isin(m.payload, secrets).any() for m in transcript)


def _logistic_objective(w: np.ndarray, X: np.ndarray, y: np.ndarray, lam: float) -> float:
    return float(np.mean(np.logaddexp(0.0, -y * (X @ w))) + 0.5 * lam * w @ w)


# --- fixed-point codec ---------------------------------------------------------------------


@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 50),
        elements=st.floats(-(2.0**29), 2.0**29, allow_nan=False, allow_infinity=False),
    ),
    st.sampled_from([16, 32, 40]),
)
def test_round_trip_error_is_at_most_half_a_unit(x: np.ndarray, frac_bits: int) -> None:
    codec = FixedPoint(frac_bits=frac_bits)
    if np.abs(x).max() >= codec.max_abs:
        with pytest.raises(ConfigError):
            codec.encode(x)
        return
    encoded = codec.encode(x)
    assert encoded.dtype == np.uint64
    assert np.all(np.abs(codec.decode(encoded) - x) <= 2.0 ** -(frac_bits + 1))


def test_negative_values_use_twos_complement() -> None:
    encoded = FixedPoint(frac_bits=32).encode(np.array([-1.0, 1.0, -(2.0**-32)]))
    assert encoded.tolist() == [2**64 - 2**32, 2**32, 2**64 - 1]


def test_modular_sum_of_encodings_decodes_to_the_sum() -> None:
    x = np.array([[-3.25, 2.0**20], [1.5, -(2.0**20) - 7.0], [-0.125, 1.0]])
    assert CODEC.decode(CODEC.encode(x, sum_axis=0).sum(axis=0)).tolist() == [-1.875, -6.0]


@pytest.mark.parametrize("frac_bits", [0, 62, 32.0, True])
def test_invalid_frac_bits_are_rejected(frac_bits: object) -> None:
    with pytest.raises(ConfigError, match=f"frac_bits .*got {frac_bits!r}"):
        FixedPoint(frac_bits=frac_bits)


@pytest.mark.parametrize("bad", [2.0**30, -(2.0**31), np.nan, np.inf])
def test_out_of_range_value_is_named(bad: float) -> None:
    named = rf"value {re.escape(repr(bad))} at index \(1,\) is outside the fixed-point range"
    with pytest.raises(ConfigError, match=named + r" \(-2\^30, 2\^30\) of frac_bits=32"):
        FixedPoint(frac_bits=32).encode(np.array([0.5, bad]))


def test_sum_bound_is_checked_on_the_values() -> None:
    half = 0.6 * CODEC.max_abs
    CODEC.encode(np.array([[half, 1.0], [-half, 1.0]]))  # each value fits
    with pytest.raises(
        ConfigError, match=rf"sum of \|values\| {1.2 * CODEC.max_abs!r} at index \(0,\)"
    ):
        CODEC.encode(np.array([[half, 1.0], [-half, 1.0]]), sum_axis=0)


@pytest.mark.parametrize("lam", [1e-1, 1e-2, 1e-3, 1e-4])
def test_exact_logistic_minimiser_norm_is_within_the_documented_bound(lam: float) -> None:
    rng = np.random.default_rng(11)
    n, d = 60, 8
    X = rng.normal(size=(n, d))
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1.0)
    y = np.sign(X @ rng.normal(size=d))  # separable: the norm grows as lambda shrinks
    fit = LogisticRegression(C=1.0 / (n * lam), fit_intercept=False, tol=1e-12, max_iter=100_000)
    w = fit.fit(X, y).coef_.ravel()
    gradient = X.T @ (-y / (1.0 + np.exp(y * (X @ w)))) / n + lam * w
    assert np.linalg.norm(gradient) < 1e-6  # w is the minimiser
    assert _logistic_objective(w, X, y, lam) <= math.log(2.0)
    assert np.linalg.norm(w) <= math.sqrt(2.0 * math.log(2.0) / lam)


# --- sharing -------------------------------------------------------------------------------


def test_shares_add_up_to_the_values_mod_2_64() -> None:
    values = CODEC.encode(np.random.default_rng(0).normal(size=(6, 9)))
    shares = share(values, 5, rng=np.random.default_rng(1))
    assert shares.shape == (6, 5, 9) and shares.dtype == np.uint64
    np.testing.assert_array_equal(shares.sum(axis=1), values)


def test_shares_are_uniform_and_a_narrow_sharing_is_caught() -> None:
    values = CODEC.encode(np.full((2000, 16), 0.5))  # low 32 bits of the values are zero
    good = share(values, 4, rng=np.random.default_rng(2))
    assert min(_byte_uniformity_pvalues(good)) > 0.01
    narrow = _narrow_share(values, 4, rng=np.random.default_rng(2))
    assert max(_byte_uniformity_pvalues(narrow[:, :-1])) < 1e-6


def test_invalid_share_count_is_named() -> None:
    with pytest.raises(ConfigError, match="n_shares must be an integer >= 1, got 0"):
        share(np.zeros(3, dtype=np.uint64), 0, rng=np.random.default_rng(0))


# --- the protocol --------------------------------------------------------------------------


@pytest.mark.parametrize("n_members", [1, 2, 7])
def test_transcript_matches_the_protocol_and_its_cost(n_members: int) -> None:
    dim, curator = 5, n_members - 1
    contributions = np.random.default_rng(3).normal(size=(n_members, dim))
    result = secure_sum(contributions, curator=curator, rng=np.random.default_rng(4), record=True)
    cost = protocol_cost(n_members, dim)
    assert result.cost == cost
    shares = [m for m in result.transcript if m.kind == "share"]
    partials = [m for m in result.transcript if m.kind == "partial"]
    assert {(m.sender, m.receiver) for m in shares} == {
        (i, j) for i in range(n_members) for j in range(n_members) if i != j
    }
    assert sorted(m.sender for m in partials) == [j for j in range(n_members) if j != curator]
    assert all(m.receiver == curator for m in partials)
    assert len(result.transcript) == cost.messages == n_members**2 - 1
    assert all(m.payload.nbytes == cost.payload_bytes for m in result.transcript)
    assert sum(m.payload.nbytes for m in result.transcript) == cost.bytes_per_round
    sent = [
        sum(m.payload.nbytes for m in result.transcript if m.sender == i) for i in range(n_members)
    ]
    assert max(sent) == cost.bytes_per_member
    # the curator's own partial sum (not sent) and the received ones add up to the total
    own = sum(m.payload for m in shares if m.receiver == curator) + (
        CODEC.encode(contributions[curator]) - sum(m.payload for m in shares if m.sender == curator)
    )
    total = own + sum(m.payload for m in partials)
    np.testing.assert_array_equal(CODEC.decode(total), result.total)


def test_fast_path_and_recorded_path_agree() -> None:
    contributions = np.random.default_rng(5).normal(size=(10, 58))
    fast = secure_sum(contributions, curator=3, rng=np.random.default_rng(6))
    recorded = secure_sum(contributions, curator=3, rng=np.random.default_rng(6), record=True)
    assert fast.transcript is None
    np.testing.assert_array_equal(fast.total, recorded.total)


@pytest.mark.parametrize(("n_members", "dim"), [(10, 58), (100, 124)])
def test_decoded_sum_matches_the_plaintext_sum(n_members: int, dim: int) -> None:
    rng = np.random.default_rng(7)
    lam = 1e-2
    models = rng.normal(size=(n_members, dim))
    models *= rng.uniform(
        0, math.sqrt(2 * math.log(2) / lam), size=(n_members, 1)
    ) / np.linalg.norm(models, axis=1, keepdims=True)
    noise = rng.laplace(scale=0.05 / n_members, size=(n_members, dim))
    plaintext = models.mean(axis=0) + noise.sum(axis=0)
    result = secure_noisy_mean(models, noise, curator=0, rng=rng)
    rounding_bound = n_members * 2.0 ** -(CODEC.frac_bits + 1)
    assert np.abs(result.total - plaintext).max() <= rounding_bound + 1e-14
    assert np.linalg.norm(result.total - plaintext) / np.linalg.norm(plaintext) < 1e-9


def test_no_model_or_encoding_appears_in_any_message(monkeypatch: pytest.MonkeyPatch) -> None:
    n_members, dim = 6, 20
    rng = np.random.default_rng(8)
    models = rng.normal(size=(n_members, dim))
    noise = rng.normal(scale=0.1, size=(n_members, dim))
    secrets = np.concatenate(
        [
            models.view(np.uint64),  # raw float bits
            CODEC.encode(models),
            CODEC.encode(models / n_members),
            CODEC.encode(models / n_members + noise),  # the encoded contributions
        ]
    )
    result = secure_noisy_mean(models, noise, curator=2, rng=rng, record=True)
    assert not _leaks(result.transcript, secrets)
    monkeypatch.setattr(sa, "share", _unmasked_share)  # the detector must catch a leak
    broken = secure_noisy_mean(models, noise, curator=2, rng=rng, record=True)
    assert _leaks(broken.transcript, secrets)


def _view_pvalues(curator: int, n_members: int = 4, dim: int = 3, runs: int = 1500) -> np.ndarray:
    """KS p-values, per received coordinate, of the curator's view under two model sets.

    The sets share the curator's own model, the noise draws and the (exact) noisy sum, but the
    other members' models differ.
    """
    rng = np.random.default_rng(9)
    grid = 2.0**-8  # exact in fixed point, so both sets have bit-identical sums
    models_a = rng.integers(-1024, 1024, size=(n_members, dim)) * grid
    shift = rng.integers(-1024, 1024, size=(n_members, dim)) * grid
    shift[curator] = 0.0
    others = [i for i in range(n_members) if i != curator]
    shift[others[-1]] = -shift[others[:-1]].sum(axis=0)
    models_b = models_a + shift
    noise = rng.integers(-256, 256, size=(n_members, dim)) * grid
    totals = [
        secure_noisy_mean(m, noise, curator=curator, rng=rng).total for m in (models_a, models_b)
    ]
    np.testing.assert_array_equal(*totals)
    view_a = np.array([_curator_view(models_a, noise, curator, s) for s in range(runs)])
    view_b = np.array([_curator_view(models_b, noise, curator, s + runs) for s in range(runs)])
    return stats.ks_2samp(view_a, view_b, axis=0).pvalue


@pytest.mark.parametrize("curator", [0, 3])
def test_curator_view_depends_only_on_its_input_and_the_sum(curator: int) -> None:
    p = _view_pvalues(curator)
    assert p.size == 2 * 3 * 3  # shares and partial sums from the 3 other members
    assert p.min() > 0.01 / p.size  # Bonferroni over the coordinates


def test_view_test_detects_a_narrow_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sa, "share", _narrow_share)
    assert _view_pvalues(curator=3).min() < 1e-6  # member 3 receives the correction shares


# --- dropouts ------------------------------------------------------------------------------


@pytest.mark.parametrize("dropped", [{2}, {0}, {1, 4}])
def test_dropout_aborts_before_anything_is_drawn(dropped: set[int]) -> None:
    rng = np.random.default_rng(10)
    state = rng.bit_generator.state
    with pytest.raises(SecureAggregationAborted, match="dropped out") as caught:
        secure_sum(np.ones((5, 3)), curator=0, rng=rng, dropped=dropped)
    assert isinstance(caught.value, P2PDPError)
    assert caught.value.dropped == tuple(sorted(dropped))
    assert rng.bit_generator.state == state  # no share was drawn, nothing decoded


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"curator": 5}, "curator must be a member index in \\[0, 5\\), got 5"),
        ({"curator": 0, "dropped": {-1}}, "dropped member must be .* got -1"),
    ],
)
def test_invalid_member_indices_are_named(kwargs: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        secure_sum(np.ones((5, 3)), rng=np.random.default_rng(0), **kwargs)


def test_shape_mismatch_is_named() -> None:
    with pytest.raises(ConfigError, match=r"got \(4, 3\) and \(4, 2\)"):
        secure_noisy_mean(np.ones((4, 3)), np.ones((4, 2)), curator=0, rng=np.random.default_rng(0))


@pytest.mark.parametrize(("n_members", "dim"), [(0, 3), (3, 0), (2.0, 3)])
def test_invalid_protocol_sizes_are_named(n_members: object, dim: object) -> None:
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        protocol_cost(n_members, dim)


# --- distributed noise (p2pdp.privacy.mechanisms)
# --------------------------------------------------


def test_vector_laplace_cannot_be_split() -> None:
    from p2pdp.privacy.mechanisms import make_mechanism

    mechanism = make_mechanism("vector-laplace", epsilon=1.0)
    with pytest.raises(ConfigError, match=r"'vector-laplace'.*coordinate-laplace or gaussian"):
        draw_noise_shares(
            mechanism, sensitivity=0.1, n_members=5, dim=3, rng=np.random.default_rng(0)
        )


@pytest.mark.parametrize(("name", "delta"), [("coordinate-laplace", None), ("gaussian", 1e-5)])
def test_any_k_minus_1_noise_shares_carry_the_full_noise(name: str, delta: float | None) -> None:
    from p2pdp.privacy.mechanisms import make_mechanism

    mechanism = make_mechanism(name, epsilon=1.0, delta=delta)
    n_members, dim = 5, 20_000  # coordinates are iid: one draw gives many samples
    rng = np.random.default_rng(12)
    shares = draw_noise_shares(mechanism, sensitivity=0.1, n_members=n_members, dim=dim, rng=rng)
    assert shares.shape == (n_members, dim)
    full = mechanism.noise_shares(0.1, dim, 1, rng=rng)[0]
    without_own = shares[1:].sum(axis=0)  # what member 0 cannot remove
    assert stats.ks_2samp(without_own, full).pvalue > 0.01
    # control: a K-way split minus one's own share is detectably short of the full noise
    naive = mechanism.noise_shares(0.1, dim, n_members, rng=rng)[1:].sum(axis=0)
    assert stats.ks_2samp(naive, full).pvalue < 1e-6


def test_secure_noisy_mean_with_mechanism_noise() -> None:
    from p2pdp.privacy.mechanisms import make_mechanism

    mechanism = make_mechanism("gaussian", epsilon=1.0, delta=1e-5)
    rng = np.random.default_rng(13)
    models = rng.normal(size=(10, 58))
    noise = draw_noise_shares(mechanism, sensitivity=0.01, n_members=10, dim=58, rng=rng)
    result = secure_noisy_mean(models, noise, curator=4, rng=rng)
    expected = models.mean(axis=0) + noise.sum(axis=0)
    assert np.abs(result.total - expected).max() <= 10 * 2.0 ** -(CODEC.frac_bits + 1) + 1e-14
