# Golden round trips: every case of every algorithm (ZipVL, A-VL, BlindSight, the baselines, PureKV)
# through both backends of the module, the outputs written as .npy files and checked by
# vlsparse.golden.verify (the simulator's golden verify); a wrong output fails it. Anchors besides:
# the stateless functions' outputs compared with the golden files under the manifest's metric.
import json
import os
import subprocess

import numpy as np
import pytest

import vlsparse
from conftest import GOLDEN_DIR

ZIPVL_CASES = sorted(p.name for p in (GOLDEN_DIR / "zipvl").iterdir() if (p / "manifest.json").exists())


def load(case):
    m = json.loads((case / "manifest.json").read_text())
    inputs = {t["name"]: np.load(case / t["file"]) for t in m["inputs"]}
    return m, inputs


def run_zipvl(backend, case):
    """Every output of a ZipVL case (docs/golden-format.md, "ZipVL cases"), by name."""
    m, x = load(case)
    P, layout = m["params"], m["layout"]
    q, k, v = x["q"], x["k"], x["v"]
    sel = backend.zipvl_select(q, k, layout, int(x["layer"][0]), P)
    out = {"probes": sel.probes, "accumulated": sel.accumulated, "normalized": sel.normalized, "p": sel.p,
           "kept_mask": sel.kept_mask(), "prefill_out": backend.zipvl_prefill(q, k, v, sel, P)}
    cache = backend.zipvl_evict(k, v, sel)
    for g, head in enumerate(cache):
        out[f"cache_pos_g{g}"], out[f"cache_k_g{g}"], out[f"cache_v_g{g}"] = head["positions"], head["k"], head["v"]
    decode = []
    ck = np.stack([h["k"] for h in cache], axis=1) if len({len(h["positions"]) for h in cache}) == 1 else None
    for t in range(x["decode_q"].shape[0]):
        if ck is not None:  # every KV head holds the same rows: one cache [rows, H_kv, d]
            kk = np.concatenate([ck, x["decode_k"][: t + 1]])
            vv = np.concatenate([np.stack([h["v"] for h in cache], axis=1), x["decode_v"][: t + 1]])
            decode.append(backend.decode_attention(x["decode_q"][t], kk, vv, scale=P["scale"]))
        else:  # per-KV-head caches of different lengths: one KV head (and its query heads) at a time
            H, Hkv = q.shape[1], k.shape[1]
            o = np.zeros((H, q.shape[2]), np.float32)
            for g, h in enumerate(cache):
                kk = np.concatenate([h["k"], x["decode_k"][: t + 1, g]])[:, None]
                vv = np.concatenate([h["v"], x["decode_v"][: t + 1, g]])[:, None]
                r = slice(g * H // Hkv, (g + 1) * H // Hkv)
                o[r] = backend.decode_attention(x["decode_q"][t, r], kk, vv, scale=P["scale"])
            decode.append(o)
    out["decode_out"] = np.stack(decode)
    return out


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", ZIPVL_CASES)
def test_zipvl_round_trip(tmp_path, backend, case):
    golden = GOLDEN_DIR / "zipvl" / case
    for name, a in run_zipvl(getattr(vlsparse, backend), golden).items():
        np.save(tmp_path / f"{name}.npy", a)
    r = vlsparse.golden.verify(tmp_path, golden)
    failed = [o["name"] + ": " + o["detail"] for c in r["cases"] for o in c["outputs"] if not o["pass"]]
    assert r["pass"] and not failed, failed
    assert r["cases"][0]["case"] == case and len(r["cases"][0]["outputs"]) >= 9


def test_verify_finds_a_wrong_output(tmp_path):
    golden = GOLDEN_DIR / "zipvl" / "mha_fp32_layer"
    port = tmp_path / "zipvl" / "mha_fp32_layer"  # laid out like golden/: matched by its folder names
    port.mkdir(parents=True)
    outputs = run_zipvl(vlsparse.simd, golden)
    outputs["prefill_out"] = outputs["prefill_out"] * np.float32(1.001)
    outputs["p"] = outputs["p"] + 1
    for name, a in outputs.items():
        np.save(port / f"{name}.npy", a)
    (port / "kept_mask.npy").unlink()
    r = vlsparse.golden.verify(tmp_path, GOLDEN_DIR)
    assert not r["pass"]
    outs = {o["name"]: o for o in r["cases"][0]["outputs"]}
    assert not outs["prefill_out"]["pass"] and "nmse" in outs["prefill_out"]["detail"]
    assert not outs["p"]["pass"] and outs["p"]["detail"].startswith("exact")
    assert outs["kept_mask"]["missing"] and not outs["kept_mask"]["pass"]
    assert outs["decode_out"]["pass"] and outs["probes"]["pass"]


def compare(spec, got, exp):
    tol = spec.get("tols", {}).get("fp32", spec.get("tol", 0.0))
    got, exp = np.asarray(got), np.asarray(exp)
    assert got.shape == exp.shape, spec["name"]
    if spec["dtype"] == "bf16":
        got, exp = got.astype(np.float64), exp.astype(np.float64)
    if spec["metric"] == "exact":
        assert (got == exp).all(), spec["name"]
    elif spec["metric"] == "nmse":
        assert ((got - exp) ** 2).sum() <= tol * (exp.astype(np.float64) ** 2).sum(), spec["name"]
    else:
        assert np.abs(got - exp).max() <= tol * np.abs(exp).max(), spec["name"]


@pytest.mark.parametrize("backend", ["reference", "simd"])
def test_anchors_blindsight(backend):
    B = getattr(vlsparse, backend)
    case = GOLDEN_DIR / "blindsight" / "attention_gqa_fp32"
    m, x = load(case)
    names = ["Dense", "Sink", "Document", "Document-Sink"]
    heads = [names[i] for i in x["heads"]]
    specs = {t["name"]: t for t in m["outputs"]}
    exp = {n: np.load(case / specs[n]["file"]) for n in ("masked_out", "nmse", "chosen")}
    compare(specs["masked_out"], B.masked_attention(x["q"], x["k"], x["v"], m["layout"], heads, m["params"]), exp["masked_out"])
    ch = B.blindsight_characterize(x["q"], x["k"], x["v"], m["layout"], m["params"])
    compare(specs["nmse"], [[h["nmse"][t] for t in names] for h in ch], exp["nmse"])
    compare(specs["chosen"], [names.index(h["chosen"]) for h in ch], exp["chosen"])


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", ["h2o_gqa_fp32", "h2o_layer_bf16", "snapkv_avg_gqa_fp32", "snapkv_max_mqa_fp16",
                                  "fastv_joint_bf16", "fastv_per_image_fp32"])
