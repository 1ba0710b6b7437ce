#!/usr/bin/env python3
"""Compare a port's outputs with a vlsparse golden case, using numpy alone.

    python3 golden_check.py [--precision fp64|fp32|fp16|bf16] GOLDEN_CASE_DIR PORT_OUTPUT_DIR

PORT_OUTPUT_DIR holds one .npy per output of the case's manifest.json, under the same file name.
Each output is judged by the metric and tolerance the manifest states:
  exact  every element equal            rel  max|got-exp| / max|exp| <= tol
  abs    max|got-exp| <= tol            nmse ||got-exp||^2 / ||exp||^2 <= tol (both zero passes)
The tolerance is the output's "tols" entry for the precision the port computes in (default fp32,
the manifest's "tol"; a precision the output does not list uses "tol"): a port in double precision
should pass --precision fp64. Prints one line per output (PASS, or FAIL with the first difference)
and exits 1 on any failure.
"""
import json
import pathlib
import sys

import numpy as np

PRECISIONS = ("fp64", "fp32", "fp16", "bf16")


def as_values(a, dtype):
    """Numeric values of a golden array: bf16 is stored as raw uint16 bits."""
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64) if a.dtype.kind in "fiub" else a


def tolerance(spec, precision):
    """The tolerance of an output for a port computing in `precision`."""
    return spec.get("tols", {}).get(precision, spec.get("tol", 0.0))


def compare(spec, expected, got, precision="fp32"):
    if expected.shape != got.shape:
        return False, f"shape {got.shape}, expected {expected.shape}"
    metric, tol = spec["metric"], tolerance(spec, precision)
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
    args, precision = list(argv[1:]), "fp32"
    if len(args) >= 2 and args[0] == "--precision":
        precision = args[1]
        args = args[2:]
    if len(args) != 2 or precision not in PRECISIONS:
        print(__doc__.strip())
        return 2
    case, port = pathlib.Path(args[0]), pathlib.Path(args[1])
    manifest = json.loads((case / "manifest.json").read_text())
    failed = 0
    for spec in manifest["outputs"]:
        path = port / spec["file"]
        if not path.exists():
            print(f"FAIL {spec['name']}: {path} is missing")
            failed += 1
            continue
        ok, detail = compare(spec, np.load(case / spec["file"]), np.load(path), precision)
        print(f"{'PASS' if ok else 'FAIL'} {spec['name']}: {detail}")
        failed += not ok
    print(f"{manifest['algorithm']}/{manifest['case']} ({precision} tolerances): "
          f"{len(manifest['outputs']) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
