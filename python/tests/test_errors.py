# Bad input raises vlsparse.Error (a ValueError) with the library's message: the function, the
# offending value and what was expected. Never a crash or a silent wrong answer.
import json

import numpy as np
import pytest

import vlsparse
from conftest import qkv

ref, simd = vlsparse.reference, vlsparse.simd


def test_error_class():
    assert issubclass(vlsparse.Error, ValueError)


@pytest.mark.parametrize("B", [ref, simd], ids=["reference", "simd"])
def test_bad_arrays(rng, B):
    q, k, v = qkv(rng, 12, 4, 2, 8)
    with pytest.raises(vlsparse.Error, match=r"dense_attention: q: dtype float64, expected float32, float16 or uint16"):
        B.dense_attention(q.astype(np.float64), k, v)
    with pytest.raises(vlsparse.Error, match=r"k has dtype float16, expected the dtype of q"):
        B.dense_attention(q, k.astype(np.float16), v)
    with pytest.raises(vlsparse.Error, match=r"q has 2 dimensions, expected 3"):
        B.dense_attention(q[0], k, v)
    with pytest.raises(vlsparse.Error, match=r"dense_attention: .*shape"):
        B.dense_attention(q, k[:5], v)
    with pytest.raises(vlsparse.Error, match=r"H % H_kv|query heads|divisible|multiple"):
        B.dense_attention(q[:, :3], k, v)
    bad = q.copy()
    bad[3, 1, 2] = np.nan
    with pytest.raises(vlsparse.Error, match=r"q\[3, 1, 2\] = nan"):
        B.dense_attention(bad, k, v)
    with pytest.raises(vlsparse.Error, match="big-endian"):
        B.dense_attention(q.astype(">f4"), k, v)


@pytest.mark.parametrize("B", [ref, simd], ids=["reference", "simd"])
def test_bad_params_and_layouts(rng, B):
    q, k, v = qkv(rng, 12, 4, 2, 8)
    with pytest.raises(vlsparse.Error, match=r"tau = 1.5, expected 0 < tau <= 1"):
        B.zipvl_select(q, k, None, 0, {"tau": 1.5})
    with pytest.raises(vlsparse.Error, match="tolerance"):  # an unknown key (a typo) is caught
        B.zipvl_select(q, k, None, 0, {"tolerance": 0.9})
    with pytest.raises(vlsparse.Error, match="grouping"):
        B.zipvl_select(q, k, None, 0, {"grouping": "per_head"})
    with pytest.raises(vlsparse.Error, match="layout|tokens"):
        B.zipvl_select(q, k, "text:5,image:4", 0)  # 9 tokens, the input has 12
    with pytest.raises(vlsparse.Error, match=r"grid 2x3 does not match"):
        B.zipvl_select(q, k, "text:8,image:4[2x3]", 0)
    with pytest.raises(vlsparse.Error, match="unknown mask template 'Diagonal'"):
        B.masked_attention(q, k, v, "text:12", ["Diagonal"])
    with pytest.raises(vlsparse.Error, match="unselected = 'none'"):
        B.sparse_attention(q, k, v, vlsparse.TokenSelection(12, [[0, 1]]), unselected="none")
    with pytest.raises(vlsparse.Error, match="selection"):  # positions out of range
        B.sparse_attention(q, k, v, vlsparse.TokenSelection(12, [[0, 40]]))
    with pytest.raises(vlsparse.Error, match="policy 'tova'"):
        B.baseline_select("tova", q, k)
    with pytest.raises(vlsparse.Error, match="rate"):
        B.avl_prefill_select(q, k, "text:4,image:8", {"rate": 1.0})
    with pytest.raises(vlsparse.Error, match="window"):
        B.purekv_window_scores(q, k, 0, {"window": 40})
    with pytest.raises(vlsparse.Error, match="alpha"):
        B.blindsight_characterize(q, k, v, "text:4,image:8", {"alpha": -1})


def test_params_values(rng):
    q, k, _ = qkv(rng, 30, 2, 1, 8)
    # numpy scalars count as their values; wrong types and non-JSON values are errors.
    a = ref.zipvl_select(q, k, None, 0, {"probe_recent": np.int64(6), "probe_random": 4, "tau": np.float32(0.5)})
    b = ref.zipvl_select(q, k, None, 0, {"probe_recent": 6, "probe_random": 4, "tau": float(np.float32(0.5))})
    np.testing.assert_array_equal(a.kept_mask(), b.kept_mask())
    with pytest.raises(vlsparse.Error, match="params.tau: expected a number"):
        ref.zipvl_select(q, k, None, 0, {"tau": "high"})
    with pytest.raises(vlsparse.Error, match="expected an object"):
        ref.zipvl_select(q, k, None, 0, [0.9])
    with pytest.raises(vlsparse.Error, match=r"params: a value of type object"):
        ref.zipvl_select(q, k, None, 0, {"tau": object()})


