#!/usr/bin/env python3
"""ZipVL in numpy: an independent port that recomputes a golden case from its inputs.

    python3 zipvl_numpy.py GOLDEN_CASE_DIR OUT_DIR
    python3 golden_check.py GOLDEN_CASE_DIR OUT_DIR

It follows docs/zipvl.md line by line (float64 throughout) and shows a porter everything a port
needs: the SplitMix64 probe draw, the causal probe attention, Eq. 7-9, the forced keeps, the
token-sparse prefill, eviction with positions kept, and decode over the compressed cache.
"""
import json
import math
import pathlib
import sys

import numpy as np

MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, m):
        return (self.next() * m) >> 64


def sample_without_replacement(n, k, seed):
    rng, a = SplitMix64(seed), list(range(n))
    for i in range(k):
        j = i + rng.below(n - i)
        a[i], a[j] = a[j], a[i]
    return sorted(a[:k])


def ratio_count(ratio, n):
    """ceil(ratio * n), guarded so that a product that is an integer (0.07 * 100 = 7.000000000000001) stays it."""
    x = ratio * n
    return math.ceil(x - 1e-9 * max(1.0, x))


def probes(n, layer, p):
    recent, random = p["probe_recent"], p["probe_random"]
    if p["probe_mode"] == "ratios":
        recent = ratio_count(p["probe_recent_ratio"], n)
        random = ratio_count(p["probe_random_ratio"], n)
    if n <= recent + random:
        return list(range(n))
    recent = max(recent, 1)
    return sample_without_replacement(n - recent, random, (p["seed"] + layer) & MASK64) + list(range(n - recent, n))


def text_mask(layout, n):
    mask, pos = np.zeros(n, dtype=bool), 0
    for item in layout.split(","):
        kind, rest = item.split(":")
        count = rest.split("[")[0]
        length = math.prod(int(x) for x in count.split("x"))
        if kind == "text":
            mask[pos:pos + length] = True
        pos += length
    return mask


def load(case, spec):
    a = np.load(case / spec["file"])
    if spec["dtype"] == "bf16":
        return a, (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a, a.astype(np.float64)


def softmax_rows(s):
    s = s - s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=1, keepdims=True)


def attend(q, k, v, q_pos, k_pos, scale):
    """Rows of q attend to keys with position <= their own; rows seeing no key are zero."""
    out = np.zeros((q.shape[0], v.shape[1]))
    if k.shape[0] == 0:
        return out
    s = scale * q @ k.T
    visible = k_pos[None, :] <= q_pos[:, None]
    s = np.where(visible, s, -np.inf)
    rows = visible.any(axis=1)
    out[rows] = softmax_rows(s[rows]) @ v
    return out


