# A decode loop from Python: vlsparse.KvCache kept across steps, decode over it on both backends
# against the stateless functions (which copy the given rows into a fresh cache), eviction, indexed
# decode with its probabilities against numpy, the decode-time eviction of H2O and StreamingLLM against
# their keep rules, and PureKV's estimator against the stateless PureKV functions.
import threading

import numpy as np
import pytest

import vlsparse
from conftest import DTYPES, assert_attention, assert_scores, bf16_to_f32, qkv, to_dtype

ref, simd = vlsparse.reference, vlsparse.simd


def widen(x):
    x = np.asarray(x)
    return bf16_to_f32(x).astype(np.float64) if x.dtype == np.uint16 else x.astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (8, 2)])
def test_cache_decode_loop(rng, dtype, H, Hkv):
    n, d, S = 40, 32, 5
    q, k, v = qkv(rng, n, H, Hkv, d, dtype)
    dq, dk, dv = qkv(rng, S, H, Hkv, d, dtype)
    cache = vlsparse.KvCache(Hkv, d, k.dtype)
    assert cache.dtype == k.dtype and cache.seq_len == 0 and cache.kv_heads == Hkv and cache.head_dim == d
    cache.assign(k, v)
    for t in range(S):
        cache.append(dk[t], dv[t])
        assert cache.seq_len == n + t + 1 and [cache.rows(g) for g in range(Hkv)] == [n + t + 1] * Hkv
        kk, vv = np.concatenate([k, dk[: t + 1]]), np.concatenate([v, dv[: t + 1]])
        want = ref.decode_attention(dq[t], kk, vv)
        # The same rows in the same order: each backend gives what its stateless call gives, bit for bit.
        np.testing.assert_array_equal(ref.decode_attention(dq[t], cache), want)
        np.testing.assert_array_equal(simd.decode_attention(dq[t], cache), simd.decode_attention(dq[t], kk, vv))
        assert_attention(simd.decode_attention(dq[t], cache), want, f"step {t}")
    for g in range(Hkv):
        np.testing.assert_array_equal(cache.positions(g), np.arange(n + S))
        np.testing.assert_array_equal(cache.k(g), np.concatenate([k, dk])[:, g])
        np.testing.assert_array_equal(cache.v(g), np.concatenate([v, dv])[:, g])
    assert cache.kv_bytes == 2 * Hkv * (n + S) * d * k.itemsize


@pytest.mark.parametrize("dtype", DTYPES)
def test_keep_and_indexed_decode(rng, dtype):
    n, H, Hkv, d = 50, 8, 2, 16
    q, k, v = qkv(rng, n, H, Hkv, d, dtype, scale=1.5)
    cache = vlsparse.KvCache(Hkv, d, k.dtype)
    cache.assign(k, v)
    kept = [np.sort(rng.choice(n - 1, 20, replace=False)) for _ in range(Hkv)]
    cache.keep(vlsparse.TokenSelection(n, kept))
    dq, dk, dv = qkv(rng, 1, H, Hkv, d, dtype, scale=1.5)
    cache.append(dk[0], dv[0])
    for g in range(Hkv):  # positions are never renumbered: the new token sits at n
        np.testing.assert_array_equal(cache.positions(g), np.append(kept[g], n))
        np.testing.assert_array_equal(cache.k(g), np.concatenate([k[kept[g], g], dk[0, g:g + 1]]))
    # Decode over the evicted cache = decode over each KV head's own rows.
    r = H // Hkv
    want = np.concatenate([ref.decode_attention(dq[0, g * r:(g + 1) * r], np.concatenate([k[kept[g], g], dk[0, g:g + 1]])[:, None],
                                                np.concatenate([v[kept[g], g], dv[0, g:g + 1]])[:, None]) for g in range(Hkv)])
    np.testing.assert_array_equal(ref.decode_attention(dq[0], cache), want)
    assert_attention(simd.decode_attention(dq[0], cache), want, "after keep")
    # Indexed decode over some of the held positions, by rows; probabilities against numpy.
    read = [np.append(kept[g][::2], n) for g in range(Hkv)]
    rows = cache.rows_for_positions(vlsparse.TokenSelection(n + 1, read))
    for g in range(Hkv):
        np.testing.assert_array_equal(cache.positions(g)[rows[g]], read[g])
    L = max(len(x) for x in rows)
    scale = float(np.float32(1 / np.sqrt(d)))
    for B, tol in [(ref, 1e-12), (simd, 1e-5)]:
        out, probs = B.indexed_decode_attention(dq[0], cache, rows, probs=True)
        np.testing.assert_array_equal(out, B.indexed_decode_attention(dq[0], cache, rows))
        assert probs.shape == (H, L) and probs.dtype == np.float64
        for h in range(H):
            g = h // r
            s = widen(cache.k(g))[rows[g]] @ widen(dq[0, h]) * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            assert np.abs(probs[h, : len(p)] - p).max() <= tol, (B.__name__, h)
            assert (probs[h, len(p):] == 0).all()
            o = p @ widen(cache.v(g))[rows[g]]
            assert np.abs(out[h] - o).max() <= 1e-5 * np.abs(o).max()
    # Every row listed = decode_attention.
    every = [np.arange(cache.rows(g)) for g in range(Hkv)]
    for B in (ref, simd):
        np.testing.assert_array_equal(B.indexed_decode_attention(dq[0], cache, every), B.decode_attention(dq[0], cache))


