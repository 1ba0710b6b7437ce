#!/usr/bin/env python3
"""PyTorch baselines for GPU prefill attention: the other half of bench/cuda_prefill_bench.cu.

Per n (bf16, batch 1, one layer; q [1, H, n, d], k, v [1, H_kv, n, d] drawn from a normal
distribution; H, H_kv, d = --H, --H-kv, --d, 28 / 4 / 128 by default), timed with CUDA events after a
write that evicts the L2 (--flush-mib), median of --reps calls after --warmup calls:

  case dense_causal
    sdpa_cudnn           scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) under
                         sdpa_kernel(CUDNN_ATTENTION);
    sdpa_flash           the same under FLASH_ATTENTION (FlashAttention-2);
    flex                 FlexAttention (flex_attention compiled with torch.compile, enable_gqa=True)
                         with a causal block mask (create_block_mask, BLOCK_SIZE 128, built once per
                         shape, not timed);
  case <the "case" of a mask file>, for every mask JSON file in --masks whose n matches
    flex                 FlexAttention with a mask_mod that reproduces vlsparse's MaskContext::allows
                         (include/vlsparse/masks/templates.hpp: the BlindSight template of each head,
                         then the PureKV video mask) from lookup tensors built out of the file. Before
                         timing, the mask_mod's allowed (query, key) pairs, summed over the heads, are
                         counted on the GPU (row chunks, one pass per distinct template) and must equal
                         the file's "allowed_pairs": on a mismatch the script stops with exit status 1,
                         since the two benchmarks would not time the same mask;
  case zipvl_keep50
    gather_sdpa          ZipVL's token-sparse prefill the way a PyTorch user writes it once the kept
                         positions are known: m = n / 2 positions (torch.randperm(n - 1) with seed 1,
                         the first m - 1 plus the last position n - 1, sorted), index_select of their
                         q, k, v rows, SDPA cuDNN causal over the m gathered tokens, the outputs
                         index_copy_'d into a zeroed [1, H, n, d] output, timed together;
    sdpa_cudnn_gathered  the SDPA call alone, on the rows gathered beforehand.

A shape whose dense causal reference is needed by a mask (its own H, H_kv, d) also gets the three
dense_causal rows. A backend that refuses a shape, or fails on it, is written with an empty time and
the reason in its note; nothing else stops the run (except the allowed-pair check above).

CSV (--out, --append): impl,case,dtype,H,H_kv,d,n,time_us,pairs,tflops,note, the columns of
cuda_prefill_bench; bench/cuda_prefill_report.py joins the two. pairs: allowed (query, key) pairs
summed over the heads (dense causal H * n * (n + 1) / 2; a mask: its allowed_pairs; zipvl_keep50:
H * m * (m + 1) / 2); tflops: 4 * d * pairs / time (the two matmuls over the allowed pairs), 1e12/s.

Mask JSON (one file per case and n, written by cuda_prefill_bench): {"case", "n", "H", "H_kv", "d",
"token_image" [n, -1 text], "token_sink" [n, 0/1], "image_start", "image_end", "image_frame_tokens"
[images, 0 for an image, tokens per frame for a video], "bidirectional_images", "video" (none |
spatial | temporal | spatial_temporal | local_window | atrous), "video_window", "video_dilation",
"head_templates" [H of Dense | Sink | Document | Document-Sink], "allowed_pairs"}.

--self-test needs no GPU and no torch (numpy only): the mask formulation that the flex mask_mod
uses, evaluated on numpy arrays, against a line-by-line Python transcription of
MaskContext::template_allows / video_allows on small prompts (every template, both image
directionalities, every video mask), the chunked pair count, the detection of a wrong
allowed_pairs, and, where the checkout has them, the masks of golden/blindsight and golden/purekv.

  python3 bench/torch_prefill_bench.py --masks OUT/masks --out prefill.csv --append
  python3 bench/torch_prefill_bench.py --n 8192,16384 --reps 11 --cases dense_causal,zipvl_keep50
  python3 bench/torch_prefill_bench.py --self-test
"""
import argparse
import csv
import glob
import json
import math
import os
import statistics
import sys
import time

COLUMNS = ["impl", "case", "dtype", "H", "H_kv", "d", "n", "time_us", "pairs", "tflops", "note"]