def test_default_params_unknown():
    with pytest.raises(vlsparse.Error, match="algorithm 'zipcache'"):
        vlsparse.default_params("zipcache")
    with pytest.raises(vlsparse.Error, match="policy 'h2o', expected streamingllm"):
        vlsparse.baseline_select_static("h2o", "text:8")
    with pytest.raises(vlsparse.Error, match="unknown kind|kind"):
        vlsparse.baseline_select_static("random", "txt:8")


def test_golden_verify_errors(tmp_path):
    with pytest.raises(vlsparse.Error, match="is not a folder"):
        vlsparse.golden.verify(tmp_path / "absent")
    with pytest.raises(vlsparse.Error, match="holds no case"):
        vlsparse.golden.verify(tmp_path)
    with pytest.raises(vlsparse.Error, match="does not exist"):
        vlsparse.golden.verify(tmp_path, tmp_path / "no-golden")


def test_sim_errors(tmp_path):
    with pytest.raises(vlsparse.Error, match="cannot open"):
        vlsparse.sim.run(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(vlsparse.Error, match="invalid JSON"):
        vlsparse.sim.run(bad)
    s = vlsparse.sim.default_scenario()
    s["policies"] = [{"name": "zipvl", "params": {"tau": 2}}]
    with pytest.raises(vlsparse.Error, match="tau"):
        vlsparse.sim.run(s)
    with pytest.raises(vlsparse.Error, match="command = 'sweep'"):
        vlsparse.sim.run(None, command="sweep")


@pytest.mark.parametrize("B", [ref, simd], ids=["reference", "simd"])
def test_cache_errors(rng, B):
    q, k, v = qkv(rng, 12, 4, 2, 8)
    with pytest.raises(vlsparse.Error, match="n_kv_heads = 0, expected > 0"):
        vlsparse.KvCache(0, 8)
    with pytest.raises(vlsparse.Error, match="KvCache: dtype: dtype float64, expected float32, float16 or uint16"):
        vlsparse.KvCache(2, 8, np.float64)
    with pytest.raises(vlsparse.Error, match="is not a numpy dtype"):
        vlsparse.KvCache(2, 8, "bfloat17")
    cache = vlsparse.KvCache(2, 8, np.float16)
    with pytest.raises(vlsparse.Error, match=r"KvCache.assign: k has dtype float32, expected the cache's dtype float16"):
        cache.assign(k, v)
    with pytest.raises(vlsparse.Error, match="empty; append the new token's K/V first"):
        B.decode_attention(q[-1].astype(np.float16), cache)
    cache = vlsparse.KvCache(2, 8)
    cache.assign(k, v)
    with pytest.raises(vlsparse.Error, match=r"KvCache::append: k has shape \[4, 8\], expected \[2, 8\]"):
        cache.append(q[0], q[0])
    with pytest.raises(vlsparse.Error, match="positions and seq_len go together"):
        cache.assign(k, v, positions=np.arange(12))
    with pytest.raises(vlsparse.Error, match=r"positions\[1\] = 1 is not above"):
        cache.assign(k[:2], v[:2], positions=[1, 1], seq_len=12)
    with pytest.raises(vlsparse.Error, match="position 40 is not in KV head 0"):
        cache.keep([1, 40])
    with pytest.raises(vlsparse.Error, match="selection has 3 lists, expected 1 or 2"):
        cache.keep(vlsparse.TokenSelection(12, [[0], [1], [2]]))
    assert cache.rows(0) == 12  # a failed keep leaves the cache as it was
    with pytest.raises(vlsparse.Error, match="KV head 5, expected 0 <= g < 2"):
        cache.positions(5)
    with pytest.raises(vlsparse.Error, match=r"q has dtype float16, expected the cache's dtype float32"):
        B.decode_attention(q[-1].astype(np.float16), cache)
    with pytest.raises(vlsparse.Error, match=r"q has shape \[4, 4\], expected \[H, 8\]"):
        B.decode_attention(q[-1, :, :4], cache)
    with pytest.raises(vlsparse.Error, match="holds row 12 at entry 1"):
        B.indexed_decode_attention(q[-1], cache, [[0, 12]])
    with pytest.raises(vlsparse.Error, match="row list 1 is empty"):
        B.indexed_decode_attention(q[-1], cache, [[0], []])
    with pytest.raises(vlsparse.Error, match="not in KV head 0 of the cache"):
        cache.rows_for_positions([3, 20])
    bad = q[-1].copy()
    bad[1, 2] = np.inf
    with pytest.raises(vlsparse.Error, match=r"q\[1, 2\] = inf"):
        B.decode_attention(bad, cache)


def test_policy_errors(rng):
    q, k, v = qkv(rng, 12, 4, 2, 8)
    shape = {"layers": 1, "heads": 4, "kv_heads": 2, "head_dim": 8}
    pol = vlsparse.H2OPolicy({"heavy": {"tokens": 2}, "recent": {"tokens": 2}})
    with pytest.raises(vlsparse.Error, match="no prompt: call begin"):
        pol.prefill(0, q, k, v)
    with pytest.raises(vlsparse.Error, match="shape: unknown key 'layer'"):
        pol.begin("text:12", {"layer": 1, "heads": 4, "kv_heads": 2, "head_dim": 8})
    with pytest.raises(vlsparse.Error, match="shape.head_dim: missing"):
        pol.begin("text:12", {"layers": 1, "heads": 4, "kv_heads": 2})
    with pytest.raises(vlsparse.Error, match="heads = 4 is not a multiple of kv_heads = 3"):
        pol.begin("text:12", dict(shape, kv_heads=3))
    with pytest.raises(vlsparse.Error, match="h2o_params_from_json: heavy = -1 tokens, expected a count >= 0"):
        vlsparse.H2OPolicy({"heavy": -1})
    pol.begin("text:12", shape)
    with pytest.raises(vlsparse.Error, match="layer 0 has no prefill state"):
        pol.decode_read(0, 0, vlsparse.TokenSelection(13, [range(13)]))
    with pytest.raises(vlsparse.Error, match="do not match the model shape"):
        pol.prefill(0, q[:, :2], k, v)
    kv = pol.prefill(0, q, k, v)
    read = vlsparse.TokenSelection(13, [list(kv.indices[0]) + [12], list(kv.indices[1]) + [12]])
    with pytest.raises(vlsparse.Error, match=r"read: selection list 0 holds position 12, expected a position in \[0, 12\)"):
        pol.decode_observe(0, 0, vlsparse.TokenSelection(12, read.indices), [np.ones(5) / 5] * 2)
    with pytest.raises(vlsparse.Error, match="attn has 0 vectors, expected one per read list"):
        pol.decode_observe(0, 0, read)
    with pytest.raises(vlsparse.Error, match=r"attn\[1\] has 2 entries, expected 5"):
        pol.decode_observe(0, 0, read, [np.ones(5) / 5, np.ones(2)])
    with pytest.raises(vlsparse.Error, match=r"attn\[0\]\[1\] = nan"):
        pol.decode_observe(0, 0, read, [np.array([0.2, np.nan, 0.2, 0.2, 0.2])] * 2)
    with pytest.raises(vlsparse.Error, match="H2OPolicy.accumulated: layer = 1, expected 0 <= layer < 1"):
        pol.accumulated(1)
    with pytest.raises(vlsparse.Error, match="h2o_keep: cached\\[1\\] = 1, expected ascending unique"):
        vlsparse.h2o_keep([1, 1], 1, 1, np.zeros(3))
    with pytest.raises(vlsparse.Error, match="position 7 has no score"):
        vlsparse.h2o_keep([1, 7], 1, 1, np.zeros(3))
    with pytest.raises(vlsparse.Error, match="sinks = -1"):
        vlsparse.streamingllm_keep([1, 2], -1, 1)


@pytest.mark.parametrize("B", [ref, simd], ids=["reference", "simd"])
def test_purekv_estimator_errors(rng, B):
    layout = "text:4,video:2x8,text:4"
    q, k, v = qkv(rng, 24, 4, 2, 8)
    shape = {"layers": 3, "heads": 4, "kv_heads": 2, "head_dim": 8}
    with pytest.raises(vlsparse.Error, match="l0 = 3 is beyond the model's layers"):
        B.PureKVEstimator({"window": 4, "l0": 3}, layout, shape)
    est = B.PureKVEstimator({"window": 4, "l0": 1}, layout, shape)
    with pytest.raises(vlsparse.Error, match=r"scores of layer 1 are needed for layer 2 but were not observed"):
        est.select(2, v)
    with pytest.raises(vlsparse.Error, match="layer 2 does not use its own attention scores"):
        est.observe(2, q, k)
    with pytest.raises(vlsparse.Error, match="do not match the prompt and model"):
        est.observe(1, q[:20], k[:20])
    with pytest.raises(vlsparse.Error, match="layer = 5, expected 0 <= layer < 3"):
        est.attention(5, q, k, v)
    with pytest.raises(vlsparse.Error, match="expected the cache's dtype float16"):
        est.prefill_layer(0, q, k, v, vlsparse.KvCache(2, 8, np.float16))
    with pytest.raises(vlsparse.Error, match="unknown kind|kind"):
        vlsparse.purekv_masks("vid:8")