def test_anchors_baselines(backend, case):
    B = getattr(vlsparse, backend)
    m, x = load(GOLDEN_DIR / "baselines" / case)
    specs = {t["name"]: t for t in m["outputs"]}
    exp = lambda n: np.load(GOLDEN_DIR / "baselines" / case / specs[n]["file"])
    P, policy = m["params"], m["params"]["baseline"]  # the manifest's params as they are
    sel = B.baseline_select(policy, x["q"], x["k"], m["layout"], P)
    if policy == "h2o":
        compare(specs["scores"], B.h2o_scores(x["q"], x["k"], P["groups"]), exp("scores"))
        compare(specs["kept_mask"], sel.mask(), exp("kept_mask"))
    elif policy == "snapkv":
        compare(specs["window_scores"], B.snapkv_window_scores(x["q"], x["k"], P["window"], P["groups"]), exp("window_scores"))
        compare(specs["kept_mask"], sel.mask(), exp("kept_mask"))
    else:
        compare(specs["scores"], B.fastv_scores(x["q"], x["k"]), exp("scores"))
        compare(specs["sequence_mask"], sel.mask()[0], exp("sequence_mask"))


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", ["trace_k3_gqa_fp32", "single_span_mqa_fp16", "async_text_h2o_bf16"])
def test_avl_round_trip(tmp_path, backend, case):
    B = getattr(vlsparse, backend)
    m, x = load(GOLDEN_DIR / "avl" / case)
    specs = {t["name"]: t for t in m["outputs"]}
    exp = lambda n: np.load(GOLDEN_DIR / "avl" / case / specs[n]["file"])
    sel = B.avl_prefill_select(x["q"], x["k"], m["layout"], m["params"])
    compare(specs["scores"], sel.scores, exp("scores"))
    compare(specs["kept_mask"], sel.kept.mask(), exp("kept_mask"))
    r = B.avl_decode(sel, x["k"], x["v"], x["decode_q"], x["decode_k"], x["decode_v"], m["params"])
    for name in ["core_mask", "read_mask", "refresh", "refresh_scores"]:
        compare(specs[name], r[name], exp(name))
    compare(specs["decode_out"], r["out"], exp("decode_out"))
    # Every output of the case, through golden.verify.
    outputs = {"scores": sel.scores, "kept_mask": sel.kept.mask(), "decode_out": r["out"],
               **{name: r[name] for name in ["core_mask", "read_mask", "refresh", "refresh_scores"]}}
    for name, a in outputs.items():
        np.save(tmp_path / f"{name}.npy", a)
    v = vlsparse.golden.verify(tmp_path, GOLDEN_DIR / "avl" / case)
    assert v["pass"] and len(v["cases"][0]["outputs"]) == len(outputs), v


