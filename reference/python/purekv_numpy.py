#!/usr/bin/env python3
"""PureKV in numpy: an independent port that recomputes a golden case from its inputs.

    python3 purekv_numpy.py GOLDEN_CASE_DIR OUT_DIR
    python3 golden_check.py GOLDEN_CASE_DIR OUT_DIR

It follows docs/purekv.md (float64 throughout): the video masks pair by pair, the window scores
(Eq. 2), the importance with ||V|| (Eq. 3 / Eq. 4) per KV head or per layer, window + top-h with
ties broken by the lower position, the prefill attention (ST-masked from st_start_layer), and the
Spearman validation (average ranks for ties; two-sided p-value from Student's t with n - 2 degrees
of freedom, here by Gauss-Legendre quadrature of the beta density instead of a continued fraction).
"""
import json
import math
import pathlib
import sys

import numpy as np

KINDS = ["spatial", "temporal", "spatial_temporal", "local_window", "atrous"]


def parse_layout(spec):
    """[(kind, start, length, frames, tokens_per_frame)] of a layout spec string."""
    segs, pos = [], 0
    for item in spec.split(","):
        kind, rest = item.split(":")
        rest = rest.split("[")[0]
        if kind == "video":
            frames, tpf = map(int, rest.split("x"))
            length = frames * tpf
        else:
            frames, tpf, length = 0, 0, int(rest)
        segs.append((kind, pos, length, frames, tpf))
        pos += length
    return segs, pos


def video_allowed(segs, seg_of, kind, window, dilation, i, j):
    """The Dense template with a video mask: causal, and the mask's rule inside a video."""
    if j > i:
        return False
    if j == i:
        return True
    a, b = seg_of[i], seg_of[j]
    skind, start, _, _, tpf = segs[a]
    if skind != "video" or a != b or kind == "none":
        return True
    fi, si = divmod(i - start, tpf)
    fj, sj = divmod(j - start, tpf)
    w = window if window > 0 else tpf
    if kind == "spatial":
        return fj == 0 or fj == fi
    if kind == "temporal":
        return fj == 0 or (fj == fi - 1 and sj == si)
    if kind == "spatial_temporal":
        return fj == 0 or fj == fi or (fj == fi - 1 and sj == si)
    if kind == "local_window":
        return i - j < w
    if kind == "atrous":
        return (i - j) % dilation == 0 and (i - j) // dilation < w
    raise ValueError(kind)


