# Shared fixtures of the Python module's tests: the seed (fixed by default, printed, overridable with
# VLSPARSE_TEST_SEED), random inputs in each element type, the tolerances (one table), and the
# comparisons each output owns (NMSE for attention outputs, relative error for scores, exact sets
# that tolerate only genuine ties).
import os
import pathlib

import numpy as np
import pytest

import vlsparse

SOURCE_DIR = pathlib.Path(os.environ.get("VLSPARSE_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
GOLDEN_DIR = SOURCE_DIR / "golden"

# SIMD (fp32 accumulation) against the reference (double), whatever the input element type: every
# path widens fp16 / bf16 inputs exactly. The golden files' fp32 bars (docs/golden-format.md).
TOL = {"scores_rel": 1e-5, "attention_nmse": 1e-10}
DTYPES = ["fp32", "fp16", "bf16"]


def seed():
    return int(os.environ.get("VLSPARSE_TEST_SEED", "20261125"))


def pytest_report_header(config):
    return f"vlsparse {vlsparse.__version__} from {vlsparse.__file__}; seed {seed()} (VLSPARSE_TEST_SEED overrides)"


@pytest.fixture
def rng(request):
    # One generator per test, derived from the seed and the test's name: tests do not depend on order.
    return np.random.default_rng([seed(), sum(map(ord, request.node.nodeid))])


def to_dtype(x, dtype):
    """float32 values -> the array a caller passes: float32, float16, or bf16 bits as uint16 (rounded
    to nearest even)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp32":
        return x
    if dtype == "fp16":
        return x.astype(np.float16)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f32(u):
    return (np.asarray(u, dtype=np.uint32) << 16).view(np.float32)


def qkv(rng, n, H, Hkv, d, dtype="fp32", scale=1.0):
    q = to_dtype(rng.standard_normal((n, H, d)) * scale, dtype)
    k = to_dtype(rng.standard_normal((n, Hkv, d)) * scale, dtype)
    v = to_dtype(rng.standard_normal((n, Hkv, d)), dtype)
    return q, k, v


def nmse(got, exp):
    got, exp = np.asarray(got, dtype=np.float64), np.asarray(exp, dtype=np.float64)
    den = (exp**2).sum()
    return ((got - exp) ** 2).sum() / den if den else float(((got - exp) ** 2).sum())


def rel(got, exp):
    got, exp = np.asarray(got, dtype=np.float64), np.asarray(exp, dtype=np.float64)
    m = np.abs(exp).max() if exp.size else 0.0
    return np.abs(got - exp).max() / m if m else float(np.abs(got - exp).max(initial=0.0))


def assert_attention(got, exp, what=""):
    assert got.shape == exp.shape, what
    assert np.abs(exp).max() > 0, f"{what}: the reference output is all zeros"
    e = nmse(got, exp)
    assert e <= TOL["attention_nmse"], f"{what}: NMSE {e:.3g} > {TOL['attention_nmse']}"


def assert_scores(got, exp, what=""):
    assert np.shape(got) == np.shape(exp), what
    e = rel(got, exp)
    assert e <= TOL["scores_rel"], f"{what}: max relative error {e:.3g} > {TOL['scores_rel']}"


def assert_same_sets(got_lists, exp_lists, scores, what=""):
    """Kept lists equal, or differing only at positions whose (reference) score ties the cutoff within
    the score tolerance."""
    assert len(got_lists) == len(exp_lists), what
    for g, (a, b) in enumerate(zip(got_lists, exp_lists)):
        a, b = set(np.asarray(a).tolist()), set(np.asarray(b).tolist())
        if a == b:
            continue
        s = np.asarray(scores[g] if len(scores) > g else scores[0], dtype=np.float64)
        kept = sorted(b)
        cutoff = s[kept].min() if kept else 0.0
        tol = TOL["scores_rel"] * np.abs(s).max()
        for j in a ^ b:
            assert abs(s[j] - cutoff) <= tol, f"{what}: group {g} position {j} (score {s[j]}) differs, cutoff {cutoff}"
