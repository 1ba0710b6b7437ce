#!/usr/bin/env python3
"""PyTorch baselines for GPU selection: the other half of bench/cuda_select_bench.cu.

Per n (bf16, H = 28, H_kv = 4, d = 128, batch 1, one layer), timed with CUDA events after a write
that evicts the L2, median of --reps calls after --warmup calls:

  cudnn_prefill     dense causal prefill of the layer: scaled_dot_product_attention(q, k, v,
                    is_causal=True, enable_gqa=True) under sdpa_kernel(CUDNN_ATTENTION), q [1, H, n, d],
                    k, v [1, H_kv, n, d]: the attention the selection is meant to save;
  flash_prefill     the same under the flash backend (FlashAttention-2);
  zipvl_torch_ops   ZipVL's selection the way a PyTorch user writes it: 64 recent + 64 random probe
                    rows gathered, their logits against every key per KV-head group (one batched
                    matmul, no K copy), the causal mask, softmax in fp32, sums over heads and probes,
                    normalization by n - j, sort + cumulative sum for the adaptive count p (tau 0.975:
                    one host synchronization, as the count decides the top-k size), top-k of the
                    normalized scores, the kept positions sorted.

The inputs are drawn like cuda_select_bench's (uniform [-1, 1], every 97th key row scaled by 3);
not the same values, the same distribution.

CSV (--out, --append): impl,policy,dtype,H,H_kv,d,n,time_us,kept,p,note, the columns of
cuda_select_bench; bench/cuda_select_report.py joins the two.

  python3 bench/torch_select_bench.py --out select.csv --append
  python3 bench/torch_select_bench.py --n 8192,16384 --reps 11
"""
import argparse
import csv
import statistics
import sys

COLUMNS = ["impl", "policy", "dtype", "H", "H_kv", "d", "n", "time_us", "kept", "p", "note"]


def int_list(s):
    v = [int(x) for x in s.split(",") if x.strip()]
    if not v or any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int_list, default=[8192, 16384, 32768, 131072])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default="-")
    ap.add_argument("--append", action="store_true", help="append rows (no header) to --out")
    ap.add_argument("--flush-mib", type=int, default=256)
    a = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda")
    H, Hkv, d, G = 28, 4, 128, 7
    tau, recent, random_n = 0.975, 64, 64
    flush = torch.empty(a.flush_mib << 20, dtype=torch.uint8, device=dev)

    f = sys.stdout if a.out == "-" else open(a.out, "a" if a.append else "w", newline="")
    w = csv.writer(f)
    if not a.append or a.out == "-":
        w.writerow(COLUMNS)

    def timed(fn):
        ts = []
        for r in range(a.warmup + a.reps):
            flush.fill_(r & 0xFF)
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            res = fn()
            e1.record()
            e1.synchronize()
            if r >= a.warmup:
                ts.append(e0.elapsed_time(e1) * 1000.0)
        return statistics.median(ts), res

    for n in a.n:
        g = torch.Generator(device=dev)
        g.manual_seed(n)
        q = (torch.rand(1, H, n, d, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        k = torch.rand(1, Hkv, n, d, device=dev, generator=g) * 2 - 1
        k[:, :, ::97, :] *= 3
        k = k.to(torch.bfloat16)
        v = (torch.rand(1, Hkv, n, d, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)

        for name, backend in (("cudnn_prefill", SDPBackend.CUDNN_ATTENTION), ("flash_prefill", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    t, _ = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
                w.writerow(["torch", name, "bf16", H, Hkv, d, n, f"{t:.2f}", "1", n, "dense causal, enable_gqa"])
            except RuntimeError as e:
                w.writerow(["torch", name, "bf16", H, Hkv, d, n, "", "", "", "unsupported: " + str(e).splitlines()[0][:80]])
            f.flush()

        # ZipVL's selection with PyTorch ops.
        gen = torch.Generator()
        gen.manual_seed(1)
        rand = torch.randperm(n - recent, generator=gen)[:random_n]
        probes = torch.cat([rand.sort().values, torch.arange(n - recent, n)]).to(dev)
        P = probes.numel()
        scale = d ** -0.5
        cols = torch.arange(n, device=dev)
        nnz = (n - cols).float()

        def select():
            qp = q[0][:, probes, :]                                  # [H, P, d]
            qg = qp.view(Hkv, G * P, d)                              # heads of a group share a KV head
            logits = torch.matmul(qg, k[0].transpose(1, 2)).float() * scale   # [H_kv, G * P, n]
            logits = logits.view(Hkv, G, P, n)
            logits = logits.masked_fill(cols[None, None, None, :] > probes[None, None, :, None], float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            acc = probs.sum(dim=(0, 1, 2))                           # [n]
            norm = acc / nnz
            sa = torch.sort(acc, descending=True).values
            cum = torch.cumsum(sa.double(), 0)
            p = int(torch.searchsorted(cum, torch.tensor([tau * H * P], dtype=torch.float64, device=dev)).item()) + 1
            p = min(p, n)
            kept = torch.topk(norm, p).indices.sort().values
            return p, kept

        try:
            t, (p, kept) = timed(select)
            w.writerow(["torch", "zipvl_torch_ops", "bf16", H, Hkv, d, n, f"{t:.2f}", f"{kept.numel() / n:.4f}", p,
                        "probes 64+64 layer-wise tau 0.975"])
        except RuntimeError as e:  # e.g. out of memory at the largest n
            w.writerow(["torch", "zipvl_torch_ops", "bf16", H, Hkv, d, n, "", "", "", "failed: " + str(e).splitlines()[0][:80]])
        f.flush()
        del q, k, v
        torch.cuda.empty_cache()
    if f is not sys.stdout:
        f.close()


if __name__ == "__main__":
    main()