def betainc(a, b, x):
    """Regularized incomplete beta I_x(a, b) by Gauss-Legendre quadrature over t = x s, s in [0, 1]."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    u, wts = np.polynomial.legendre.leggauss(400)
    s = 0.5 * (u + 1)
    f = np.exp((a - 1) * np.log(s) + (b - 1) * np.log1p(-x * s) + a * math.log(x) - log_beta)
    return float(0.5 * np.sum(wts * f))


def average_ranks(v):
    order = np.argsort(v, kind="stable")
    s = v[order]
    r = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and s[j + 1] == s[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x, y):
    rho = float(np.corrcoef(average_ranks(x), average_ranks(y))[0, 1])
    p = 0.0 if abs(rho) >= 1 else betainc((len(x) - 2) / 2, 0.5, 1 - rho * rho)
    return rho, p


def main(case, out):
    out.mkdir(parents=True, exist_ok=True)
    m = json.loads((case / "manifest.json").read_text())
    P = m["params"]

    def load(name):
        spec = next(t for t in m["inputs"] if t["name"] == name)
        a = np.load(case / spec["file"])
        if spec["dtype"] == "bf16":  # stored as raw uint16 bits
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float64)

    segs, n = parse_layout(m["layout"])
    seg_of = np.zeros(n, int)
    for s, (_, start, length, _, _) in enumerate(segs):
        seg_of[start:start + length] = s

    def mask_of(kind):
        return np.array([[video_allowed(segs, seg_of, kind, P["st_window"], P["st_dilation"], i, j)
                          for j in range(n)] for i in range(n)], dtype=np.uint8)

    masks = np.stack([mask_of(k) for k in KINDS])
    np.save(out / "masks.npy", masks)
    np.save(out / "allowed_pairs.npy", masks.reshape(len(KINDS), -1).sum(1).astype(np.int64))

    names = [t["name"] for t in m["inputs"]]
    if "x" in names:
        np.save(out / "spearman.npy", np.array(spearman(load("x"), load("y"))))
    if "q" not in names:
        return
    Q, K, V = load("q"), load("k"), load("v")
    L, _, H, d = Q.shape
    Hkv = K.shape[2]
    w, l0 = P["window"], P["l0"]
    rest = n - w
    G = Hkv if P["grouping"] == "kv_head" else 1
    scale = float(np.float32(1.0 / math.sqrt(d))) if P["scale"] == 0 else P["scale"]
    if P["budget"] == "count":
        h = P["top_h"]
    else:
        x = P["budget_fraction"] * n
        h = min(max(int(math.floor(x + 1e-9 * max(1.0, x))) - w, 0), rest)

    def window_scores(l):  # Eq. 2: causal softmax rows of the window, summed over rows and group heads
        s = np.zeros((G, n))
        for hh in range(H):
            logits = Q[l, rest:, hh, :] @ K[l, :, hh // (H // Hkv), :].T * scale
            for r in range(w):
                z = logits[r, :rest + r + 1]
                p = np.exp(z - z.max())
                s[hh // (H // G), :rest] += (p / p.sum())[:rest]
        return s

    def select(s, l):  # Eq. 3 / 4 and window + top-h (larger first, ties: lower position)
        norms = np.linalg.norm(V[l], axis=2).T
        vn = norms if G == Hkv else norms.mean(0, keepdims=True)
        imp = s * vn
        imp[:, rest:] = 0
        kept = np.zeros((G, n), np.uint8)
        for g in range(G):
            kept[g, sorted(range(rest), key=lambda j: (-imp[g, j], j))[:h]] = 1
            kept[g, rest:] = 1
        return vn, imp, kept

    has_video = any(sg[0] == "video" for sg in segs)
    st = None if P["st_mask"] == "none" or not has_video else mask_of(P["st_mask"]).astype(bool)
    causal = np.tril(np.ones((n, n), bool))
    own = {}
    VN, IMP = np.zeros((L, G, n)), np.zeros((L, G, n))
    KEPT = np.zeros((L, G, n), np.uint8)
    OUT = np.zeros((L, n, H, d), np.float32)
    rhos, ps = [], []
    for l in range(L):
        dense = l < l0 and P["lower_layers"] == "dense"
        if l <= l0 and not dense:
            own[l] = window_scores(l)
        if dense:
            KEPT[l] = 1
        else:
            VN[l], IMP[l], KEPT[l] = select(own[min(l, l0)], l)
            if l > l0:
                own_imp = select(window_scores(l), l)[1]
                for g in range(G):
                    rho, p = spearman(IMP[l, g, :rest], own_imp[g, :rest])
                    rhos.append(rho)
                    ps.append(p)
        M = st if st is not None and l >= P["st_start_layer"] else causal
        for hh in range(H):
            g = hh // (H // Hkv)
            z = np.where(M, Q[l, :, hh, :] @ K[l, :, g, :].T * scale, -np.inf)
            p = np.exp(z - z.max(1, keepdims=True))
            OUT[l, :, hh, :] = (p / p.sum(1, keepdims=True)) @ V[l, :, g, :]
    np.save(out / "scores_l0.npy", own[l0])
    np.save(out / "v_norm.npy", VN)
    np.save(out / "importance.npy", IMP)
    np.save(out / "kept_mask.npy", KEPT)
    np.save(out / "prefill_out.npy", OUT)
    if L - l0 - 1 > 0:
        np.save(out / "validation_rho.npy", np.array(rhos).reshape(L - l0 - 1, G))
        np.save(out / "validation_p.npy", np.array(ps).reshape(L - l0 - 1, G))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
