#!/usr/bin/env python3
"""Joins cuda_select_bench's and torch_select_bench.py's rows (one CSV file or several) into the
markdown table of docs/cuda.md: per n, vlsparse's ZipVL selection time, its share of cuDNN's dense
causal prefill of the same layer, and its speed-up over the same selection written with PyTorch ops,
with the targets of "CUDA II" (<= 10% of the prefill at 16K, <= 5% from 32K, >= 10x over PyTorch ops
at 16K) marked met / missed.

  python3 bench/cuda_select_report.py select.csv [more.csv ...] [--out report.md]
"""
import argparse
import csv
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--out", default="-")
    a = ap.parse_args(argv)
    rows = []
    for path in a.csv:
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("impl") != "impl"]
    t = {}
    meta = {}
    for r in rows:
        if not r["time_us"]:
            continue
        key = (r["policy"], int(r["n"]))
        t[key] = float(r["time_us"])
        meta[key] = r
    ns = sorted({int(r["n"]) for r in rows})
    lines = ["| n | vlsparse selection | kept | cuDNN dense causal prefill | flash prefill | "
             "selection / cuDNN prefill | PyTorch-ops selection | speed-up over PyTorch ops |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    verdicts = []

    def us(x):
        return "-" if x is None else (f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} us")

    for n in ns:
        sel = t.get(("zipvl_select", n))
        cud = t.get(("cudnn_prefill", n))
        fla = t.get(("flash_prefill", n))
        ops = t.get(("zipvl_torch_ops", n))
        kept = meta.get(("zipvl_select", n), {}).get("kept", "")
        share = sel / cud if sel and cud else None
        speed = ops / sel if sel and ops else None
        lines.append(f"| {n // 1024}K | {us(sel)} | {float(kept) * 100:.1f}% | {us(cud)} | {us(fla)} | "
                     f"{'-' if share is None else f'{share * 100:.1f}%'} | {us(ops)} | "
                     f"{'-' if speed is None else f'{speed:.1f}x'} |" if kept else
                     f"| {n // 1024}K | {us(sel)} | - | {us(cud)} | {us(fla)} | - | {us(ops)} | - |")
        if share is not None and n >= 16384:
            limit = 0.10 if n < 32768 else 0.05
            verdicts.append(f"- n = {n // 1024}K: selection {share * 100:.1f}% of cuDNN prefill (target <= {limit * 100:.0f}%): "
                            f"{'met' if share <= limit else 'MISSED'}")
        if speed is not None and n == 16384:
            verdicts.append(f"- n = 16K: {speed:.1f}x faster than the PyTorch-ops selection (target >= 10x): "
                            f"{'met' if speed >= 10 else 'MISSED'}")
    # Every other policy: its selection time and its share of cuDNN's dense causal prefill of the layer
    # (target of "CUDA II": <= 5% from 16K).
    others = ["h2o_select", "h2o_select_lse", "snapkv_select", "snapkv_select_lse", "fastv_select", "fastv_select_lse",
              "avl_select", "avl_select_lse", "avl_select_text", "avl_select_text_lse",
              "vlsparse_dense_prefill", "vlsparse_dense_prefill_lse", "purekv_select_l0", "purekv_select_l0_lse",
              "purekv_select_above_l0",
              "streamingllm_select", "random_select", "fixed_ratio_select"]
    present = [p for p in others if any((p, n) in t for n in ns)]
    if present:
        lines2 = ["", "| policy (kept) | " + " | ".join(f"{n // 1024}K" for n in ns) + " |",
                  "| --- |" + " --- |" * len(ns)]
        for p in present:
            cells = []
            kept = next((meta[(p, n)]["kept"] for n in ns if (p, n) in meta), "")
            for n in ns:
                x, cud = t.get((p, n)), t.get(("cudnn_prefill", n))
                if x is None:
                    cells.append("-")
                    continue
                share = x / cud if cud else None
                cells.append(us(x) + ("" if share is None else f" ({share * 100:.2f}%)"))
                if share is not None and n >= 16384 and not p.startswith("vlsparse_dense_prefill"):
                    verdicts.append(f"- {p}, n = {n // 1024}K: {share * 100:.2f}% of cuDNN prefill (target <= 5%): "
                                    f"{'met' if share <= 0.05 else 'MISSED'}")
            label = p + (f" ({float(kept) * 100:.0f}%)" if kept else "")
            lines2.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += lines2
    # Decode-time work beside one dense decode step of the layer (target of "CUDA II": <= 10%).
    dec = ["avl_decode_rows", "avl_decode_refresh", "avl_decode_refresh_nosync", "h2o_decode_update"]
    if any(("dense_decode_step", n) in t for n in ns):
        lines3 = ["", "| decode-time work | " + " | ".join(f"{n // 1024}K" for n in ns) + " |",
                  "| --- |" + " --- |" * len(ns),
                  "| dense_decode_step (B = 1) | " + " | ".join(us(t[("dense_decode_step", n)]) if ("dense_decode_step", n) in t else "-" for n in ns) + " |"]
        for p in dec:
            cells = []
            for n in ns:
                x, ds = t.get((p, n)), t.get(("dense_decode_step", n))
                if x is None or not ds:
                    cells.append("-")
                    continue
                cells.append(f"{us(x)} ({x / ds * 100:.1f}%)")
                verdicts.append(f"- {p}, n = {n // 1024}K: {x / ds * 100:.1f}% of a dense decode step (target <= 10%): "
                                f"{'met' if x / ds <= 0.10 else 'MISSED'}")
            lines3.append(f"| {p} | " + " | ".join(cells) + " |")
        # What each policy adds to a decode step as an engine runs it: the step's plan and decode, with and
        # without the policy's work, in the same run (differences of medians).
        diffs = [("A-VL re-rank, same stream (+ to a refresh step)", "avl_step_decode_rerank", "avl_step_decode"),
                 ("A-VL re-rank on a second stream (async_refresh)", "avl_two_steps_rerank_side", "avl_two_steps"),
                 ("H2O update (+ to a step with probabilities)", "h2o_step_decode_update", "h2o_step_decode"),
                 ("H2O probabilities + update (+ to a plain step)", "h2o_step_decode_update", "h2o_step_decode_noprobs")]
        for label, with_, without in diffs:
            cells = []
            for n in ns:
                x, y, ds = t.get((with_, n)), t.get((without, n)), t.get(("dense_decode_step", n))
                if x is None or y is None or not ds:
                    cells.append("-")
                    continue
                cells.append(f"{x - y:+.1f} us ({(x - y) / ds * 100:.1f}%)")
                verdicts.append(f"- {label}, n = {n // 1024}K: {(x - y) / ds * 100:.1f}% of a dense decode step "
                                f"(target <= 10%): {'met' if (x - y) / ds <= 0.10 else 'MISSED'}")
            lines3.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += lines3
    text = "\n".join(lines + [""] + verdicts) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
