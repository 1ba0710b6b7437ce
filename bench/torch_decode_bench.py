#!/usr/bin/env python3
"""PyTorch baselines for GPU decode attention: the other half of bench/cuda_decode_bench.cu.

Per (dtype, B, n): one decode step, q [B, H, 1, d] against a KV cache K, V [B, H_kv, n, d] (GQA),
timed with CUDA events after a 512 MiB read that evicts the L2 (--flush write: a fill instead), median of --reps calls after
--warmup calls:

  sdpa              dense decode: scaled_dot_product_attention(q, k, v, enable_gqa=True) under
                    sdpa_kernel(backend), backend = cudnn, flash, efficient (one at a time);
  sdpa (backend/packed)  the same with the G = H / H_kv query heads of a KV head folded into the
                    query length (q [B, H_kv, G, d], no mask): identical maths, no enable_gqa, so it
                    runs on backends that refuse GQA;
  flex              FlexAttention (flex_attention compiled per shape, enable_gqa=True, a full block
                    mask made once per shape, not timed), dense;
  sdpa_pregathered  SDPA over K/V holding only the listed rows (m = frac * n per sequence, gathered
                    beforehand, gather not timed);
  gather_sdpa       index_select of the listed rows of K and V, then SDPA, timed together;
  copy              a device-to-device copy of a 1 GiB buffer (bytes read + written), this run's
                    bandwidth yardstick.

The lists are shaped like bench/bench_util.hpp's avl_shaped_rows (the last 10% of the rows, the
rest scattered at random; one list per sequence, shared by the KV heads). Bytes counted: the K and V
rows used (B * H_kv * rows * d * 2 * element size) plus q and the output. A backend that refuses a
shape is recorded with an empty time and "unsupported: <reason>" in its note. Combinations needing
more than --max-gib of device memory are skipped.

CSV (--out): impl,backend,dtype,B,H,H_kv,d,n,frac,P,time_us,bytes,GBps,note (P empty: no paging;
frac 1 for dense), the columns cuda_decode_bench writes; bench/cuda_decode_report.py joins the two.

  python3 bench/torch_decode_bench.py --out torch.csv            # the default grid, bf16
  python3 bench/torch_decode_bench.py --dtype fp16 --batch 1,32 --n 16384 --frac 0.3 --out t.csv --append
  python3 bench/torch_decode_bench.py --dry-run                  # the grid and its memory, no torch needed
"""
import argparse
import csv
import math
import os
import statistics
import sys
import time
import warnings

CSV_COLUMNS = ["impl", "backend", "dtype", "B", "H", "H_kv", "d", "n", "frac", "P", "time_us", "bytes", "GBps",
               "note"]
ELEM_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
BACKENDS = ["cudnn", "flash", "efficient"]
GIB = float(1 << 30)


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")
    if not v or any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return v


def frac_list(s):
    try:
        v = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions, got {s!r}")
    if any(not (0.0 < x <= 1.0) for x in v):
        raise argparse.ArgumentTypeError(f"fractions must lie in (0, 1], got {s!r}")
    return v


def dtype_list(s):
    v = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in v if x not in ELEM_SIZE]
    if not v or bad:
        raise argparse.ArgumentTypeError(f"dtypes: bf16, fp16, fp32 (comma-separated), got {s!r}")
    return v