@pytest.mark.parametrize("case", ["streamingllm_rolling", "random_visual", "random_all_count", "fixed_ratio_last_all",
                                  "fixed_ratio_stride"])
def test_anchors_static_baselines(case):
    m, x = load(GOLDEN_DIR / "baselines" / case)
    spec = next(t for t in m["outputs"] if t["name"] == "kept_mask")
    layer = int(x["layer"][0]) if "layer" in x else 0
    sel = vlsparse.baseline_select_static(m["params"]["baseline"], m["layout"], m["params"], layer)  # as the manifest has them
    compare(spec, sel.mask()[0], np.load(GOLDEN_DIR / "baselines" / case / spec["file"]))


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", ["st_video_gqa_fp32", "layer_grouping_bf16_mqa", "two_videos_atrous_fp16"])
def test_anchors_purekv(backend, case):
    # The layer-by-layer estimator by hand: layers up to l0 score themselves (or stay dense), the higher
    # ones reuse l0's scores; ST-SpAttn from st_start_layer on.
    B = getattr(vlsparse, backend)
    m, x = load(GOLDEN_DIR / "purekv" / case)
    P, l0 = m["params"], m["params"]["l0"]
    specs = {t["name"]: t for t in m["outputs"]}
    exp = lambda n: np.load(GOLDEN_DIR / "purekv" / case / specs[n]["file"])
    s0 = B.purekv_window_scores(x["q"][l0], x["k"][l0], l0, P)
    compare(specs["scores_l0"], s0.s, exp("scores_l0"))
    for layer in range(exp("kept_mask").shape[0]):
        q, k, v = x["q"][layer], x["k"][layer], x["v"][layer]
        if layer < l0 and P["lower_layers"] == "dense":
            assert exp("kept_mask")[layer].all()
        else:
            sel = B.purekv_select(B.purekv_window_scores(q, k, layer, P) if layer <= l0 else s0, v, layer, P)
            compare(dict(specs["importance"], name=f"importance[{layer}]"), sel.importance, exp("importance")[layer])
            compare(dict(specs["kept_mask"], name=f"kept_mask[{layer}]"), sel.selection.mask(), exp("kept_mask")[layer])
        masked = layer >= P["st_start_layer"]
        out = B.purekv_st_attention(q, k, v, m["layout"], P) if masked else B.dense_attention(q, k, v)
        compare(dict(specs["prefill_out"], name=f"prefill_out[{layer}]"), out, exp("prefill_out")[layer])
        if layer > l0:  # Eq. 5-7: the estimate against the layer's own scores
            val = B.purekv_validate(s0, q, k, v, layer, P)
            compare(dict(specs["validation_rho"], name=f"rho[{layer}]"), [g["rho"] for g in val], exp("validation_rho")[layer - l0 - 1])
            compare(dict(specs["validation_p"], name=f"p[{layer}]"), [g["p_value"] for g in val], exp("validation_p")[layer - l0 - 1])


@pytest.mark.skipif(not os.path.isfile(os.environ.get("VLSPARSE_SIM", "")),
                    reason="vlsparse-sim not built (-Dsimulator=false, or not compiled yet): no file at $VLSPARSE_SIM")
def test_verify_is_the_simulators(tmp_path):
    golden = GOLDEN_DIR / "zipvl" / "small_n_all_probes"
    outputs = run_zipvl(vlsparse.reference, golden)
    outputs["normalized"] = outputs["normalized"] * (1 + 1e-4)
    for name, a in outputs.items():
        np.save(tmp_path / f"{name}.npy", a)
    cli = tmp_path / "cli.json"
    r = subprocess.run([os.environ["VLSPARSE_SIM"], "golden", "verify", str(tmp_path), "--golden", str(golden), "--json", str(cli)],
                       capture_output=True)
    assert r.returncode == 1  # a failure found
    got = vlsparse.golden.verify(tmp_path, golden)
    assert got == json.loads(cli.read_text()) and not got["pass"]


