#!/usr/bin/env python3
"""Joins cuda_prefill_bench's and torch_prefill_bench.py's rows (one CSV file or several, columns
impl,case,dtype,H,H_kv,d,n,time_us,pairs,tflops,note) into the markdown tables of docs/cuda.md: per
n (and shape), one line per case and vlsparse kernel (impl vlsparse or vlsparse_*):

  allowed pairs      the case's allowed (query, key) pairs, as a share of the dense causal ones;
  ideal              dense causal pairs / allowed pairs: the speed-up over dense causal attention
                     that skipping exactly the masked pairs would give;
  vlsparse, TF/s     the kernel's median time and its TF/s on the allowed pairs (4 * d * pairs / t);
  cuDNN dense        SDPA cuDNN dense causal of the same n and shape (sdpa_cudnn, case dense_causal);
  Flex, TF/s         FlexAttention on the same case (the same mask: torch_prefill_bench checks the
                     allowed pairs before timing);
  best PyTorch       the fastest other PyTorch row of the same case (SDPA cuDNN / flash for
                     dense_causal, gather + SDPA for zipvl_keep50), its impl in brackets;
  x cuDNN dense, x Flex, x best PyTorch   speed-ups: the PyTorch time / the vlsparse time (> 1: vlsparse faster);
  reached            (cuDNN dense time / vlsparse time) / ideal: the share of the ideal speed-up
                     over cuDNN's dense causal prefill that the kernel reaches.

then every row of that n as measured (impl, case, time, TF/s, note). A missing row or measurement
shows as "-"; ratios are taken only within one (dtype, H, H_kv, d, n).

  python3 bench/cuda_prefill_report.py prefill.csv [more.csv ...] [--out report.md]
"""
import argparse
import csv
import sys

DENSE_CASE = "dense_causal"
DASH = "-"


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def read_rows(paths):
    rows, msgs = [], []
    for path in paths:
        try:
            with open(path, newline="") as f:
                got = [r for r in csv.DictReader(f) if r.get("impl") and r.get("impl") != "impl"]
        except (OSError, csv.Error) as e:
            msgs.append(f"{path}: unreadable ({e})")
            continue
        if not got:
            msgs.append(f"{path}: no rows")
        for r in got:
            r = {k: (v or "").strip() for k, v in r.items() if k is not None}
            for k in ("H", "H_kv", "d", "n", "pairs"):
                v = num(r.get(k))
                r[k] = int(v) if v is not None else None
            for k in ("time_us", "tflops"):
                r[k] = num(r.get(k))
            r.setdefault("case", "")
            r.setdefault("dtype", "")
            r.setdefault("note", "")
            if r["n"] is None:
                continue
            rows.append(r)
    return rows, msgs


def is_vlsparse(impl):
    return impl == "vlsparse" or impl.startswith("vlsparse_")


def group_key(r):
    return (r["dtype"], r["H"], r["H_kv"], r["d"], r["n"])


def causal_pairs(H, n):
    return None if H is None or n is None else H * n * (n + 1) // 2


def us(t):
    if t is None:
        return DASH
    return f"{t / 1000:.2f} ms" if t >= 1000 else f"{t:.0f} us"


def tf_of(r, d):
    if r is None:
        return None
    if r["tflops"] is not None:
        return r["tflops"]
    if r["time_us"] and r["pairs"] is not None and d:
        return 4.0 * d * r["pairs"] / (r["time_us"] * 1e-6) / 1e12
    return None


def tf(x):
    return DASH if x is None else f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def speedup(other, mine):
    return DASH if other is None or mine is None or mine == 0 else f"{other / mine:.2f}x"


def md_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Group:
    """The rows of one (dtype, H, H_kv, d, n)."""

    def __init__(self, rows):
        self.rows = rows

    def best(self, impl, case):
        """The measured row of this impl and case with the smallest time, or None."""
        rs = [r for r in self.rows if r["impl"] == impl and r["case"] == case and r["time_us"] is not None]
        return min(rs, key=lambda r: r["time_us"]) if rs else None

    def time(self, impl, case):
        r = self.best(impl, case)
        return None if r is None else r["time_us"]

    def pairs(self, case):
        """Allowed pairs of a case: a vlsparse row's, else any row's."""
        for pick in (lambda r: is_vlsparse(r["impl"]), lambda r: True):
            for r in self.rows:
                if r["case"] == case and r["pairs"] is not None and pick(r):
                    return r["pairs"]
        return None


