# The SIMD path against the exact reference on fresh random inputs, function by function, for fp32,
# fp16 and bf16 (uint16 bits) inputs, GQA ratios 1, 2 and 4, and non-contiguous strides.
import numpy as np
import pytest

import vlsparse
from conftest import (DTYPES, assert_attention, assert_same_sets, assert_scores, bf16_to_f32, qkv, to_dtype)

ref, simd = vlsparse.reference, vlsparse.simd
LAYOUT = "text:8,image:48[6x8],text:4,image:32,text:8"  # n = 100
N = vlsparse.layout_n(LAYOUT)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (8, 2)])
def test_dense_sparse_decode(rng, dtype, H, Hkv):
    q, k, v = qkv(rng, N, H, Hkv, 32, dtype)
    assert_attention(simd.dense_attention(q, k, v), ref.dense_attention(q, k, v), "dense")
    kept = [np.sort(rng.choice(N, 40, replace=False)) for _ in range(Hkv)]
    sel = vlsparse.TokenSelection(N, kept)
    for unselected in ["zero", "attend_selected"]:
        assert_attention(simd.sparse_attention(q, k, v, sel, unselected=unselected),
                         ref.sparse_attention(q, k, v, sel, unselected=unselected), f"sparse {unselected}")
    assert_attention(simd.decode_attention(q[-1], k, v), ref.decode_attention(q[-1], k, v), "decode")


def test_dtypes_are_read_as_stated(rng):
    # fp16 and bf16 inputs mean their values: the same values given as float32 give the same output.
    for dtype, widen in [("fp16", lambda a: a.astype(np.float32)), ("bf16", bf16_to_f32)]:
        q, k, v = qkv(rng, 20, 2, 1, 16, dtype)
        a = ref.dense_attention(q, k, v)
        b = ref.dense_attention(widen(q), widen(k), widen(v))
        np.testing.assert_array_equal(a, b)


def test_strided_views_in_place(rng):
    # A fused QKV buffer [n, (H + 2 Hkv) d] sliced into q, k, v; a head-major k; a strided token axis.
    n, H, Hkv, d = 64, 4, 2, 16
    fused = rng.standard_normal((n, (H + 2 * Hkv) * d)).astype(np.float32)
    q = fused[:, : H * d].reshape(n, H, d)
    k = fused[:, H * d: (H + Hkv) * d].reshape(n, Hkv, d)
    v = fused[:, (H + Hkv) * d:].reshape(n, Hkv, d)
    assert not q.flags.c_contiguous and np.shares_memory(q, fused)
    qc, kc, vc = map(np.ascontiguousarray, (q, k, v))
    np.testing.assert_array_equal(ref.dense_attention(q, k, v), ref.dense_attention(qc, kc, vc))
    assert_attention(simd.dense_attention(q, k, v), ref.dense_attention(qc, kc, vc), "fused qkv")
    k_head_major = np.ascontiguousarray(kc.transpose(1, 0, 2)).transpose(1, 0, 2)  # [n, Hkv, d] view of [Hkv, n, d]
    np.testing.assert_array_equal(ref.dense_attention(qc, k_head_major, vc), ref.dense_attention(qc, kc, vc))
    # A misaligned buffer (float32 data at an odd byte offset) and negative strides are copied (the
    # library's views take aligned data and strides >= 0).
    raw = np.zeros(qc.nbytes + 1, np.uint8)
    qm = raw[1:].view(np.float32).reshape(qc.shape)
    qm[...] = qc
    assert qm.ctypes.data % 4 == 1
    np.testing.assert_array_equal(ref.dense_attention(qm, kc, vc), ref.dense_attention(qc, kc, vc))
    np.testing.assert_array_equal(ref.dense_attention(qc[::-1], kc[::-1], vc[::-1]),
                                  ref.dense_attention(*map(np.ascontiguousarray, (qc[::-1], kc[::-1], vc[::-1]))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", [
    {"tau": 0.9, "probe_recent": 12, "probe_random": 12},
    {"tau": 0.95, "grouping": "kv_head", "nnz": "probe_rows", "unselected": "attend_selected", "keep_text": True},
    {"probe_mode": "ratios", "probe_recent_ratio": 0.1, "probe_random_ratio": 0.1, "keep_last": 4},
])
def test_zipvl(rng, dtype, params):
    q, k, v = qkv(rng, N, 8, 2, 32, dtype, scale=1.5)
    a = ref.zipvl_select(q, k, LAYOUT, 3, params)
    b = simd.zipvl_select(q, k, LAYOUT, 3, params)
    np.testing.assert_array_equal(b.probes, a.probes)
    assert_scores(b.accumulated, a.accumulated, "accumulated")
    assert_scores(b.normalized, a.normalized, "normalized")
    assert a.p.shape == b.p.shape and np.all(a.p >= 1)
    assert_same_sets(b.selection.indices, a.selection.indices, a.normalized, "kept")
    assert 0.0 < a.kept_ratio < 1.0
    # Both backends' prefill on one selection (the reference's), then the eviction.
    assert_attention(simd.zipvl_prefill(q, k, v, a, params), ref.zipvl_prefill(q, k, v, a, params), "prefill")
    cache = ref.zipvl_evict(k, v, a)
    assert len(cache) == 2
    for g, head in enumerate(cache):
        np.testing.assert_array_equal(head["positions"], a.selection.indices[0 if a.selection.shared else g])
        np.testing.assert_array_equal(head["k"], k[head["positions"], g])
        assert head["v"].dtype == v.dtype