BLINDSIGHT_CASES = sorted(p.name for p in (GOLDEN_DIR / "blindsight").iterdir() if (p / "manifest.json").exists())


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", BLINDSIGHT_CASES)
def test_blindsight_round_trip(tmp_path, backend, case):
    # Every output a BlindSight case has (masks and FLOPs; masked attention, characterization and
    # aggregation where the case has their inputs), through golden.verify.
    B = getattr(vlsparse, backend)
    m, x = load(GOLDEN_DIR / "blindsight" / case)
    P, names = m["params"], ["Dense", "Sink", "Document", "Document-Sink"]
    outputs = dict(vlsparse.blindsight_masks(m["layout"], P))
    if "q" in x:
        if "heads" in x:
            outputs["masked_out"] = B.masked_attention(x["q"], x["k"], x["v"], m["layout"], [names[i] for i in x["heads"]], P)
        ch = B.blindsight_characterize(x["q"], x["k"], x["v"], m["layout"], P)
        outputs["nmse"] = np.array([[h["nmse"][t] for t in names] for h in ch])
        outputs["chosen"] = np.array([names.index(h["chosen"]) for h in ch], np.int64)
    if "counts" in x:
        outputs["aggregated"] = np.array([names.index(t) for t in vlsparse.blindsight_aggregate(x["counts"], P)], np.int64)
    for name, a in outputs.items():
        np.save(tmp_path / f"{name}.npy", a)
    v = vlsparse.golden.verify(tmp_path, GOLDEN_DIR / "blindsight" / case)
    failed = [o["name"] + ": " + o["detail"] for o in v["cases"][0]["outputs"] if not o["pass"]]
    assert v["pass"] and not failed and len(v["cases"][0]["outputs"]) == len(outputs), failed


BASELINE_CASES = sorted(p.name for p in (GOLDEN_DIR / "baselines").iterdir() if (p / "manifest.json").exists())


def h2o_outputs(B, m, x):
    """An H2O case as an engine runs it: B's scores and prefill selection, then the decode steps over a
    vlsparse.KvCache, the step's probabilities fed back to vlsparse.H2OPolicy, which evicts."""
    P, layout = m["params"], m["layout"]
    q, k, v = x["q"], x["k"], x["v"]
    (n, H, d), Hkv, S = q.shape, k.shape[1], x["decode_q"].shape[0]
    scores = B.h2o_scores(q, k, P["groups"])
    sel = B.baseline_select("h2o", q, k, layout, P)
    pol = vlsparse.H2OPolicy(P)
    pol.begin(layout, {"layers": 1, "heads": H, "kv_heads": Hkv, "head_dim": d})
    kv = pol.prefill(0, q, k, v)  # the policy ranks on the SIMD path: the same kept set
    assert [list(a) for a in kv.indices] == [list(a) for a in sel.indices]
    cache = vlsparse.KvCache(Hkv, d, k.dtype)
    cache.assign(k, v)
    cache.keep(sel)
    G, r = scores.shape[0], H // Hkv
    kept, outs = np.zeros((S, G, n + S), np.uint8), []
    for t in range(S):
        cache.append(x["decode_k"][t], x["decode_v"][t])
        read = pol.decode_read(0, t, vlsparse.TokenSelection(n + t + 1, [cache.positions(g) for g in range(Hkv)]))
        rows = cache.rows_for_positions(read)
        out, probs = B.indexed_decode_attention(x["decode_q"][t], cache, rows, probs=True, scale=P["scale"])
        attn = [probs[g * r:(g + 1) * r, : len(rows[g])].mean(axis=0) for g in range(Hkv)]  # per KV head
        keep = pol.decode_observe(0, t, read, attn)
        if keep is not None:
            cache.keep(keep)
        for g in range(G):
            kept[t, g, cache.positions(g)] = 1
        outs.append(out)
    return {"scores": scores, "kept_mask": sel.mask(), "decode_kept_mask": kept, "decode_scores": pol.accumulated(0),
            "decode_out": np.stack(outs)}