TEMPLATES = {"Dense": 0, "Sink": 1, "Document": 2, "Document-Sink": 3}
DENSE, SINK, DOCUMENT, DOCUMENT_SINK = 0, 1, 2, 3
VIDEO_MASKS = ("none", "spatial", "temporal", "spatial_temporal", "local_window", "atrous")
DENSE_CASE = "dense_causal"
ZIPVL_CASE = "zipvl_keep50"
FLEX_BLOCK = 128


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")
    if not v or any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return v


def name_list(s):
    v = [x.strip() for x in s.split(",") if x.strip()]
    if not v:
        raise argparse.ArgumentTypeError(f"expected comma-separated case names, got {s!r}")
    return v


def causal_pairs(H, n):
    return H * n * (n + 1) // 2


def tflops(d, pairs, time_us):
    """Attention TF/s over the allowed pairs: 2 matmuls x 2 flops x d per pair."""
    if not time_us or pairs is None:
        return None
    return 4.0 * d * pairs / (time_us * 1e-6) / 1e12


def csv_row(impl, case, H, Hkv, d, n, time_us, pairs, note, dtype="bf16"):
    tf = tflops(d, pairs, time_us)
    return [impl, case, dtype, H, Hkv, d, n, "" if time_us is None else f"{time_us:.2f}",
            "" if pairs is None else str(pairs), "" if tf is None else f"{tf:.2f}", note]


# ---------------------------------------------------------------------------------------------
# Mask files.

def check_mask(m, where="mask"):
    """Validates a mask dict (the JSON of cuda_prefill_bench); raises ValueError naming the problem."""
    def need(cond, msg):
        if not cond:
            raise ValueError(f"{where}: {msg}")

    need(isinstance(m, dict), "expected a JSON object")
    for key in ("case", "n", "H", "H_kv", "d", "token_image", "token_sink", "image_start", "image_end",
                "image_frame_tokens", "bidirectional_images", "video", "video_window", "video_dilation",
                "head_templates", "allowed_pairs"):
        need(key in m, f"missing field {key!r}")
    need(isinstance(m["case"], str) and m["case"], "case: expected a non-empty string")
    for key in ("n", "H", "H_kv", "d", "video_window", "video_dilation", "allowed_pairs"):
        need(isinstance(m[key], int) and not isinstance(m[key], bool), f"{key}: expected an integer")
    n, H, Hkv = m["n"], m["H"], m["H_kv"]
    need(n > 0 and H > 0 and Hkv > 0 and m["d"] > 0, "n, H, H_kv, d must be positive")
    need(H % Hkv == 0, f"H = {H} is not a multiple of H_kv = {Hkv}")
    need(isinstance(m["bidirectional_images"], bool), "bidirectional_images: expected true or false")
    need(m["video"] in VIDEO_MASKS, f"video = {m['video']!r}, expected one of {', '.join(VIDEO_MASKS)}")
    need(m["video_window"] >= 0, f"video_window = {m['video_window']}, expected >= 0")
    need(m["video_dilation"] >= 1, f"video_dilation = {m['video_dilation']}, expected >= 1")
    need(isinstance(m["head_templates"], list) and len(m["head_templates"]) == H,
         f"head_templates: expected a list of H = {H} names")
    bad = [t for t in m["head_templates"] if t not in TEMPLATES]
    need(not bad, f"head_templates: unknown {bad[0]!r}, expected Dense, Sink, Document or Document-Sink"
         if bad else "")
    ti, ts = m["token_image"], m["token_sink"]
    need(isinstance(ti, list) and len(ti) == n, f"token_image: expected {n} entries")
    need(isinstance(ts, list) and len(ts) == n, f"token_sink: expected {n} entries")
    st, en, ft = m["image_start"], m["image_end"], m["image_frame_tokens"]
    nim = len(st) if isinstance(st, list) else -1
    need(nim >= 0 and isinstance(en, list) and isinstance(ft, list) and len(en) == nim and len(ft) == nim,
         "image_start, image_end, image_frame_tokens: expected lists of one length")
    need(all(isinstance(x, int) and -1 <= x < nim for x in ti), f"token_image: values in [-1, {nim}) expected")
    need(all(x in (0, 1) for x in ts), "token_sink: 0 or 1 expected")
    covered = 0
    for a in range(nim):
        need(0 <= st[a] < en[a] <= n, f"image {a}: [{st[a]}, {en[a]}) is not a non-empty range of [0, {n})")
        need(all(ti[p] == a for p in range(st[a], en[a])), f"image {a}: token_image differs from {a} inside it")
        need(ft[a] >= 0 and (ft[a] == 0 or (en[a] - st[a]) % ft[a] == 0),
             f"image {a}: {en[a] - st[a]} tokens are not whole frames of {ft[a]}")
        covered += en[a] - st[a]
    need(covered == sum(1 for x in ti if x >= 0), "token_image marks tokens outside every image range")
    need(all(ts[p] == 0 for p in range(n) if ti[p] < 0), "token_sink marks a text token")
    need(m["allowed_pairs"] >= 0, "allowed_pairs: expected >= 0")
    return m