def test_zipvl_probes_and_dense_layer(rng):
    q, k, _ = qkv(rng, 30, 2, 1, 16)
    s = ref.zipvl_select(q, k, None, 0, {"probe_recent": 3, "probe_random": 2}, probes=[2, 5, 29])
    np.testing.assert_array_equal(s.probes, [2, 5, 29])
    d = simd.zipvl_select(q, k, None, 0, {"dense_layers": 1})
    assert d.dense and d.p.tolist() == [30] and d.accumulated.shape == (0, 30) and d.kept_mask().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", [
    {"rate": 0.5, "compute_rate": 0.7, "refresh_every": 3},
    {"rate": 0.4, "compute_rate": 0.6, "refresh_every": 2, "text_rate": 0.5, "text_min_budget": 4,
     "spans": "single_span", "async_refresh": True},
])
def test_avl(rng, dtype, params):
    S = 5
    q, k, v = qkv(rng, N, 8, 2, 32, dtype, scale=1.5)
    dq, dk, dv = qkv(rng, S, 8, 2, 32, dtype, scale=1.5)
    assert_scores(simd.avl_scores(q, k), ref.avl_scores(q, k), "avl_scores")
    for groups in ["per_kv_head", "per_query_head"]:
        assert_scores(simd.avl_h2o_scores(q, k, groups), ref.avl_h2o_scores(q, k, groups), "h2o " + groups)
    a = ref.avl_prefill_select(q, k, LAYOUT, params)
    b = simd.avl_prefill_select(q, k, LAYOUT, params)
    assert_scores(b.scores, a.scores, "selection scores")
    assert_same_sets(b.kept.indices, a.kept.indices, [a.scores], "kept")
    assert 0 < len(a.core) < N
    ra = ref.avl_decode(a, k, v, dq, dk, dv, params)
    rb = simd.avl_decode(a, k, v, dq, dk, dv, params)
    assert_attention(rb["out"], ra["out"], "decode")
    np.testing.assert_array_equal(rb["refresh"], ra["refresh"])
    assert ra["refresh"][0] == 1 and ra["read_mask"].shape == (S, a.kept.mask().shape[0], N + S)
    if not np.array_equal(rb["core_mask"], ra["core_mask"]):  # only a tie at a refresh's cutoff may move it
        pytest.fail("core sets differ between the backends")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grouping", ["kv_head", "layer"])
def test_purekv(rng, dtype, grouping):
    layout = "text:6,video:4x16[4x4],text:10"
    n = vlsparse.layout_n(layout)
    params = {"window": 8, "budget_fraction": 0.3, "grouping": grouping, "q_block": 16, "k_block": 16}
    q, k, v = qkv(rng, n, 4, 2, 16, dtype, scale=1.5)
    sa = ref.purekv_window_scores(q, k, 3, params)
    sb = simd.purekv_window_scores(q, k, 3, params)
    assert_scores(sb.s, sa.s, "window scores")
    a = ref.purekv_select(sa, v, 3, params)
    b = simd.purekv_select(sa, v, 3, params)
    assert_scores(b.importance, a.importance, "importance")
    assert_scores(b.v_norm, a.v_norm, "v_norm")
    assert_same_sets(b.selection.indices, a.selection.indices, a.importance, "kept")
    assert_attention(simd.purekv_st_attention(q, k, v, layout, params), ref.purekv_st_attention(q, k, v, layout, params), "ST")
    va, vb = ref.purekv_validate(sa, q, k, v, 4, params), simd.purekv_validate(sa, q, k, v, 4, params)
    assert len(va) == (2 if grouping == "kv_head" else 1) and all(-1 <= g["rho"] <= 1 for g in va)
    assert_scores([g["rho"] for g in vb], [g["rho"] for g in va], "validation rho")