def test_assign_positions_and_shared_keep(rng):
    n, Hkv, d = 30, 2, 8
    _, k, v = qkv(rng, n, 2, Hkv, d)
    sub = np.array([0, 3, 4, 10, 29])
    cache = vlsparse.KvCache(Hkv, d)  # float32 by default
    cache.assign(k[sub], v[sub], positions=sub, seq_len=n)
    assert cache.seq_len == n and cache.rows(1) == 5
    cache.append(k[0], v[0])
    np.testing.assert_array_equal(cache.positions(0), np.append(sub, n))
    cache.keep([3, 29, 30])  # one list for every KV head
    for g in range(Hkv):
        np.testing.assert_array_equal(cache.positions(g), [3, 29, 30])
        np.testing.assert_array_equal(cache.k(g), np.stack([k[3, g], k[29, g], k[0, g]]))
    np.testing.assert_array_equal(cache.rows_for_positions([29, 30])[1], [1, 2])
    assert "seq_len=31" in repr(cache) and "rows=[3, 3]" in repr(cache)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zipvl_decode_over_the_evicted_cache(rng, dtype):
    # ZipVL's decode phase as an engine runs it: the cache keeps the selection (zipvl_evict), then steps.
    layout = "text:8,image:48[6x8],text:8"
    q, k, v = qkv(rng, 64, 4, 2, 16, dtype, scale=1.5)
    sel = ref.zipvl_select(q, k, layout, 2, {"tau": 0.9, "grouping": "kv_head", "probe_recent": 8, "probe_random": 8})
    cache = vlsparse.KvCache(2, 16, k.dtype)
    cache.assign(k, v)
    cache.keep(sel.selection)
    for g, head in enumerate(ref.zipvl_evict(k, v, sel)):
        np.testing.assert_array_equal(cache.positions(g), head["positions"])
        np.testing.assert_array_equal(cache.v(g), head["v"])


