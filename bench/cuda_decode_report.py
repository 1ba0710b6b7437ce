#!/usr/bin/env python3
"""Markdown tables for docs/cuda.md from the two CSV files of one GPU run: bench/cuda_decode_bench.cu's
(impl vlsparse; backend contiguous | paged16 | ...) and bench/torch_decode_bench.py's (impl sdpa |
sdpa_pregathered | gather_sdpa | flex; backend cudnn | flash | efficient, each also "/packed"),
both with the columns impl,backend,dtype,B,H,H_kv,d,n,frac,P,time_us,bytes,GBps,note and a "copy"
row (device copy bandwidth, the device name in its note).

  python3 bench/cuda_decode_report.py OUT/vlsparse.csv OUT/torch.csv [--frac 0.3] [--out report.md]

Tables, per (dtype, B, n), times in microseconds:
  1. dense decode: vlsparse (contiguous) time, GB/s, % of the device copy bandwidth; SDPA cuDNN,
     flash, efficient (enable_gqa; where it was refused, the GQA-packed variant, marked *),
     FlexAttention; vlsparse / cuDNN and vlsparse / the fastest PyTorch dense decode;
  2. per listed fraction (--frac): vlsparse over the list; SDPA over the pre-gathered rows and
     gather + SDPA (fastest backend each); the list against vlsparse dense, cuDNN dense,
     pre-gathered SDPA and gather + SDPA;
  3. paged (P = 16, ...) against contiguous vlsparse, dense and listed;
  4. the other vlsparse rows (a note such as shape-sweep or q_len=4), as measured.
The main grid is the vlsparse rows without a note and every PyTorch row. A missing file, row or
measurement shows as "-" (unsupported: "n/s"); ratios are taken only within matching shapes.
Either CSV may be missing or empty.
"""
import argparse
import csv
import os
import statistics
import sys

DTYPE_ORDER = {"bf16": 0, "fp16": 1, "fp32": 2}
DASH = "-"


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def read_csv(path):
    """Rows as dicts (numbers parsed), or [] with a warning when the file is missing or unreadable."""
    if not path:
        return [], "not given"
    if not os.path.exists(path):
        return [], f"{path}: missing"
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error) as e:
        return [], f"{path}: unreadable ({e})"
    out = []
    for r in rows:
        if not r.get("impl"):
            continue
        r = {k: (v or "").strip() for k, v in r.items() if k is not None}
        for k in ("B", "H", "H_kv", "d", "n", "P"):
            v = num(r.get(k))
            r[k] = int(v) if v is not None else None
        for k in ("frac", "time_us", "bytes", "GBps"):
            r[k] = num(r.get(k))
        out.append(r)
    return out, None if out else f"{path}: no rows"


def copy_info(rows):
    c = [r for r in rows if r["impl"] == "copy" and r["GBps"]]
    if not c:
        return None, ""
    return statistics.median(r["GBps"] for r in c), c[0].get("note", "")


def shape(r):
    return (r["dtype"], r["B"], r["H"], r["H_kv"], r["d"], r["n"])


def same_frac(a, b):
    return a is not None and b is not None and abs(a - b) < 1e-6


def unsupported(r):
    return r["time_us"] is None and "unsupported:" in r.get("note", "")


def us(t):
    if t is None:
        return DASH
    return f"{t:.1f}" if t < 1000 else f"{t:.0f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return DASH
    return f"{a / b:.2f}x"


def md_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Index:
    def __init__(self, rows):
        self.rows = rows

    def find(self, key, impl, backend=None, frac=1.0, P=None):
        """Rows of this shape, impl, backend (None: any) and fraction."""
        return [r for r in self.rows if r["impl"] == impl and shape(r) == key
                and (backend is None or r["backend"] == backend) and same_frac(r["frac"], frac)
                and (P is None or r["P"] == P)]

    def time(self, key, impl, backend, frac=1.0):
        """(time or None, marker): the measurement, or 'n/s' when only unsupported rows exist."""
        rs = self.find(key, impl, backend, frac)
        t = [r["time_us"] for r in rs if r["time_us"] is not None]
        if t:
            return min(t), ""
        return None, ("n/s" if any(unsupported(r) for r in rs) else "")

    def best(self, key, impl, frac=1.0, backends=None):
        """(time, backend) of the fastest measured row of this impl, or (None, marker)."""
        rs = [r for r in self.find(key, impl, None, frac) if backends is None or r["backend"] in backends]
        t = [(r["time_us"], r["backend"]) for r in rs if r["time_us"] is not None]
        if t:
            return min(t)
        return None, ("n/s" if any(unsupported(r) for r in rs) else "")