def test_spearman():
    r = vlsparse.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7])
    assert r["n"] == 5 and abs(r["rho"] - 0.8207826816681233) < 1e-12  # scipy.stats.spearmanr
    assert vlsparse.spearman([1, 2, 3], [3, 2, 1])["rho"] == -1.0
    with pytest.raises(vlsparse.Error, match="n >= 3"):
        vlsparse.spearman([1, 2], [2, 1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_blindsight(rng, dtype):
    layout = "text:6,text:1,image:30,text:1,text:4,text:1,image:22,text:1,text:3"
    n = vlsparse.layout_n(layout)
    q, k, v = qkv(rng, n, 4, 2, 16, dtype, scale=1.5)
    heads = ["Dense", "Sink", "Document", "Document-Sink"]
    for params in [None, {"sink_fraction": 0.2, "bidirectional_images": True}]:
        assert_attention(simd.masked_attention(q, k, v, layout, heads, params),
                         ref.masked_attention(q, k, v, layout, heads, params), "masked")
    # one template for every head; Dense is causal dense attention
    np.testing.assert_array_equal(ref.masked_attention(q, k, v, layout, ["Dense"]), ref.dense_attention(q, k, v))
    a = ref.blindsight_characterize(q, k, v, layout)
    b = simd.blindsight_characterize(q, k, v, layout)
    assert len(a) == 4 and a[0]["nmse"]["Dense"] == 0.0
    for ha, hb in zip(a, b):
        assert_scores([hb["nmse"][t] for t in heads], [ha["nmse"][t] for t in heads], "nmse")
        assert ha["chosen"] in heads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("groups", ["kv_head", "layer"])
def test_baselines(rng, dtype, groups):
    q, k, _ = qkv(rng, N, 8, 2, 32, dtype, scale=1.5)
    h_a, h_b = ref.h2o_scores(q, k, groups), simd.h2o_scores(q, k, groups)
    assert_scores(h_b, h_a, "h2o")
    assert h_a.shape == ((2 if groups == "kv_head" else 1), N)
    assert_scores(simd.snapkv_window_scores(q, k, 16, groups), ref.snapkv_window_scores(q, k, 16, groups), "snapkv")
    assert_scores(simd.fastv_scores(q, k), ref.fastv_scores(q, k), "fastv")
    for policy, params in [("h2o", {"groups": groups, "heavy": {"fraction": 0.2}, "recent": {"fraction": 0.1}}),
                           ("snapkv", {"groups": groups, "window": 16, "capacity": {"tokens": 48}}),
                           ("fastv", {"rate": 0.5})]:
        a = ref.baseline_select(policy, q, k, LAYOUT, params)
        b = simd.baseline_select(policy, q, k, LAYOUT, params)
        assert 0.0 < a.kept_ratio < 1.0, policy
        assert a.scores.shape[1] == N, policy
        assert_same_sets(b.indices, a.indices, a.scores, policy)


def test_default_params_round_trip(rng):
    q, k, _ = qkv(rng, 40, 2, 1, 16)
    for algorithm in ["zipvl", "avl", "purekv", "blindsight", "h2o", "snapkv", "fastv", "streamingllm", "random",
                      "fixed_ratio"]:
        p = vlsparse.default_params(algorithm)
        assert isinstance(p, dict) and p
    # The defaults, passed back explicitly, give what no params give.
    p = vlsparse.default_params("zipvl")
    p.update(probe_recent=8, probe_random=8)
    a = ref.zipvl_select(q, k, None, 1, p)
    b = ref.zipvl_select(q, k, None, 1, {"probe_recent": 8, "probe_random": 8})
    np.testing.assert_array_equal(a.kept_mask(), b.kept_mask())


def test_inputs_are_not_copied(rng):
    # numpy reports its buffers to tracemalloc: a copy of q (4 MiB) would show in the peak. A strided
    # slice of a fused QKV buffer and a head-major view are read in place; a reversed view is copied.
    import tracemalloc
    n, H, Hkv, d = 2048, 8, 2, 64
    fused = rng.standard_normal((n, (H + 2 * Hkv) * d), dtype=np.float32)
    q = fused[:, : H * d].reshape(n, H, d)
    k = np.ascontiguousarray(fused[:, H * d: (H + Hkv) * d].reshape(n, Hkv, d).transpose(1, 0, 2)).transpose(1, 0, 2)
    for backend in (ref, simd):
        for x, copied in [(q, False), (q[::-1], True)]:
            tracemalloc.start()
            backend.avl_scores(x, k)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert (peak >= q.nbytes) == copied, (backend.__name__, copied, peak)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_decode(rng, dtype):
    # Three sequences in a contiguous [B, capacity, H_kv, d] cache, the same in a shuffled page pool
    # (NHD, and HND through a transposed view), and with row lists: each against one-sequence decode.
    H, Hkv, d, P, cap = 8, 2, 32, 4, 24
    lens = np.array([5, 24, 13], np.int32)
    k = to_dtype(rng.standard_normal((3, cap, Hkv, d)), dtype)
    v = to_dtype(rng.standard_normal((3, cap, Hkv, d)), dtype)
    q = to_dtype(rng.standard_normal((3, H, d)), dtype)
    want = np.stack([ref.decode_attention(q[b], k[b, :n], v[b, :n]) for b, n in enumerate(lens)])
    for B in (ref, simd):
        assert_attention(B.batched_decode_attention(q, k, v, lens), want, "contiguous")
    pages = rng.permutation(3 * cap // P).astype(np.int32).reshape(3, cap // P)  # sequence b, page i -> pool page
    pool_k, pool_v = np.empty((3 * cap // P, P, Hkv, d), k.dtype), np.empty((3 * cap // P, P, Hkv, d), v.dtype)
    for b in range(3):
        for i in range(cap // P):
            pool_k[pages[b, i]], pool_v[pages[b, i]] = k[b, i * P:(i + 1) * P], v[b, i * P:(i + 1) * P]
    hnd_k = np.ascontiguousarray(pool_k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    hnd_v = np.ascontiguousarray(pool_v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    for B in (ref, simd):
        assert_attention(B.batched_decode_attention(q, pool_k, pool_v, lens, block_table=pages), want, "paged NHD")
        assert_attention(B.batched_decode_attention(q, hnd_k, hnd_v, lens, block_table=pages), want, "paged HND")
    # One list per KV head and sequence: the rows it reads.
    lists = [[np.sort(rng.choice(n, max(1, n // 2), replace=False)) for _ in range(Hkv)] for n in lens]
    for b in range(3):  # the newest row must be visible to the new token: keep it
        for g in range(Hkv):
            lists[b][g] = np.union1d(lists[b][g], [lens[b] - 1])
    flat = [lst for per_seq in lists for lst in per_seq]
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in flat])]).astype(np.int32)
    indices = np.concatenate(flat).astype(np.int32)
    want_l = np.empty_like(want)
    for b in range(3):
        for g in range(Hkv):
            rows = lists[b][g]
            heads = slice(g * H // Hkv, (g + 1) * H // Hkv)
            want_l[b, heads] = ref.decode_attention(q[b, heads], k[b, rows, g][:, None], v[b, rows, g][:, None])
    for B in (ref, simd):
        got = B.batched_decode_attention(q, k, v, lens, list_indptr=indptr, list_indices=indices, lists_per_seq=Hkv)
        assert_attention(got, want_l, "row lists")


def test_batched_decode_reads_the_pool_in_place(rng):
    import tracemalloc
    n_pages, P, Hkv, d = 256, 16, 4, 64  # an 4 MiB fp32 pool per K and V
    pool = rng.standard_normal((n_pages, P, Hkv, d), dtype=np.float32)
    table = np.arange(8, dtype=np.int32).reshape(1, 8)
    q = rng.standard_normal((1, 8, d), dtype=np.float32)
    for B in (ref, simd):
        tracemalloc.start()
        B.batched_decode_attention(q, pool, pool, np.array([100], np.int32), block_table=table)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < pool.nbytes // 8, peak
    with pytest.raises(vlsparse.Error, match="block"):
        ref.batched_decode_attention(q, pool, pool, np.array([100], np.int32), block_table=table + 300)
    with pytest.raises(vlsparse.Error, match="expected 4"):
        ref.batched_decode_attention(q, pool[0], pool[0], np.array([10], np.int32))