def name_list(choices):
    def parse(s):
        v = [x.strip() for x in s.split(",") if x.strip()]
        bad = [x for x in v if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}; got {', '.join(bad)}")
        return v
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch decode-attention baselines (SDPA cuDNN / flash / efficient, "
                                "FlexAttention, gather + SDPA) on the grid of cuda_decode_bench; CSV for "
                                "bench/cuda_decode_report.py.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int_list, default="1,8,32", help="batch sizes B")
    p.add_argument("--n", type=int_list, default="4096,16384,65536,131072", help="cached rows per sequence")
    p.add_argument("--frac", type=frac_list, default="0.1,0.3,0.5", help="listed fractions of the rows")
    p.add_argument("--dtype", type=dtype_list, default="bf16", help="element types: bf16, fp16, fp32")
    p.add_argument("--heads", type=int, default=32, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads H_kv (H must be a multiple)")
    p.add_argument("--head-dim", type=int, default=128, help="head dim d")
    p.add_argument("--layout", choices=["hnd", "nhd"], default="hnd",
                   help="K/V storage: hnd = contiguous [B, H_kv, n, d]; nhd = [B, n, H_kv, d] seen as [B, H_kv, n, d]")
    p.add_argument("--backends", type=name_list(BACKENDS), default=",".join(BACKENDS), help="SDPA backends to try")
    p.add_argument("--no-packed", action="store_true", help="skip the GQA-packed SDPA variant")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    p.add_argument("--reps", type=int, default=31, help="timed calls per measurement (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before the timed ones")
    p.add_argument("--flush-mib", type=int, default=512, help="L2 flush buffer size (MiB)")
    p.add_argument("--flush", choices=["read", "write"], default="read",
                   help="empty the L2 before each timed call by writing the flush buffer (dirty lines: the timed "
                        "call pays their write-back) or by reading it (clean lines)")
    p.add_argument("--copy-gib", type=float, default=1.0, help="buffer size of the copy-bandwidth measurement")
    p.add_argument("--max-gib", type=float, default=60.0, help="skip combinations needing more device memory")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="", help="CSV file to write (nothing written when empty)")
    p.add_argument("--append", action="store_true", help="append to --out (no header) instead of overwriting")
    p.add_argument("--dry-run", action="store_true", help="print the grid and each combination's memory; no torch")
    p.add_argument("--quiet", action="store_true", help="only the final table on stdout")
    a = p.parse_args(argv)
    if a.heads <= 0 or a.kv_heads <= 0 or a.head_dim <= 0 or a.heads % a.kv_heads:
        p.error(f"--heads ({a.heads}) must be a positive multiple of --kv-heads ({a.kv_heads})")
    if a.reps < 1 or a.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    return a


def listed_rows(n, frac):
    """Rows in an avl_shaped_rows list of n rows at this fraction: max(int(frac * n), n // 10)."""
    return max(int(frac * n), n // 10)


def combo_bytes(a, dtype, B, n):
    """Peak device bytes of one (dtype, B, n): the dense K and V, then for the largest list its
    pre-gathered K and V and the gather's output, q/out, the flush buffer."""
    e = ELEM_SIZE[dtype]
    row = B * a.kv_heads * a.head_dim * e  # one row of K (or V) across the batch and KV heads
    m = max((listed_rows(n, f) for f in a.frac), default=0)
    qo = 2 * B * a.heads * a.head_dim * e
    return 2 * row * n + 4 * row * m + qo + (a.flush_mib << 20) + 64 * (1 << 20)


def grid(a):
    """[(dtype, B, n, needed_bytes, fits)] in run order."""
    out = []
    for dt in a.dtype:
        for B in a.batch:
            for n in a.n:
                need = combo_bytes(a, dt, B, n)
                out.append((dt, B, n, need, need <= a.max_gib * GIB))
    return out


def kv_bytes(a, dtype, B, rows):
    e = ELEM_SIZE[dtype]
    return B * a.kv_heads * rows * a.head_dim * 2 * e + 2 * B * a.heads * a.head_dim * e


def fmt_frac(f):
    return f"{f:g}"


def short_error(e, limit=90):
    s = " ".join(str(e).split())
    if not s:
        s = type(e).__name__
    return s[:limit]


class Writer:
    def __init__(self, path, append):
        self.rows = []
        self.f = None
        if path:
            new = not (append and os.path.exists(path) and os.path.getsize(path) > 0)
            self.f = open(path, "a" if append else "w", newline="")
            self.w = csv.writer(self.f)
            if new:
                self.w.writerow(CSV_COLUMNS)

    def row(self, **kw):
        r = {c: kw.get(c, "") for c in CSV_COLUMNS}
        self.rows.append(r)
        if self.f:
            self.w.writerow([r[c] for c in CSV_COLUMNS])
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def dry_run(a):
    g = grid(a)
    print(f"grid: dtype {','.join(a.dtype)} x B {','.join(map(str, a.batch))} x n {','.join(map(str, a.n))}; "
          f"H={a.heads} H_kv={a.kv_heads} d={a.head_dim} layout={a.layout}; lists {','.join(map(fmt_frac, a.frac))}")
    print(f"per combination: SDPA dense x {len(a.backends)} backend(s)"
          f"{'' if a.no_packed else ' (+ GQA-packed)'}{'' if a.no_flex else ', FlexAttention'}; per list: "
          f"pre-gathered SDPA and gather + SDPA per backend; {a.warmup} warm-up + {a.reps} timed calls each")
    print(f"{'dtype':5} {'B':>3} {'n':>7} {'need GiB':>9}  run")
    for dt, B, n, need, fits in g:
        print(f"{dt:5} {B:>3} {n:>7} {need / GIB:9.2f}  {'yes' if fits else f'skip (> {a.max_gib:g} GiB)'}")
    runs = sum(1 for x in g if x[4])
    print(f"{runs} of {len(g)} combinations run")
    return 0


# ------------------------------------------------------------------------------------------------
# Everything below needs torch (imported only when measuring).
# ------------------------------------------------------------------------------------------------

def measure(a):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        print("torch_decode_bench: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    dev_name = props.name
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    backend_enum = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}
    H, Hkv, d = a.heads, a.kv_heads, a.head_dim
    G = H // Hkv
    out = Writer(a.out, a.append)
    say = (lambda *x: None) if a.quiet else (lambda *x: print(*x, flush=True))

    flush = torch.zeros(a.flush_mib << 20, dtype=torch.uint8, device=dev)
    flush_words = flush.view(torch.int32)
    ev0 = torch.cuda.Event(enable_timing=True)
    ev1 = torch.cuda.Event(enable_timing=True)

    def median_us(fn):
        for r in range(a.warmup):
            fn()
        t = []
        for r in range(a.reps):
            if a.flush == "read":
                flush_words.max()  # a read of the whole buffer; one value written
            else:
                flush.fill_(r & 0xff)
            ev0.record()
            fn()
            ev1.record()
            ev1.synchronize()
            t.append(ev0.elapsed_time(ev1) * 1e3)
        return statistics.median(t)

    # Device copy bandwidth, this run's yardstick.
    nbytes = int(a.copy_gib * GIB)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    t_copy = median_us(lambda: dst.copy_(src))
    copy_gbps = 2.0 * nbytes / (t_copy * 1e-6) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    out.row(impl="copy", backend="device", n=nbytes, time_us=f"{t_copy:.3f}", bytes=2 * nbytes,
            GBps=f"{copy_gbps:.1f}", note=dev_name)
    print(f"torch_decode_bench: {dev_name}, {props.multi_processor_count} SMs; torch {torch.__version__}; "
          f"device copy bandwidth {copy_gbps:.0f} GB/s (read + write)", flush=True)

    flex = None
    flex_note = ""
    flex_failures = 0
    if not a.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            for attr in ("recompile_limit", "cache_size_limit"):  # many shapes: keep compiling, never fall back
                if hasattr(torch._dynamo.config, attr):
                    setattr(torch._dynamo.config, attr, 256)
            # One static compilation per shape. With no block_mask, flex makes one "block" of all the
            # KV rows and its decode kernel barely splits them (H100, B = 1, n = 16384: 580 us against
            # 48 us with a full block mask of 128-row blocks), so a full mask is made once per shape.
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001 -- record and go on
            flex_note = "flex unavailable: " + short_error(e)
            print(flex_note, flush=True)

    rng = np.random.default_rng(a.seed)
    summary = []  # (dtype, B, n, label, time_us or None)

    def record(impl, backend, dt, B, n, frac, rows, fn, note=""):
        byt = kv_bytes(a, dt, B, rows)
        base = dict(impl=impl, backend=backend, dtype=dt, B=B, H=H, H_kv=Hkv, d=d, n=n, frac=fmt_frac(frac),
                    bytes=byt)
        extra = f"layout={a.layout}" + (f"; {note}" if note else "")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                t = median_us(fn)
                err = None
            except Exception as e:  # noqa: BLE001 -- a backend refusing a shape is a result
                err = e
        if err is not None:
            torch.cuda.synchronize()
            # SDPA says why in warnings ("... not used because:" + the reason); keep the reason.
            why = [str(w.message) for w in caught if "not used because" not in str(w.message)
                   and "runtime disabled" not in str(w.message)]
            reason = short_error(why[0] if why else err)
            out.row(**base, note=f"{extra}; unsupported: {reason}")
            say(f"  {impl:17} {backend:16} frac {fmt_frac(frac):>4}  unsupported ({reason[:70]})")
            summary.append((dt, B, n, impl, backend, frac, None))
            return None
        gbps = byt / (t * 1e-6) / 1e9
        out.row(**base, time_us=f"{t:.3f}", GBps=f"{gbps:.1f}", note=extra)
        say(f"  {impl:17} {backend:16} frac {fmt_frac(frac):>4}  {t:9.1f} us  {gbps:6.0f} GB/s  "
            f"{100 * gbps / copy_gbps:3.0f}% of copy bw")
        summary.append((dt, B, n, impl, backend, frac, t))
        return t

    def sdpa_calls(q, qp, k, v):
        """(backend label, callable) for each backend, enable_gqa and packed."""
        calls = []
        for b in a.backends:
            be = backend_enum[b]

            def gqa(be=be, q=q, k=k, v=v):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            calls.append((b, gqa))
            if not a.no_packed and G > 1:
                def packed(be=be, qp=qp, k=k, v=v):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(qp, k, v)
                calls.append((b + "/packed", packed))
        return calls

    def alloc_kv(shape_hnd, dt, gen):
        B_, Hkv_, n_, d_ = shape_hnd
        if a.layout == "hnd":
            return torch.randn(shape_hnd, dtype=torch_dtype[dt], device=dev, generator=gen)
        return torch.randn((B_, n_, Hkv_, d_), dtype=torch_dtype[dt], device=dev, generator=gen).transpose(1, 2)

    for dt, B, n, need, fits in grid(a):
        label = f"{dt} B={B} n={n}"
        if not fits:
            print(f"{label}: skipped, needs {need / GIB:.1f} GiB > --max-gib {a.max_gib:g}", flush=True)
            continue
        say(f"{label} (H={H} H_kv={Hkv} d={d}, layout {a.layout})")
        gen = torch.Generator(device=dev)
        gen.manual_seed(a.seed + B * 1000003 + n)
        try:
            k = alloc_kv((B, Hkv, n, d), dt, gen)
            v = alloc_kv((B, Hkv, n, d), dt, gen)
            q = torch.randn((B, H, 1, d), dtype=torch_dtype[dt], device=dev, generator=gen)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{label}: skipped, out of memory ({short_error(e, 60)})", flush=True)
            torch.cuda.empty_cache()
            continue
        qp = q.view(B, Hkv, G, d)  # the G query heads of a KV head as G query positions (GQA packing)

        # Dense decode.
        for backend, fn in sdpa_calls(q, qp, k, v):
            record("sdpa", backend, dt, B, n, 1.0, n, fn)
        if flex is not None:
            try:
                full = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx >= 0, None, None, 1, n, device=dev)
                flex(q, k, v, block_mask=full, enable_gqa=True)  # compile (untimed)
                torch.cuda.synchronize()
                flex_failures = 0
            except Exception as e:  # noqa: BLE001 -- record the error and go on
                flex_failures += 1
                out.row(impl="flex", backend="compiled", dtype=dt, B=B, H=H, H_kv=Hkv, d=d, n=n, frac="1",
                        bytes=kv_bytes(a, dt, B, n), note=f"layout={a.layout}; unsupported: {short_error(e)}")
                print(f"  flex: failed ({short_error(e, 80)})", flush=True)
                summary.append((dt, B, n, "flex", "compiled", 1.0, None))
                if flex_failures >= 2:  # each failing compile costs time: stop trying
                    flex, flex_note = None, "flex disabled after two failures: " + short_error(e, 60)
            else:
                record("flex", "compiled", dt, B, n, 1.0, n, lambda: flex(q, k, v, block_mask=full, enable_gqa=True),
                       note="full block mask")
                del full
        elif flex_note:
            out.row(impl="flex", backend="compiled", dtype=dt, B=B, H=H, H_kv=Hkv, d=d, n=n, frac="1",
                    bytes=kv_bytes(a, dt, B, n), note=f"layout={a.layout}; unsupported: {flex_note}")

        # Lists: pre-gathered SDPA, and gather + SDPA. K and V as a table of rows, gathered by one
        # index_select each: hnd, rows of d elements indexed (b, g, t); nhd, rows of H_kv * d, (b, t).
        if a.layout == "hnd":
            k_rows, v_rows = k.reshape(B * Hkv * n, d), v.reshape(B * Hkv * n, d)
        else:
            k_rows, v_rows = k.transpose(1, 2).reshape(B * n, Hkv * d), v.transpose(1, 2).reshape(B * n, Hkv * d)
        tail = n // 10
        for frac in a.frac:
            m = listed_rows(n, frac)
            lists = []
            for _ in range(B):  # avl_shaped_rows: the last 10% of the rows, the rest scattered; sorted
                extra = rng.choice(n - tail, size=m - tail, replace=False) if m > tail else np.empty(0, np.int64)
                lists.append(np.sort(np.concatenate([extra, np.arange(n - tail, n)])).astype(np.int64))
            rows = torch.from_numpy(np.stack(lists)).to(dev)  # [B, m]
            if a.layout == "hnd":
                b_idx = torch.arange(B, device=dev).view(B, 1, 1)
                g_idx = torch.arange(Hkv, device=dev).view(1, Hkv, 1)
                flat = ((b_idx * Hkv + g_idx) * n + rows.view(B, 1, m)).reshape(-1)

                def gathered(flat=flat, m=m):
                    return (k_rows.index_select(0, flat).view(B, Hkv, m, d),
                            v_rows.index_select(0, flat).view(B, Hkv, m, d))
            else:
                flat = (torch.arange(B, device=dev).view(B, 1) * n + rows).reshape(-1)

                def gathered(flat=flat, m=m):
                    return (k_rows.index_select(0, flat).view(B, m, Hkv, d).transpose(1, 2),
                            v_rows.index_select(0, flat).view(B, m, Hkv, d).transpose(1, 2))
            kg, vg = gathered()
            for backend, fn in sdpa_calls(q, qp, kg, vg):
                record("sdpa_pregathered", backend, dt, B, n, frac, m, fn)
            del kg, vg
            for backend, fn in sdpa_calls(q, qp, None, None):
                def gather_then(fn=fn, gathered=gathered):
                    kk, vv = gathered()
                    return fn(k=kk, v=vv)
                record("gather_sdpa", backend, dt, B, n, frac, m, gather_then)
            del rows, flat, gathered
        del k, v, q, qp, k_rows, v_rows
        torch.cuda.empty_cache()

    out.close()
    print_table(summary, a, copy_gbps, dev_name)
    return 0


def print_table(summary, a, copy_gbps, dev_name):
    """Compact stdout table: per (dtype, B, n), dense SDPA per backend, flex, and per list the best
    pre-gathered SDPA and the best gather + SDPA (microseconds)."""
    if not summary:
        return
    keys = []
    by = {}
    for dt, B, n, impl, backend, frac, t in summary:
        if (dt, B, n) not in by:
            keys.append((dt, B, n))
            by[(dt, B, n)] = {}
        by[(dt, B, n)][(impl, backend, fmt_frac(frac))] = t

    def cell(t):
        return "-" if t is None else f"{t:.1f}"

    def best(d, impl, frac):
        c = [(t, b) for (i, b, f), t in d.items() if i == impl and f == frac and t is not None]
        return min(c) if c else (None, "")

    cols = [f"sdpa {b}" for b in a.backends] + ([] if a.no_flex else ["flex"])
    fr = [fmt_frac(f) for f in a.frac]
    head = ["dtype", "B", "n"] + cols + [f"pregath {f}" for f in fr] + [f"gath+sdpa {f}" for f in fr]
    print(f"\ntimes in us ({dev_name}; copy {copy_gbps:.0f} GB/s); dense: enable_gqa, else the packed variant (*); "
          "lists: best backend")
    print(" | ".join(head))
    for key in keys:
        d = by[key]
        cells = [key[0], str(key[1]), str(key[2])]
        for b in a.backends:
            t = d.get(("sdpa", b, "1"))
            if t is None and d.get(("sdpa", b + "/packed", "1")) is not None:
                cells.append(cell(d[("sdpa", b + "/packed", "1")]) + "*")
            else:
                cells.append(cell(t))
        if not a.no_flex:
            cells.append(cell(d.get(("flex", "compiled", "1"))))
        for f in fr:
            cells.append(cell(best(d, "sdpa_pregathered", f)[0]))
        for f in fr:
            cells.append(cell(best(d, "gather_sdpa", f)[0]))
        print(" | ".join(cells))


def main(argv=None):
    a = parse_args(argv)
    if a.dry_run:
        return dry_run(a)
    t0 = time.time()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"torch_decode_bench: PyTorch is needed to measure ({e}); --dry-run lists the grid without it",
              file=sys.stderr)
        return 2
    rc = measure(a)
    print(f"torch_decode_bench: done in {time.time() - t0:.0f} s" + (f", CSV: {a.out}" if a.out else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