def streamingllm_outputs(m, x):
    """A StreamingLLM case: the prefill selection, then the window rolled by vlsparse.StreamingLLMPolicy at
    each step (it reads no attention: any q, k, v of the prompt's length drive its prefill)."""
    P, layout = m["params"], m["layout"]
    n, S = vlsparse.layout_n(layout), int(x["steps"][0])
    pol = vlsparse.StreamingLLMPolicy(P)
    pol.begin(layout, {"layers": 1, "heads": 1, "kv_heads": 1, "head_dim": 1})
    z = np.zeros((n, 1, 1), np.float32)
    cached = list(pol.prefill(0, z, z, z).indices[0])
    kept = np.zeros((S, n + S), np.uint8)
    for t in range(S):
        cached.append(n + t)
        read = pol.decode_read(0, t, vlsparse.TokenSelection(n + t + 1, [cached]))
        keep = pol.decode_observe(0, t, read)
        cached = list(keep.indices[0]) if keep is not None else cached
        kept[t, cached] = 1
    return {"kept_mask": vlsparse.baseline_select_static("streamingllm", layout, P).mask()[0], "decode_kept_mask": kept}


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", BASELINE_CASES)
def test_baselines_round_trip(tmp_path, backend, case):
    # Every baseline case, through golden.verify: H2O's and StreamingLLM's decode steps with their
    # decode-time eviction included.
    B = getattr(vlsparse, backend)
    m, x = load(GOLDEN_DIR / "baselines" / case)
    P, policy = m["params"], m["params"]["baseline"]
    if policy == "h2o":
        outputs = h2o_outputs(B, m, x)
    elif policy == "streamingllm":
        outputs = streamingllm_outputs(m, x)
    elif policy == "snapkv":
        window = B.snapkv_window_scores(x["q"], x["k"], P["window"], P["groups"])
        sel = B.baseline_select(policy, x["q"], x["k"], m["layout"], P)
        outputs = {"window_scores": window, "pooled": B.snapkv_pool(window, P["kernel"], P["pooling"]), "kept_mask": sel.mask()}
    elif policy == "fastv":
        sel = B.baseline_select(policy, x["q"], x["k"], m["layout"], P)
        outputs = {"scores": B.fastv_scores(x["q"], x["k"]), "sequence_mask": sel.mask()[0]}
    else:
        layer = int(x["layer"][0]) if "layer" in x else 0
        outputs = {"kept_mask": vlsparse.baseline_select_static(policy, m["layout"], P, layer).mask()[0]}
    for name, a in outputs.items():
        np.save(tmp_path / f"{name}.npy", a)
    v = vlsparse.golden.verify(tmp_path, GOLDEN_DIR / "baselines" / case)
    failed = [o["name"] + ": " + o["detail"] for o in v["cases"][0]["outputs"] if not o["pass"]]
    assert v["pass"] and not failed and len(v["cases"][0]["outputs"]) == len(outputs), failed


PUREKV_CASES = sorted(p.name for p in (GOLDEN_DIR / "purekv").iterdir() if (p / "manifest.json").exists())


@pytest.mark.parametrize("backend", ["reference", "simd"])
@pytest.mark.parametrize("case", PUREKV_CASES)
def test_purekv_round_trip(tmp_path, backend, case):
    # Every PureKV case, through golden.verify: the video masks, and where the case has a prompt the
    # backend's estimator layer by layer (observe up to l0, attention, select, validation above l0);
    # the Spearman cases through vlsparse.spearman.
    B = getattr(vlsparse, backend)
    m, x = load(GOLDEN_DIR / "purekv" / case)
    P, layout = m["params"], m["layout"]
    masks = vlsparse.purekv_masks(layout, P)
    outputs = {"masks": masks["masks"], "allowed_pairs": masks["allowed_pairs"]}
    if "q" in x:
        (L, n, H, d), Hkv, l0 = x["q"].shape, x["k"].shape[2], P["l0"]
        est = B.PureKVEstimator(P, layout, {"layers": L, "heads": H, "kv_heads": Hkv, "head_dim": d})
        G = Hkv if P["grouping"] == "kv_head" else 1
        v_norm, importance, kept = np.zeros((L, G, n)), np.zeros((L, G, n)), np.zeros((L, G, n), np.uint8)
        out, rho, p = [], [], []
        for layer in range(L):
            q, k, v = x["q"][layer], x["k"][layer], x["v"][layer]
            if est.needs_scores(layer):
                est.observe(layer, q, k)
            out.append(est.attention(layer, q, k, v))
            sel = est.select(layer, v)
            kept[layer] = sel.selection.mask()
            if not sel.dense:
                v_norm[layer], importance[layer] = sel.v_norm, sel.importance
            if layer > l0:
                val = est.validate(layer, q, k, v)
                rho.append([g["rho"] for g in val])
                p.append([g["p_value"] for g in val])
        outputs.update(scores_l0=est.scores(l0).s, v_norm=v_norm, importance=importance, kept_mask=kept, prefill_out=np.stack(out))
        if rho:
            outputs.update(validation_rho=np.array(rho), validation_p=np.array(p))
    if "x" in x:
        r = vlsparse.spearman(x["x"], x["y"])
        outputs["spearman"] = np.array([r["rho"], r["p_value"]])
    for name, a in outputs.items():
        np.save(tmp_path / f"{name}.npy", a)
    v = vlsparse.golden.verify(tmp_path, GOLDEN_DIR / "purekv" / case)
    failed = [o["name"] + ": " + o["detail"] for o in v["cases"][0]["outputs"] if not o["pass"]]
    assert v["pass"] and not failed and len(v["cases"][0]["outputs"]) == len(outputs), failed
