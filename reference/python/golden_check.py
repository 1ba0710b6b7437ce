#!/usr/bin/env python3
"""Compare a port's outputs with a vlsparse golden case, using numpy alone.

    python3 golden_check.py GOLDEN_CASE_DIR PORT_OUTPUT_DIR

PORT_OUTPUT_DIR holds one .npy per output of the case's manifest.json, under the same file name.
Each output is judged by the metric and tolerance the manifest states:
  exact  every element equal            rel  max|got-exp| / max|exp| <= tol
  abs    max|got-exp| <= tol            nmse ||got-exp||^2 / ||exp||^2 <= tol (both zero passes)
Prints one line per output (PASS, or FAIL with the first difference) and exits 1 on any failure.
"""
import json
import pathlib
import sys

import numpy as np


def as_values(a, dtype):
    """Numeric values of a golden array: bf16 is stored as raw uint16 bits."""
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64) if a.dtype.kind in "fiub" else a


def compare(spec, expected, got):
    if expected.shape != got.shape:
        return False, f"shape {got.shape}, expected {expected.shape}"
    metric, tol = spec["metric"], spec.get("tol", 0.0)
    if metric == "exact":
        diff = np.flatnonzero(expected.reshape(-1) != got.reshape(-1))
        if diff.size:
            i = int(diff[0])
            idx = np.unravel_index(i, expected.shape) if expected.ndim else ()
            return False, (f"{diff.size} elements differ; first at {list(map(int, idx))}: "
                           f"expected {expected.reshape(-1)[i]}, got {got.reshape(-1)[i]}")
        return True, "exact"
    e = as_values(expected, spec["dtype"])
    g = as_values(got, spec["dtype"])
    if metric == "nmse":
        den = float(np.sum(e * e))
        num = float(np.sum((g - e) ** 2))
        value = 0.0 if num == 0.0 else (np.inf if den == 0.0 else num / den)
    else:
        err = np.abs(g - e)
        value = float(err.max()) if err.size else 0.0
        if metric == "rel":
            scale = float(np.abs(e).max()) if e.size else 0.0
            value = 0.0 if value == 0.0 else (np.inf if scale == 0.0 else value / scale)
    ok = value <= tol
    detail = f"{metric} {value:.3e} (tol {tol:.1e})"
    if not ok and e.size:
        i = int(np.argmax(np.abs(g - e).reshape(-1)))
        idx = np.unravel_index(i, e.shape)
        detail += f"; largest difference at {list(map(int, idx))}: expected {e.reshape(-1)[i]!r}, got {g.reshape(-1)[i]!r}"
    return ok, detail


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip())
        return 2
    case, port = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    manifest = json.loads((case / "manifest.json").read_text())
    failed = 0
    for spec in manifest["outputs"]:
        path = port / spec["file"]
        if not path.exists():
            print(f"FAIL {spec['name']}: {path} is missing")
            failed += 1
            continue
        ok, detail = compare(spec, np.load(case / spec["file"]), np.load(path))
        print(f"{'PASS' if ok else 'FAIL'} {spec['name']}: {detail}")
        failed += not ok
    print(f"{manifest['algorithm']}/{manifest['case']}: "
          f"{len(manifest['outputs']) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