def test_concurrent_decode_and_append(rng):
    # Decode releases the GIL and holds the cache's shared lock; append takes it exclusively: threads
    # decoding while another appends see a whole cache (no crash, each result one of the valid ones).
    n, H, Hkv, d = 256, 8, 2, 64
    q, k, v = qkv(rng, n, H, Hkv, d)
    cache = vlsparse.KvCache(Hkv, d)
    cache.assign(k, v)
    # What a decode may see: the cache with 0 .. 20 rows appended (the SIMD engine is deterministic).
    seen = [simd.decode_attention(q[-1], np.concatenate([k, k[:i]]), np.concatenate([v, v[:i]])) for i in range(21)]
    errors, results = [], []

    def reader():
        try:
            for _ in range(20):
                results.append(simd.decode_attention(q[-1], cache))
        except Exception as e:  # reported by the assertion below
            errors.append(e)

    def writer():
        for t in range(20):
            cache.append(k[t], v[t])

    threads = [threading.Thread(target=reader) for _ in range(3)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 60 and cache.seq_len == n + 20
    assert all(any(np.array_equal(r, e) for e in seen) for r in results)


@pytest.mark.parametrize("groups", ["kv_head", "layer"])
def test_h2o_policy_decode(rng, groups):
    # H2OPolicy's decode-time eviction against h2o_keep over the attention accumulated in numpy.
    n, H, Hkv, d, S = 60, 8, 2, 16, 6
    layout = f"text:10,image:40,text:{n - 50}"
    q, k, v = qkv(rng, n, H, Hkv, d, scale=1.5)
    dq, dk, dv = qkv(rng, S, H, Hkv, d, scale=1.5)
    P = {"heavy": {"tokens": 10}, "recent": {"tokens": 5}, "groups": groups}
    pol = vlsparse.H2OPolicy(P)
    assert pol.name == "h2o" and pol.params["heavy"] == {"tokens": 10}
    pol.begin(layout, {"layers": 1, "heads": H, "kv_heads": Hkv, "head_dim": d})
    kv = pol.prefill(0, q, k, v)
    exp = simd.baseline_select("h2o", q, k, layout, P)
    assert [list(x) for x in kv.indices] == [list(x) for x in exp.indices]
    acc = simd.h2o_scores(q, k, groups)
    assert_scores(pol.accumulated(0), acc, "prefill scores")
    acc = np.pad(acc, ((0, 0), (0, S)))
    cache = vlsparse.KvCache(Hkv, d)
    cache.assign(k, v)
    cache.keep(kv)
    r = H // Hkv
    for t in range(S):
        cache.append(dk[t], dv[t])
        cached = vlsparse.TokenSelection(n + t + 1, [cache.positions(g) for g in range(Hkv)])
        read = pol.decode_read(0, t, cached)
        assert [list(x) for x in read.indices] == [list(x) for x in cached.indices]  # H2O reads everything held
        rows = cache.rows_for_positions(read)
        _, probs = simd.indexed_decode_attention(dq[t], cache, rows, probs=True)
        attn = [probs[g * r:(g + 1) * r, : len(rows[g])].mean(axis=0) for g in range(Hkv)]
        for g in range(Hkv):
            acc[0 if groups == "layer" else g, read.indices[g]] += probs[g * r:(g + 1) * r, : len(rows[g])].sum(axis=0)
        keep = pol.decode_observe(0, t, read, attn)
        assert keep is not None, t  # 15 = heavy + recent held, 16 with the new token: it evicts at every step
        for g in range(Hkv):
            want = vlsparse.h2o_keep(cache.positions(g), 10, 5, acc[0 if groups == "layer" else g])
            np.testing.assert_array_equal(keep.indices[0 if keep.shared else g], want)
        cache.keep(keep)
        assert all(cache.rows(g) == 15 for g in range(Hkv))
    assert_scores(pol.accumulated(0), acc, "accumulated")


def test_streamingllm_policy_decode(rng):
    n, S = 30, 8
    pol = vlsparse.StreamingLLMPolicy({"sinks": 2, "recent": {"tokens": 6}})
    pol.begin(f"text:{n}", {"layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 4})
    q, k, v = qkv(rng, n, 2, 1, 4)
    for layer in range(2):
        kv = pol.prefill(layer, q, k, v)
        np.testing.assert_array_equal(kv.indices[0], vlsparse.baseline_select_static("streamingllm", f"text:{n}", pol.params).indices[0])
    cached = list(kv.indices[0])
    for t in range(S):
        cached.append(n + t)
        read = pol.decode_read(1, t, vlsparse.TokenSelection(n + t + 1, [cached]))
        np.testing.assert_array_equal(read.indices[0], vlsparse.streamingllm_keep(cached, 2, 6))
        assert read.indices[0][:2].tolist() == [0, 1] and read.indices[0][-1] == n + t
        keep = pol.decode_observe(1, t, read)  # StreamingLLM reads no attention
        assert keep is not None and list(keep.indices[0]) == list(read.indices[0])
        cached = list(keep.indices[0])
    off = vlsparse.StreamingLLMPolicy({"sinks": 2, "recent": {"tokens": 6}, "evict_during_decode": False})
    off.begin(f"text:{n}", {"layers": 1, "heads": 2, "kv_heads": 1, "head_dim": 4})
    off.prefill(0, q, k, v)
    everything = vlsparse.TokenSelection(n + 1, [list(range(n + 1))])
    assert len(off.decode_read(0, 0, everything).indices[0]) == n + 1
    assert off.decode_observe(0, 0, everything) is None


def test_keep_rules():
    np.testing.assert_array_equal(vlsparse.h2o_keep([1, 4, 5, 8, 9], 2, 1, np.array([0, 3, 0, 0, 1, 7, 0, 0, 2, 0.5])),
                                  [1, 5, 9])  # heavy: 5 (7.0) and 1 (3.0) of 1, 4, 5, 8; recent: 9
    np.testing.assert_array_equal(vlsparse.h2o_keep([0, 1, 2, 3], 1, 1, np.ones(4)), [0, 3])  # ties: lower position
    np.testing.assert_array_equal(vlsparse.h2o_keep([1, 4], 2, 1, np.zeros(5)), [1, 4])  # within budget: all
    np.testing.assert_array_equal(vlsparse.streamingllm_keep(range(10), 2, 3), [0, 1, 7, 8, 9])
    np.testing.assert_array_equal(vlsparse.streamingllm_keep([3, 5], 2, 3), [3, 5])


@pytest.mark.parametrize("dtype", DTYPES)
def test_purekv_estimator(rng, dtype):
    # The estimator layer by layer against the stateless functions of each backend, and prefill_layer
    # (the engine's one call per layer) against the steps.
    layout = "text:6,video:4x16[4x4],text:10"
    n, L, H, Hkv, d = vlsparse.layout_n(layout), 4, 4, 2, 16
    P = {"window": 8, "budget_fraction": 0.3, "l0": 1, "st_start_layer": 2, "q_block": 16, "k_block": 16}
    shape = {"layers": L, "heads": H, "kv_heads": Hkv, "head_dim": d}
    layers = [qkv(rng, n, H, Hkv, d, dtype, scale=1.5) for _ in range(L)]
    for B in (ref, simd):
        est = B.PureKVEstimator(P, layout, shape)
        steps = B.PureKVEstimator(P, layout, shape)
        assert est.n == n and est.shape == shape and est.layout == layout and est.params["l0"] == 1
        s0 = B.purekv_window_scores(layers[1][0], layers[1][1], 1, P)
        for layer, (q, k, v) in enumerate(layers):
            assert est.needs_scores(layer) == (layer <= 1) and est.masked(layer) == (layer >= 2)
            cache = vlsparse.KvCache(Hkv, d, k.dtype)
            out, sel = est.prefill_layer(layer, q, k, v, cache)
            if steps.needs_scores(layer):
                np.testing.assert_array_equal(steps.observe(layer, q, k).s, B.purekv_window_scores(q, k, layer, P).s)
            assert steps.observed(1) == (layer >= 1)
            exp = B.purekv_select(B.purekv_window_scores(q, k, layer, P) if layer <= 1 else s0, v, layer, P)
            got = steps.select(layer, v)
            np.testing.assert_array_equal(got.importance, exp.importance)
            assert [list(x) for x in got.selection.indices] == [list(x) for x in exp.selection.indices]
            assert [list(x) for x in sel.selection.indices] == [list(x) for x in exp.selection.indices]
            dense = B.purekv_st_attention(q, k, v, layout, P) if layer >= 2 else B.dense_attention(q, k, v)
            np.testing.assert_array_equal(steps.attention(layer, q, k, v), dense)
            np.testing.assert_array_equal(out, dense)
            for g in range(Hkv):  # the cache holds the kept set
                np.testing.assert_array_equal(cache.positions(g), exp.selection.indices[g])
            if layer > 1:
                val = steps.validate(layer, q, k, v)
                assert [x["rho"] for x in val] == [x["rho"] for x in B.purekv_validate(s0, q, k, v, layer, P)]
        np.testing.assert_array_equal(est.scores(3).s, s0.s)  # above l0: l0's scores


def test_purekv_masks():
    layout = "text:3,video:3x8[2x4],text:2"
    r = vlsparse.purekv_masks(layout, {"st_window": 4, "st_dilation": 2})
    n = vlsparse.layout_n(layout)
    assert r["kinds"] == ["spatial", "temporal", "spatial_temporal", "local_window", "atrous"]
    assert r["masks"].shape == (5, n, n) and r["masks"].dtype == np.uint8
    np.testing.assert_array_equal(r["masks"].sum(axis=(1, 2)), r["allowed_pairs"])
    causal = np.tril(np.ones((n, n), np.uint8))
    assert (r["masks"] <= causal).all()  # causal, and only video-to-same-video pairs are cut:
    assert (r["masks"][:, :3] == causal[:3]).all() and (r["masks"][:, -2:] == causal[-2:]).all()  # text rows
    assert (r["allowed_pairs"] < causal.sum()).all()