def sdpa_cell(tix, key, backend, frac=1.0, impl="sdpa"):
    """enable_gqa time; else the packed variant's, marked *; else n/s or -; and the time used."""
    t, mark = tix.time(key, impl, backend, frac)
    if t is not None:
        return us(t), t
    tp, markp = tix.time(key, impl, backend + "/packed", frac)
    if tp is not None:
        return us(tp) + "*", tp
    return (mark or markp or DASH), None


def build_report(vl_rows, vl_msg, t_rows, t_msg, fracs, vl_path, t_path):
    out = []
    main_vl = [r for r in vl_rows if r["impl"] == "vlsparse" and not r.get("note")]
    vix, tix = Index(main_vl), Index(t_rows)
    vbw, vdev = copy_info(vl_rows)
    tbw, tdev = copy_info(t_rows)
    out.append("## GPU decode attention: vlsparse against PyTorch")
    out.append("")
    out.append(f"- vlsparse: `{vl_path}` " + (f"({vl_msg})" if vl_msg else
               f"on {vdev or 'an unnamed device'}, device copy {vbw:.0f} GB/s" if vbw else "(no copy row)"))
    out.append(f"- PyTorch: `{t_path}` " + (f"({t_msg})" if t_msg else
               f"on {tdev or 'an unnamed device'}, device copy {tbw:.0f} GB/s" if tbw else "(no copy row)"))
    if vdev and tdev and vdev != tdev:
        out.append(f"- **different devices** ({vdev} / {tdev}): ratios across the two files compare machines, "
                   "not kernels")
    out.append("- times in microseconds (medians, L2 flushed before each call); GB/s counts the K and V rows "
               "read plus q and the output; `*` SDPA with the query heads of a KV head folded into the query "
               "length (where enable_gqa was refused); n/s: the backend refused the shape; -: not measured")
    out.append("")

    keys = sorted({shape(r) for r in main_vl + [r for r in t_rows if r["impl"] != "copy"]},
                  key=lambda k: (DTYPE_ORDER.get(k[0], 9), k[0], k[2] or 0, k[3] or 0, k[4] or 0, k[1] or 0,
                                 k[5] or 0))
    torch_backends = sorted({r["backend"].split("/")[0] for r in t_rows if r["impl"] == "sdpa"},
                            key=lambda b: ["cudnn", "flash", "efficient"].index(b)
                            if b in ("cudnn", "flash", "efficient") else 9)
    if not torch_backends:
        torch_backends = ["cudnn", "flash", "efficient"]
    multi_shape = len({k[2:5] for k in keys}) > 1

    def key_cells(k):
        c = [k[0], str(k[1]), str(k[5])]
        if multi_shape:
            c.insert(1, f"{k[2]}/{k[3]}/{k[4]}")
        return c

    key_head = ["dtype", "B", "n"]
    if multi_shape:
        key_head.insert(1, "H/H_kv/d")

    # 1. Dense decode.
    rows = []
    for k in keys:
        vt, vmark = vix.time(k, "vlsparse", "contiguous")
        vr = [r for r in vix.find(k, "vlsparse", "contiguous") if r["time_us"] is not None]
        gb = vr[0]["GBps"] if vr else None
        cells = key_cells(k) + [us(vt) if vt is not None else (vmark or DASH), f"{gb:.0f}" if gb else DASH,
                                f"{100 * gb / vbw:.0f}%" if gb and vbw else DASH]
        dense_t = {}
        for b in torch_backends:
            cell, t = sdpa_cell(tix, k, b)
            cells.append(cell)
            dense_t[b] = t
        ft, fmark = tix.time(k, "flex", "compiled")
        cells.append(us(ft) if ft is not None else (fmark or DASH))
        bt, bb = tix.best(k, "sdpa")
        cand = [(t, b) for t, b in [(bt, bb), (ft, "flex")] if t is not None]
        best_t, best_b = min(cand) if cand else (None, "")
        rb = ratio(vt, best_t)
        cells += [ratio(vt, dense_t.get("cudnn")), rb + (f" ({best_b})" if rb != DASH else "")]
        rows.append(cells)
    out.append("### Dense decode")
    out.append("")
    out.append(md_table(key_head + ["vlsparse", "GB/s", "% of copy"] + [f"SDPA {b}" for b in torch_backends]
                        + ["Flex", "vlsparse / cuDNN", "vlsparse / fastest PyTorch"], rows))
    out.append("")

    # 2. Lists.
    for f in fracs:
        rows = []
        for k in keys:
            lt, lmark = vix.time(k, "vlsparse", "contiguous", f)
            lr = [r for r in vix.find(k, "vlsparse", "contiguous", f) if r["time_us"] is not None]
            dt_, _ = vix.time(k, "vlsparse", "contiguous")
            cudnn_cell, cudnn_t = sdpa_cell(tix, k, "cudnn")
            pt, pb = tix.best(k, "sdpa_pregathered", f)
            gt, gb_ = tix.best(k, "gather_sdpa", f)
            if lt is None and pt is None and gt is None:
                continue
            rows.append(key_cells(k) + [
                us(lt) if lt is not None else (lmark or DASH),
                f"{lr[0]['GBps']:.0f}" if lr and lr[0]["GBps"] else DASH,
                f"{us(pt)} ({pb})" if pt is not None else (pb or DASH),
                f"{us(gt)} ({gb_})" if gt is not None else (gb_ or DASH),
                ratio(lt, dt_), ratio(lt, cudnn_t), ratio(lt, pt), ratio(lt, gt)])
        out.append(f"### Decode over a {100 * f:g}% list")
        out.append("")
        if rows:
            out.append(md_table(key_head + ["vlsparse list", "GB/s", "SDPA pre-gathered", "gather + SDPA",
                                            "list / vlsparse dense", "list / cuDNN dense",
                                            "list / pre-gathered", "list / gather + SDPA"], rows))
        else:
            out.append(f"(no rows at frac {f:g})")
        out.append("")

    # 3. Paged against contiguous.
    paged = sorted({r["backend"] for r in main_vl if r["backend"] != "contiguous"},
                   key=lambda b: (len(b), b))
    for pb in paged:
        rows = []
        for k in keys:
            pd, _ = vix.time(k, "vlsparse", pb)
            cd, _ = vix.time(k, "vlsparse", "contiguous")
            lfr = [f for f in fracs if vix.time(k, "vlsparse", pb, f)[0] is not None]
            cells = key_cells(k) + [us(cd), us(pd), ratio(pd, cd)]
            fr = lfr[0] if lfr else (fracs[0] if fracs else 0.3)
            pl, _ = vix.time(k, "vlsparse", pb, fr)
            cl, _ = vix.time(k, "vlsparse", "contiguous", fr)
            if pd is None and pl is None:
                continue
            rows.append(cells + [f"{100 * fr:g}%", us(cl), us(pl), ratio(pl, cl)])
        if rows:
            out.append(f"### vlsparse {pb} against contiguous")
            out.append("")
            out.append(md_table(key_head + ["contiguous dense", f"{pb} dense", "ratio", "list", "contiguous list",
                                            f"{pb} list", "ratio"], rows))
            out.append("")

    # 4. Other vlsparse rows.
    other = [r for r in vl_rows if r["impl"] == "vlsparse" and r.get("note")]
    if other:
        rows = []
        for r in other:
            rows.append([r["note"], r["backend"], r["dtype"], r["B"], f"{r['H']}/{r['H_kv']}", r["d"], r["n"],
                         "dense" if same_frac(r["frac"], 1.0) else f"{100 * r['frac']:g}%",
                         us(r["time_us"]), f"{r['GBps']:.0f}" if r["GBps"] else DASH,
                         f"{100 * r['GBps'] / vbw:.0f}%" if r["GBps"] and vbw else DASH])
        out.append("### Other vlsparse measurements")
        out.append("")
        out.append(md_table(["note", "cache", "dtype", "B", "H/H_kv", "d", "n", "rows", "time", "GB/s", "% of copy"],
                            rows))
        out.append("")

    # Why PyTorch rows are missing, one line per reason.
    reasons = {}
    for r in t_rows:
        if unsupported(r):
            why = r["note"].split("unsupported:", 1)[1].strip()[:100]
            d = reasons.setdefault(why, {})
            d.setdefault(f"{r['impl']} {r['backend']}", set()).add(r["dtype"])
    if reasons:
        out.append("Refused by PyTorch:")
        out.append("")
        for why, who in sorted(reasons.items()):
            names = "; ".join(f"{k} ({', '.join(sorted(v, key=lambda x: DTYPE_ORDER.get(x, 9)))})"
                              for k, v in sorted(who.items()))
            out.append(f"- {why}: {names}")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description="Markdown tables from cuda_decode_bench and torch_decode_bench CSVs.")
    p.add_argument("vlsparse_csv", help="CSV of build/bench/cuda_decode_bench --out")
    p.add_argument("torch_csv", help="CSV of bench/torch_decode_bench.py --out")
    p.add_argument("--frac", default="0.3", help="listed fractions to tabulate (comma-separated)")
    p.add_argument("--out", default="", help="write the markdown here as well as to stdout")
    a = p.parse_args(argv)
    try:
        fracs = [float(x) for x in a.frac.split(",") if x.strip()]
    except ValueError:
        p.error(f"--frac: expected comma-separated numbers, got {a.frac!r}")
    vl_rows, vl_msg = read_csv(a.vlsparse_csv)
    t_rows, t_msg = read_csv(a.torch_csv)
    text = build_report(vl_rows, vl_msg, t_rows, t_msg, fracs, a.vlsparse_csv, a.torch_csv)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if not (vl_rows or t_rows):
        print(f"cuda_decode_report: no rows ({vl_msg}; {t_msg})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