def load_masks(folder):
    """Every *.json of the folder, validated, sorted by (n, case, file name)."""
    if not os.path.isdir(folder):
        raise ValueError(f"--masks {folder}: not a folder")
    paths = sorted(glob.glob(os.path.join(folder, "*.json")))
    out = []
    for p in paths:
        with open(p) as f:
            try:
                m = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: not JSON ({e})")
        check_mask(m, p)
        m["_path"] = p
        out.append(m)
    out.sort(key=lambda m: (m["n"], m["case"], m["_path"]))
    return out


# ---------------------------------------------------------------------------------------------
# The mask, one formulation for numpy arrays and torch tensors (operators and indexing only, so
# FlexAttention can trace it as a mask_mod): MaskContext::allows(t, i, j) = template_allows(t, i, j)
# && video_allows(i, j) of include/vlsparse/masks/templates.hpp.

class MaskTables:
    """Per-token lookup tables of a mask, as arrays of one kind (numpy or torch), plus the constants."""

    def __init__(self, m, asarray):
        """asarray(python list) -> an integer array of the wanted kind and device."""
        n = m["n"]
        ti = m["token_image"]
        st, en, ft = m["image_start"], m["image_end"], m["image_frame_tokens"]
        self.n, self.H = n, m["H"]
        self.bidir = bool(m["bidirectional_images"])
        self.video = m["video"]
        self.window = int(m["video_window"])
        self.dilation = int(m["video_dilation"])
        self.head_templates = [TEMPLATES[t] for t in m["head_templates"]]
        self.img = asarray(list(ti))                                           # image index, -1 text
        self.sink = asarray([int(x) for x in m["token_sink"]])                 # 1: a sink of its image
        self.end = asarray([en[a] if a >= 0 else p + 1 for p, a in enumerate(ti)])   # one past its image
        self.vstart = asarray([st[a] if a >= 0 else 0 for a in ti])            # first position of its image
        self.frame = asarray([ft[a] if a >= 0 else 0 for a in ti])             # tokens per frame, 0: no video
        self.frame1 = asarray([max(ft[a], 1) if a >= 0 else 1 for a in ti])    # the same, never 0 (divisor)
        self.tmpl = asarray(self.head_templates)                               # [H] template of each head