def main(argv):
    case, out_dir = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    m = json.loads((case / "manifest.json").read_text())
    P = m["params"]
    # Every manifest carries the ablation modes (docs/zipvl.md); this port is the paper's method.
    for key, paper in (("prefill", "sparse"), ("ratio", "adaptive"), ("ranking", "normalized")):
        if P.get(key, paper) != paper:
            raise SystemExit(f"{case}: params.{key} = {P[key]!r}, this port implements only {paper!r}")
    inputs = {t["name"]: t for t in m["inputs"]}
    (q_raw, q), (k_raw, k), (v_raw, v) = (load(case, inputs[x]) for x in ("q", "k", "v"))
    _, dq = load(case, inputs["decode_q"])
    dk_raw, dk = load(case, inputs["decode_k"])
    dv_raw, dv = load(case, inputs["decode_v"])
    layer = int(np.load(case / inputs["layer"]["file"])[0])
    n, H, d = q.shape
    Hkv = k.shape[1]
    qpk = H // Hkv
    # The default scale is 1/sqrt(d) rounded to fp32 (the Params field is a float), then used in double.
    scale = P["scale"] if P["scale"] > 0 else float(np.float32(1.0 / math.sqrt(d)))
    G = 1 if P["grouping"] == "layer" else Hkv
    hpg = H // G
    save = lambda name, a: np.save(out_dir / (name + ".npy"), a)

    dense = layer < P["dense_layers"]
    if dense:  # no probes, no scores, p = n per group, everything kept, dense prefill
        prb, acc, nrm, p = [], np.zeros((0, n)), np.zeros((0, n)), np.full(G, n, dtype=np.int64)
        kept = [np.arange(n)]
    else:
        prb = probes(n, layer, P)
        pr = np.array(prb)
        acc = np.zeros((G, n))
        for h in range(H):  # Eq. A, causal on the probe rows; a_j summed per group
            s = scale * q[pr, h, :] @ k[:, h // qpk, :].T
            s = np.where(np.arange(n)[None, :] <= pr[:, None], s, -np.inf)
            acc[h // hpg] += softmax_rows(s).sum(axis=0)
        total = hpg * len(prb)
        if P["nnz"] == "causal_column":
            nnz = np.tile((n - np.arange(n)).astype(np.float64), (G, 1))
        else:
            nnz = np.tile(np.array([hpg * np.sum(pr >= j) for j in range(n)], dtype=np.float64), (G, 1))
        nrm = np.where(nnz > 0, acc / np.where(nnz > 0, nnz, 1), 0.0)
        p = np.zeros(G, dtype=np.int64)
        kept = []
        text = text_mask(m["layout"], n)
        for g in range(G):
            c = np.cumsum(np.sort(acc[g])[::-1])  # Eq. 7
            hit = np.flatnonzero(c >= P["tau"] * total)
            p[g] = hit[0] + 1 if hit.size else n
            order = np.lexsort((np.arange(n), -nrm[g]))  # larger first, ties by lower position (Eq. 9)
            keep = np.zeros(n, dtype=bool)
            keep[order[:p[g]]] = True
            keep[max(0, n - P["keep_last"]):] = True
            if P["keep_text"]:
                keep |= text
            kept.append(np.flatnonzero(keep))
    save("probes", np.array(prb, dtype=np.int64))
    save("accumulated", acc)
    save("normalized", nrm)
    save("p", p)
    mask = np.zeros((len(kept), n), dtype=np.uint8)
    for g, t in enumerate(kept):
        mask[g, t] = 1
    save("kept_mask", mask)

    out = np.zeros((n, H, d))
    for h in range(H):
        t = kept[0] if len(kept) == 1 else kept[h // qpk]
        g = h // qpk
        # attend_selected: every row attends to the kept keys at or before it; a row before the first
        # kept key sees none and is zero (as are the rows outside t with unselected = zero).
        rows = np.arange(n) if (dense or P["unselected"] == "attend_selected") else t
        out[rows, h] = attend(q[rows, h], k[t, g], v[t, g], rows, t, scale)
    save("prefill_out", out.astype(np.float32))

    caches = []
    for g in range(Hkv):
        t = kept[0] if len(kept) == 1 else kept[g]
        save(f"cache_pos_g{g}", t.astype(np.int64))
        save(f"cache_k_g{g}", k_raw[t, g])
        save(f"cache_v_g{g}", v_raw[t, g])
        caches.append([k[t, g], v[t, g], t.astype(np.int64)])
    steps = dq.shape[0]
    dout = np.zeros((steps, H, d))
    for s in range(steps):
        for g in range(Hkv):
            caches[g][0] = np.vstack([caches[g][0], dk[s, g][None]])
            caches[g][1] = np.vstack([caches[g][1], dv[s, g][None]])
        for h in range(H):
            kk, vv, _ = caches[h // qpk]
            w = softmax_rows(scale * dq[s, h][None] @ kk.T)
            dout[s, h] = (w @ vv)[0]
    save("decode_out", dout.astype(np.float32))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.strip())
        sys.exit(2)
    sys.exit(main(sys.argv))