def build_report(rows, msgs, paths):
    out = ["## GPU prefill attention: vlsparse against PyTorch", ""]
    out.append("- files: " + ", ".join(f"`{p}`" for p in paths) + (f" ({'; '.join(msgs)})" if msgs else ""))
    out.append("- times: medians, L2 flushed before each call; TF/s on the allowed (query, key) pairs "
               "(4 * d * pairs / time); speed-ups are the PyTorch time over the vlsparse time (> 1: vlsparse "
               "faster); ideal = dense causal pairs / allowed pairs; reached = (cuDNN dense / vlsparse) / ideal; "
               "-: not measured (see the rows below each table for why)")
    out.append("")
    keys = sorted({group_key(r) for r in rows}, key=lambda k: (k[4], k[0], k[1] or 0, k[2] or 0, k[3] or 0))
    for key in keys:
        dtype, H, Hkv, d, n = key
        g = Group([r for r in rows if group_key(r) == key])
        cases = []
        for r in g.rows:
            if r["case"] not in cases:
                cases.append(r["case"])
        cases.sort(key=lambda c: 0 if c == DENSE_CASE else 1)  # stable: file order otherwise
        full = causal_pairs(H, n)
        cud = g.time("sdpa_cudnn", DENSE_CASE)
        label = f"{n // 1024}K" if n % 1024 == 0 else str(n)
        out.append(f"### n = {label} (H {H}, H_kv {Hkv}, d {d}, {dtype})")
        out.append("")
        lines = []
        for case in cases:
            pairs = g.pairs(case)
            if pairs is None and case == DENSE_CASE:
                pairs = full
            ideal = full / pairs if full and pairs else None
            share = f"{100 * pairs / full:.1f}%" if full and pairs is not None else DASH
            flex = g.best("flex", case)
            others = [r for r in (g.best(i, case) for i in sorted({r["impl"] for r in g.rows}))
                      if r is not None and not is_vlsparse(r["impl"])
                      and r["impl"] not in ("flex", "sdpa_cudnn_gathered")]
            other = min(others, key=lambda r: r["time_us"]) if others else None
            impls = sorted({r["impl"] for r in g.rows if r["case"] == case and is_vlsparse(r["impl"])},
                           key=lambda i: (i != "vlsparse", i)) or [None]
            for impl in impls:
                vr = g.best(impl, case) if impl else None
                vt = None if vr is None else vr["time_us"]
                vs_cud = cud / vt if cud and vt else None
                reached = f"{100 * vs_cud / ideal:.0f}%" if vs_cud and ideal else DASH
                lines.append([case, share, DASH if ideal is None else f"{ideal:.2f}x", impl or DASH, us(vt),
                              tf(tf_of(vr, d)), us(cud), us(None if flex is None else flex["time_us"]),
                              tf(tf_of(flex, d)),
                              DASH if other is None else f"{us(other['time_us'])} ({other['impl']})",
                              speedup(cud, vt), speedup(None if flex is None else flex["time_us"], vt),
                              speedup(None if other is None else other["time_us"], vt), reached])
        out.append(md_table(["case", "allowed pairs", "ideal", "kernel", "vlsparse", "TF/s", "cuDNN dense causal",
                             "Flex (case)", "Flex TF/s", "best PyTorch (case)", "x cuDNN dense", "x Flex",
                             "x best PyTorch", "reached"], lines))
        out.append("")
        all_rows = sorted(g.rows, key=lambda r: (cases.index(r["case"]), not is_vlsparse(r["impl"]), r["impl"]))
        out.append(md_table(["impl", "case", "time", "TF/s", "pairs", "note"],
                            [[r["impl"], r["case"], us(r["time_us"]), tf(tf_of(r, d)),
                              DASH if r["pairs"] is None else r["pairs"], r["note"].replace("|", "/") or ""]
                             for r in all_rows]))
        out.append("")
    if not keys:
        out.append("(no rows)")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="CSV files of cuda_prefill_bench and torch_prefill_bench.py")
    ap.add_argument("--out", default="-", help="markdown file, or - for stdout")
    a = ap.parse_args(argv)
    rows, msgs = read_rows(a.csv)
    text = build_report(rows, msgs, a.csv) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)
    if not rows:
        print(f"cuda_prefill_report: no rows ({'; '.join(msgs)})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