def mask_allows(tb, h, i, j):
    """Boolean array: may query i see key j on head h (broadcasting i, j; h indexes tb.tmpl)."""
    ti = tb.img[i]
    tj = tb.img[j]
    diag = i == j
    text_q = ti < 0
    tmpl = tb.tmpl[h]
    sink_j = tb.sink[j] != 0
    same = tj == ti                      # for an image query: key in the query's own image
    # template_allows, past j == i: text query j < i; image query a: j < hi, then a text key yes,
    # a key of a: Sink -> a sink, else yes; a key of b != a (b < a): Dense yes, Document no,
    # Sink / Document-Sink -> a sink.
    key_ok = (tj < 0) | (same & ((tmpl != SINK) | sink_j)) | \
             ((~same) & ((tmpl == DENSE) | ((tmpl != DOCUMENT) & sink_j)))
    hi = tb.end[i] if tb.bidir else i + 1
    ok = diag | (text_q & (j < i)) | ((~text_q) & (j < hi) & key_ok)
    if tb.video == "none":
        return ok
    # video_allows: only a video query with a key of the same video is restricted; j > i never.
    in_video = (~text_q) & same & (tb.frame[i] > 0)
    vs = tb.vstart[i]
    T = tb.frame1[i]
    W = tb.window if tb.window > 0 else T
    if tb.video in ("spatial", "temporal", "spatial_temporal"):
        fi = (i - vs) // T
        fj = (j - vs) // T
        back_one = (fj == fi - 1) & ((i - vs) % T == (j - vs) % T)
        if tb.video == "spatial":
            cond = (fj == 0) | (fj == fi)
        elif tb.video == "temporal":
            cond = (fj == 0) | back_one
        else:
            cond = (fj == 0) | (fj == fi) | back_one
    elif tb.video == "local_window":
        cond = (i - j) < W
    else:  # atrous
        cond = (((i - j) % tb.dilation) == 0) & (((i - j) // tb.dilation) < W)
    return ok & (diag | (~in_video) | ((j <= i) & cond))


def make_mask_mod(tb):
    """FlexAttention's mask_mod(b, h, q_idx, kv_idx) of the tables (four arguments, no defaults)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return mask_allows(tb, h, q_idx, kv_idx)
    return mask_mod


def count_allowed(tb, arange, head_index, total, rows=None):
    """Allowed (query, key) pairs summed over the heads: rows of the mask in chunks (rows x n keys),
    one pass per distinct template, times the number of heads with it. arange(lo, hi) -> 1-D index
    array; head_index(h) -> the h argument of mask_allows; total(bool array) -> Python int."""
    n = tb.n
    rows = rows or max(1, min(n, (1 << 24) // n))
    keys = arange(0, n)[None, :]
    s = 0
    for t in sorted(set(tb.head_templates)):
        h0 = tb.head_templates.index(t)
        heads = tb.head_templates.count(t)
        hh = head_index(h0)
        c = 0
        for r0 in range(0, n, rows):
            c += total(mask_allows(tb, hh, arange(r0, min(n, r0 + rows))[:, None], keys))
        s += heads * c
    return s


# ---------------------------------------------------------------------------------------------
# Self-test (numpy, no torch): the formulation above against a direct transcription of the C++.

class RefMask:
    """MaskContext::template_allows / video_allows, line by line, on the mask dict's lists."""

    def __init__(self, m):
        self.m = m
        self.video = m["video"]

    def template_allows(self, t, i, j):
        m = self.m
        if j == i:
            return True
        a = m["token_image"][i]
        if a < 0:
            return j < i
        hi = m["image_end"][a] if m["bidirectional_images"] else i + 1
        if j >= hi:
            return False
        b = m["token_image"][j]
        if b < 0:
            return True
        sink = m["token_sink"][j] != 0
        if b == a:
            return sink if t == SINK else True
        if t == DENSE:
            return True
        if t == DOCUMENT:
            return False
        return sink

    def video_allows(self, i, j):
        m = self.m
        if self.video == "none" or j == i:
            return True
        a = m["token_image"][i]
        if a < 0 or m["token_image"][j] != a:
            return True
        T = m["image_frame_tokens"][a]
        if T == 0:
            return True
        if j > i:
            return False
        vs = m["image_start"][a]
        fi, si, fj, sj = (i - vs) // T, (i - vs) % T, (j - vs) // T, (j - vs) % T
        W = m["video_window"] if m["video_window"] > 0 else T
        r = m["video_dilation"]
        if self.video == "spatial":
            return fj == 0 or fj == fi
        if self.video == "temporal":
            return fj == 0 or (fj == fi - 1 and sj == si)
        if self.video == "spatial_temporal":
            return fj == 0 or fj == fi or (fj == fi - 1 and sj == si)
        if self.video == "local_window":
            return i - j < W
        if self.video == "atrous":
            return (i - j) % r == 0 and (i - j) // r < W
        return True

    def allows(self, t, i, j):
        return self.template_allows(t, i, j) and self.video_allows(i, j)


def parse_layout(spec):
    """vlsparse's Layout::parse, enough for the golden layouts: [(kind, start, length, tokens per frame)]."""
    segs, pos = [], 0
    for item in spec.split(","):
        kind, rest = item.split(":")
        if "[" in rest:
            rest = rest[:rest.index("[")]
        if kind == "video":
            frames, tpf = (int(x) for x in rest.split("x"))
            segs.append(("video", pos, frames * tpf, tpf))
            pos += frames * tpf
        else:
            segs.append((kind, pos, int(rest), 0))
            pos += int(rest)
    return segs, pos


def make_mask(spec, case="layout", H=1, head_templates=None, sink_fraction=0.1, sink_offsets=(),
              bidirectional=False, video="none", window=0, dilation=1, H_kv=1, d=128):
    """make_mask_context / make_video_mask_context of templates.hpp as a mask dict (allowed_pairs 0)."""
    segs, n = parse_layout(spec)
    ti, ts = [-1] * n, [0] * n
    st, en, ft = [], [], []
    for kind, s, length, tpf in segs:
        if kind == "text":
            continue
        a = len(st)
        st.append(s)
        en.append(s + length)
        ft.append(tpf if kind == "video" else 0)
        for p in range(s, s + length):
            ti[p] = a
        if sink_offsets:
            for off in sink_offsets:
                if off < length:
                    ts[s + off] = 1
        else:
            x = sink_fraction * length
            cnt = min(max(int(math.ceil(x - 1e-9 * max(1.0, x))), 1), length)
            for p in range(s, s + cnt):
                ts[p] = 1
    return {"case": case, "n": n, "H": H, "H_kv": H_kv, "d": d, "token_image": ti, "token_sink": ts,
            "image_start": st, "image_end": en, "image_frame_tokens": ft, "bidirectional_images": bidirectional,
            "video": video, "video_window": window, "video_dilation": dilation,
            "head_templates": list(head_templates or ["Dense"] * H), "allowed_pairs": 0}


def self_test():
    try:
        import numpy as np
    except ImportError:
        print("SKIP: torch_prefill_bench --self-test needs numpy (not importable by this python)", file=sys.stderr)
        return 77  # a skip for Meson's test runner

    passed, failed = 0, 0

    def report(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print(f"FAIL: {what}", file=sys.stderr)

    def np_tables(m):
        return MaskTables(m, lambda lst: np.asarray(lst, dtype=np.int64))

    def np_count(tb, rows=None):
        return count_allowed(tb, lambda lo, hi: np.arange(lo, hi, dtype=np.int64),
                             lambda h: np.int64(h), lambda a: int(np.count_nonzero(a)), rows)

    def np_full(tb, h):
        ix = np.arange(tb.n, dtype=np.int64)
        return np.asarray(make_mask_mod(tb)(np.int64(0), np.int64(h), ix[:, None], ix[None, :]), dtype=bool)

    # 1. Small prompts: every template on some head, random sinks (not only leading ones), both
    #    directionalities, every video mask, window 0 (tokens per frame) and fixed, dilations 1-3.
    rng = np.random.default_rng(7)
    all_heads = ["Dense", "Sink", "Document", "Document-Sink", "Sink", "Dense"]
    layouts = ["text:3,image:9,text:2,image:5,text:1,video:4x6,text:2,image:7,text:3",
               "image:6,video:3x4,video:2x5,text:2",
               "text:5,video:5x3,text:1"]
    configs = []
    for li, spec in enumerate(layouts):
        for bidir in (False, True):
            for video in VIDEO_MASKS:
                for window, dil in ((0, 2), (3, 1), (4, 3)) if video in ("local_window", "atrous") else ((0, 1),):
                    configs.append((li, spec, bidir, video, window, dil))
    for ci, (li, spec, bidir, video, window, dil) in enumerate(configs):
        m = make_mask(spec, case=f"t{ci}", H=len(all_heads), head_templates=all_heads,
                      sink_fraction=0.25, bidirectional=bidir, video=video, window=window, dilation=dil)
        if ci % 3 == 1:  # Gemma-like sinks: scattered, not leading
            m["token_sink"] = [int(a >= 0 and rng.random() < 0.3) for a in m["token_image"]]
        ref = RefMask(m)
        n = m["n"]
        truth = 0
        m = json.loads(json.dumps(m))  # what a file gives
        check_mask(m, f"config {ci}")
        tb = np_tables(m)
        ok = True
        for h, name in enumerate(all_heads):
            t = TEMPLATES[name]
            exp = np.array([[ref.allows(t, i, j) for j in range(n)] for i in range(n)], dtype=bool)
            got = np_full(tb, h)
            truth += int(exp.sum())
            if not np.array_equal(exp, got):
                bad = np.argwhere(exp != got)[0]
                print(f"  config {ci} ({spec}, bidir {bidir}, video {video}, W {window}, r {dil}) head {h} "
                      f"{name}: first difference at (i, j) = ({bad[0]}, {bad[1]}): reference {exp[bad[0], bad[1]]}",
                      file=sys.stderr)
                ok = False
        report(ok, f"config {ci}: numpy mask vs reference transcription")
        report(np_count(tb, rows=5) == truth and np_count(tb) == truth,
               f"config {ci}: chunked pair count {np_count(tb, rows=5)} vs {truth}")
    print(f"self-test: {len(configs)} small prompts x {len(all_heads)} heads, element by element")

    # 2. The check of a file's allowed_pairs: exact count passes, one pair off is caught.
    m = make_mask(layouts[0], case="pairs", H=4, head_templates=["Sink", "Dense", "Sink", "Document"],
                  video="spatial_temporal")
    ref = RefMask(m)
    m["allowed_pairs"] = sum(ref.allows(TEMPLATES[t], i, j) for t in m["head_templates"]
                             for i in range(m["n"]) for j in range(m["n"]))
    report(verify_pairs(m, np_count(np_tables(m)), quiet=True), "verify_pairs accepts the exact count")
    m2 = dict(m, allowed_pairs=m["allowed_pairs"] + 1)
    report(not verify_pairs(m2, np_count(np_tables(m2)), quiet=True), "verify_pairs rejects a count one off")
    for bad_field, bad_value in (("head_templates", ["Dense"] * 3), ("video", "diagonal"),
                                 ("token_sink", [2] * m["n"]), ("image_end", [e + 1 for e in m["image_end"]])):
        try:
            check_mask(dict(m, **{bad_field: bad_value}), "bad")
            report(False, f"check_mask accepted a bad {bad_field}")
        except ValueError:
            report(True, "")

    # 3. The golden masks of the checkout (written by reference/golden_gen.cpp), where present.
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden")
    ngold = 0
    for algo in ("blindsight", "purekv"):
        for man in sorted(glob.glob(os.path.join(root, algo, "*", "manifest.json"))):
            folder = os.path.dirname(man)
            mf, af = os.path.join(folder, "masks.npy"), os.path.join(folder, "allowed_pairs.npy")
            if not (os.path.exists(mf) and os.path.exists(af)):
                continue
            with open(man) as f:
                g = json.load(f)
            p = g["params"]
            masks, pairs = np.load(mf), np.load(af)
            name = f"golden/{algo}/{os.path.basename(folder)}"
            if algo == "blindsight":
                heads = ["Dense", "Sink", "Document", "Document-Sink"]
                mm = make_mask(g["layout"], H=4, head_templates=heads, sink_fraction=p.get("sink_fraction", 0.1),
                               sink_offsets=p.get("sink_offsets") or (),
                               bidirectional=bool(p.get("bidirectional_images", False)))
                tb = np_tables(mm)
                for h in range(4):
                    got = np_full(tb, h)
                    report(np.array_equal(got, masks[h].astype(bool)) and int(got.sum()) == int(pairs[h]),
                           f"{name}: template {heads[h]}")
                    ngold += 1
            else:
                for v, kind in enumerate(VIDEO_MASKS[1:]):
                    mm = make_mask(g["layout"], video=kind, window=int(p.get("st_window", 0)),
                                   dilation=int(p.get("st_dilation", 1)))
                    got = np_full(np_tables(mm), 0)
                    report(np.array_equal(got, masks[v].astype(bool)) and int(got.sum()) == int(pairs[v]),
                           f"{name}: video mask {kind}")
                    ngold += 1
    print(f"self-test: {ngold} golden masks" + ("" if ngold else " (none found: golden/ absent)"))
    print(f"self-test: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def verify_pairs(m, counted, quiet=False):
    if counted == m["allowed_pairs"]:
        return True
    if not quiet:
        print(f"torch_prefill_bench: ERROR: mask {m.get('_path', m['case'])} (case {m['case']}, n {m['n']}): "
              f"the FlexAttention mask_mod allows {counted} (query, key) pairs over the {m['H']} heads, the file "
              f"says allowed_pairs = {m['allowed_pairs']} (difference {counted - m['allowed_pairs']:+d}); the two "
              "benchmarks would not time the same mask", file=sys.stderr)
    return False


# ---------------------------------------------------------------------------------------------
# The benchmark.

def first_line(e, limit=100):
    s = str(e).strip().splitlines()
    return (type(e).__name__ + ": " + (s[0] if s else ""))[:limit]


def raise_recompile_limits(torch):
    """One compiled flex graph per (mask, n): past the default limits dynamo would fall back to eager
    flex, which materializes the n x n scores."""
    cfg = torch._dynamo.config
    for name, v in (("cache_size_limit", 512), ("recompile_limit", 512), ("accumulated_cache_size_limit", 4096),
                    ("accumulated_recompile_limit", 4096)):
        try:
            if hasattr(cfg, name):
                setattr(cfg, name, max(int(getattr(cfg, name)), v))
        except Exception:
            pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--masks", default="", help="folder of mask JSON files written by cuda_prefill_bench")
    ap.add_argument("--n", type=int_list, default=[8192, 16384, 32768])
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default="-", help="CSV path, or - for stdout")
    ap.add_argument("--append", action="store_true", help="append rows (no header) to --out")
    ap.add_argument("--flush-mib", type=int, default=256)
    ap.add_argument("--cases", type=name_list, default=None,
                    help="only these cases (comma-separated: dense_causal, zipvl_keep50, mask cases)")
    ap.add_argument("--H", type=int, default=28)
    ap.add_argument("--H-kv", dest="H_kv", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--self-test", action="store_true", help="check the mask formulation with numpy and exit")
    ap.add_argument("--no-flex-dense", action="store_true",
                    help="no FlexAttention for the dense causal case (its block mask takes minutes to build at 16K+)")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    if a.reps < 1 or a.warmup < 0:
        ap.error("--reps must be >= 1 and --warmup >= 0")
    if a.H <= 0 or a.H_kv <= 0 or a.d <= 0 or a.H % a.H_kv:
        ap.error(f"--H {a.H} must be a positive multiple of --H-kv {a.H_kv}; --d positive")

    try:
        masks = load_masks(a.masks) if a.masks else []
    except (OSError, ValueError) as e:
        print(f"torch_prefill_bench: {e}", file=sys.stderr)
        return 1
    wanted = set(a.cases) if a.cases else None

    def want(case):
        return wanted is None or case in wanted

    unused = [m["_path"] for m in masks if m["n"] not in a.n]
    if unused:
        print(f"torch_prefill_bench: {len(unused)} mask file(s) with an n not in --n, skipped", file=sys.stderr)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    raise_recompile_limits(torch)
    dev = torch.device("cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    flush = torch.empty(a.flush_mib << 20, dtype=torch.uint8, device=dev)

    f = sys.stdout if a.out == "-" else open(a.out, "a" if a.append else "w", newline="")
    w = csv.writer(f)
    if not a.append or a.out == "-":
        w.writerow(COLUMNS)

    def emit(*row, **kw):
        w.writerow(csv_row(*row, **kw))
        f.flush()

    def timed(fn):
        ts = []
        for r in range(a.warmup + a.reps):
            flush.fill_(r & 0xFF)
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            if r >= a.warmup:
                ts.append(e0.elapsed_time(e1) * 1000.0)
        return statistics.median(ts)

    def block_mask(mask_mod, H, n):
        """create_block_mask compiled (no n x n mask in memory), its build time in ms."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            bm = create_block_mask(mask_mod, B=None, H=H, Q_LEN=n, KV_LEN=n, device=dev, BLOCK_SIZE=FLEX_BLOCK,
                                   _compile=True)
        except TypeError:  # a torch without _compile: compile the builder instead
            bm = torch.compile(create_block_mask)(mask_mod, None, H, n, n, device=dev, BLOCK_SIZE=FLEX_BLOCK)
        torch.cuda.synchronize()
        return bm, (time.perf_counter() - t0) * 1000.0

    def flex_note(bm, build_ms):
        try:
            sp = f"block sparsity {float(bm.sparsity()):.1f}%"
        except Exception:
            sp = "block sparsity ?"
        return f"{sp} (BLOCK_SIZE {FLEX_BLOCK}), block mask built in {build_ms:.0f} ms with its compilation (not timed)"

    def run_flex(case, q, k, v, mask_mod, Hmask, H, Hkv, d, n, pairs, extra=""):
        try:
            bm, build_ms = block_mask(mask_mod, Hmask, n)
            t = timed(lambda: flex(q, k, v, block_mask=bm, enable_gqa=True))
            emit("flex", case, H, Hkv, d, n, t, pairs, "compiled, enable_gqa; " + extra + flex_note(bm, build_ms))
        except Exception as e:  # compile errors, out of memory, refused shapes
            emit("flex", case, H, Hkv, d, n, None, pairs, "failed: " + first_line(e))

    status = 0
    for n in a.n:
        n_masks = [m for m in masks if m["n"] == n and want(m["case"])]
        shapes = [(a.H, a.H_kv, a.d)]
        for m in n_masks:
            if (m["H"], m["H_kv"], m["d"]) not in shapes:
                shapes.append((m["H"], m["H_kv"], m["d"]))
        inputs = {}

        def qkv(H, Hkv, d):
            if (H, Hkv, d) not in inputs:
                g = torch.Generator(device=dev)
                g.manual_seed(n * 1000003 + H * 1009 + Hkv * 31 + d)
                inputs[(H, Hkv, d)] = tuple(
                    torch.randn(1, h, n, d, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16)
                    for h in (H, Hkv, Hkv))
            return inputs[(H, Hkv, d)]

        # Dense causal: the CLI shape, and every shape a mask of this n uses.
        if want(DENSE_CASE):
            for H, Hkv, d in shapes:
                q, k, v = qkv(H, Hkv, d)
                pairs = causal_pairs(H, n)
                for impl, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                      ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            t = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
                        emit(impl, DENSE_CASE, H, Hkv, d, n, t, pairs, "is_causal, enable_gqa")
                    except RuntimeError as e:
                        emit(impl, DENSE_CASE, H, Hkv, d, n, None, pairs, "unsupported: " + first_line(e))

                def causal(b, h, q_idx, kv_idx):
                    return q_idx >= kv_idx

                if not a.no_flex_dense:
                    run_flex(DENSE_CASE, q, k, v, causal, None, H, Hkv, d, n, pairs)

        # The masks of this n: check the mask_mod's pair count against the file, then time Flex.
        for m in n_masks:
            H, Hkv, d = m["H"], m["H_kv"], m["d"]
            tb = MaskTables(m, lambda lst: torch.tensor(lst, dtype=torch.int32, device=dev))
            t0 = time.perf_counter()
            counted = count_allowed(tb, lambda lo, hi: torch.arange(lo, hi, device=dev, dtype=torch.int64),
                                    lambda h: torch.tensor(h, device=dev, dtype=torch.int64),
                                    lambda x: int(x.sum(dtype=torch.int64).item()))
            check_s = time.perf_counter() - t0
            if not verify_pairs(m, counted):
                status = 1
                break
            print(f"torch_prefill_bench: {m['case']} n {n}: mask_mod allows {counted} pairs = allowed_pairs "
                  f"({check_s:.1f} s)", file=sys.stderr)
            q, k, v = qkv(H, Hkv, d)

            mask_mod = make_mask_mod(tb)
            Hmask = None if len(set(tb.head_templates)) == 1 else H
            frac = m["allowed_pairs"] / causal_pairs(H, n)
            run_flex(m["case"], q, k, v, mask_mod, Hmask, H, Hkv, d, n, m["allowed_pairs"],
                     f"allowed pairs checked, {frac * 100:.1f}% of causal, video {m['video']}; ")
            del tb
        if status:
            break

        # ZipVL: gather the kept rows, SDPA cuDNN causal over them, scatter back.
        if want(ZIPVL_CASE):
            H, Hkv, d = a.H, a.H_kv, a.d
            q, k, v = qkv(H, Hkv, d)
            mk = max(1, n // 2)
            gen = torch.Generator()
            gen.manual_seed(1)
            idx = torch.cat([torch.randperm(n - 1, generator=gen)[:mk - 1], torch.tensor([n - 1])])
            idx = idx.sort().values.to(dev)
            pairs = causal_pairs(H, mk)
            note = f"kept {mk} of {n} (randperm seed 1, last kept)"

            def gather_sdpa():
                qg, kg, vg = q.index_select(2, idx), k.index_select(2, idx), v.index_select(2, idx)
                og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)
                out = torch.zeros_like(q)
                out.index_copy_(2, idx, og)
                return out

            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t = timed(gather_sdpa)
                emit("gather_sdpa", ZIPVL_CASE, H, Hkv, d, n, t, pairs,
                     note + "; index_select + SDPA cuDNN causal + zeros + index_copy_")
            except RuntimeError as e:
                emit("gather_sdpa", ZIPVL_CASE, H, Hkv, d, n, None, pairs, "unsupported: " + first_line(e))
            try:
                qg, kg, vg = q.index_select(2, idx), k.index_select(2, idx), v.index_select(2, idx)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t = timed(lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True))
                emit("sdpa_cudnn_gathered", ZIPVL_CASE, H, Hkv, d, n, t, pairs,
                     note + "; SDPA cuDNN causal alone on rows gathered beforehand")
                del qg, kg, vg
            except RuntimeError as e:
                emit("sdpa_cudnn_gathered", ZIPVL_CASE, H, Hkv, d, n, None, pairs, "unsupported: " + first_line(e))
        inputs.clear()
        torch.cuda.empty_cache()
    if wanted:
        seen = {DENSE_CASE, ZIPVL_CASE} | {m["case"] for m in masks}
        missing = sorted(wanted - seen)
        if missing:
            print(f"torch_prefill_bench: --cases names no known case: {', '.join(missing)}", file=sys.stderr)
    if f is not sys.stdout:
        f.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
