#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets, tests/fuzz/corpus/<target>/, from the repository's own
files: layouts, golden manifests and .npy tensors from golden/, scenarios from sim/scenarios/, policy
params from both; the formats with no file in the repository (safetensors, head maps, dump
manifests) are written here the way the library writes them. Deterministic; run from anywhere:
    /usr/bin/python3 tests/fuzz/make_corpus.py   (Debian's python3, with python3-numpy)
Files whose name starts with 'seed-' are replaced; others (inputs a fuzzing run found and
`run.sh --merge` kept) are left alone."""
import json
import os
import struct
import glob

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def clear_seeds():
    for p in glob.glob(os.path.join(OUT, "*", "seed-*")):
        os.remove(p)


def manifests():
    for p in sorted(glob.glob(os.path.join(ROOT, "golden", "*", "*", "manifest.json"))):
        with open(p) as f:
            yield p, json.load(f)


def main():
    clear_seeds()
    # layout: every distinct layout of the golden cases and scenarios, and the documented examples
    layouts = {"text:35,image:576,text:22", "text:14,video:64x144,text:30", "image:576[24x24]",
               "video:64x144[12x12]", "text:1"}
    for _, m in manifests():
        if m.get("layout"):
            layouts.add(m["layout"])
    scenarios = sorted(glob.glob(os.path.join(ROOT, "sim", "scenarios", "*.json")))
    for p in scenarios:
        with open(p) as f:
            layouts.add(json.load(f)["layout"])
    for i, l in enumerate(sorted(layouts)):
        put("layout", "%02d" % i, l)

    # golden_manifest: one case per algorithm family and two of the baselines
    seen = set()
    for p, m in manifests():
        key = m["algorithm"] if m["algorithm"] != "baselines" else m["params"].get("baseline")
        if key in seen:
            continue
        seen.add(key)
        with open(p, "rb") as f:
            put("golden_manifest", "%s-%s" % (m["algorithm"], m["case"]), f.read())

    # npy: the smallest golden tensor of each descr
    best = {}
    for p in sorted(glob.glob(os.path.join(ROOT, "golden", "*", "*", "*.npy"))):
        with open(p, "rb") as f:
            data = f.read()
        hlen = struct.unpack("<H", data[8:10])[0]
        descr = data[10:10 + hlen].split(b"'descr': '")[1].split(b"'")[0].decode()
        if descr not in best or len(data) < len(best[descr][1]):
            best[descr] = (p, data)
    for descr, (p, data) in sorted(best.items()):
        put("npy", descr.replace("<", "le-").replace("|", "na-"), data)
    try:  # what numpy writes for the other descrs, a 0-d and an empty array, and format 2.0
        import io
        import numpy as np
        for name, a in [("na-u1", np.arange(5, dtype=np.uint8)), ("na-b1", np.array([[True, False]])),
                        ("le-u2", np.array([0x3f80, 0xc000], dtype="<u2")), ("le-i4", np.array([-1, 2], dtype="<i4")),
                        ("0d", np.float32(1.5)), ("empty", np.zeros((0, 3), dtype="<f4"))]:
            b = io.BytesIO()
            np.save(b, np.asarray(a))
            put("npy", name, b.getvalue())
        b = io.BytesIO()
        np.lib.format.write_array(b, np.arange(3, dtype="<i8"), version=(2, 0))
        put("npy", "v2", b.getvalue())
    except ImportError:
        pass

    # params_json: the first byte picks the reader (params_json_fuzz.cpp): 0 zipvl, 1 purekv,
    # 2 blindsight, 3 avl, 4..9 the baselines; 10.. the simulator's registry in its order
    baseline = {"h2o": 4, "snapkv": 5, "streamingllm": 6, "fastv": 7, "random": 8, "fixed_ratio": 9}
    library = {"zipvl": 0, "purekv": 1, "blindsight": 2, "avl": 3}
    registry = ["dense", "zipvl", "avl", "blindsight", "h2o", "snapkv", "streamingllm", "fastv", "random",
                "fixed_ratio", "purekv"]
    done = set()
    for _, m in manifests():
        params = dict(m["params"])
        if m["algorithm"] == "baselines":
            pick = baseline[params["baseline"]]
        else:
            pick = library[m["algorithm"]]
            if m["algorithm"] == "blindsight":  # the manifest carries more than the params
                params = {k: v for k, v in params.items() if k in (
                    "alpha", "gamma_c", "gamma_s", "gamma_d", "sink_fraction", "sink_offsets",
                    "bidirectional_images", "scale", "check_finite")}
        if pick in done:
            continue
        done.add(pick)
        put("params_json", "%02d-%s" % (pick, m["case"]), bytes([pick]) + json.dumps(params).encode())
    for p in scenarios:
        with open(p) as f:
            s = json.load(f)
        for pol in s["policies"]:
            name = pol if isinstance(pol, str) else pol["name"]
            params = {} if isinstance(pol, str) else pol.get("params", {})
            pick = 10 + registry.index(name)
            put("params_json", "%02d-%s-%s" % (pick, os.path.basename(p)[:-5], name),
                bytes([pick]) + json.dumps(params).encode())
    put("params_json", "10-dense", bytes([10]) + b"{}")

    # scenario: the checked-in scenarios, shrunk to a small model and prompt so that each runs fast
    for p in scenarios:
        with open(p) as f:
            s = json.load(f)
        s["model"] = {"layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16}
        s["layout"] = "text:6,image:16[4x4],text:3" if "video" not in s["layout"] else "text:6,video:4x16[4x4],text:3"
        s["decode_steps"] = 2
        src = s.get("source", {})
        if src.get("kind") == "residual":
            src["params"] = {"hidden": 32, "vocab": 64}
        put("scenario", os.path.basename(p), json.dumps(s, indent=1))
        with open(p, "rb") as f:
            put("scenario", "full-" + os.path.basename(p), f.read())

    # head_map: the format of io/blindsight_json.hpp
    names = ["Dense", "Sink", "Document", "Document-Sink"]
    for i, (layers, heads, kv) in enumerate([(1, 1, 1), (2, 4, 2), (3, 2, 1)]):
        hm = {"format": "vlsparse.blindsight.head_map", "version": 1,
              "model": {"layers": layers, "heads": heads, "kv_heads": kv, "head_dim": 8},
              "prompts": 3,
              "params": {"alpha": 0.1, "gamma_c": 0.25, "gamma_s": 0.6, "gamma_d": 0.6, "sink_fraction": 0.1,
                         "sink_offsets": [0, 2], "bidirectional_images": False, "scale": 0.0, "check_finite": True},
              "map": [[names[(l + h) % 4] for h in range(heads)] for l in range(layers)]}
        put("head_map", "%d.json" % i, json.dumps(hm, indent=2))

    # dump_manifest: the format of sim/dump.hpp
    base = {"format": "vlsparse-qkv-dump", "version": 1, "model": "Qwen/Qwen2-VL-2B-Instruct", "layers": 2,
            "heads": 4, "kv_heads": 2, "head_dim": 8, "dtype": "bf16", "layout": "text:3,image:4[2x2],text:2",
            "positions": "post-RoPE"}
    put("dump_manifest", "npy.json", json.dumps(base, indent=2))
    st = dict(base, storage="safetensors", file="qkv.safetensors", dtype="fp16", decode_steps=2, scale=0.35,
              input_ids=list(range(11)))
    put("dump_manifest", "safetensors.json", json.dumps(st, indent=2))

    # safetensors: the layout write_safetensors writes (header padded with spaces to 8 bytes)
    def safetensors(tensors, metadata=None):
        header, data = {}, b""
        if metadata:
            header["__metadata__"] = metadata
        for name, dtype, shape, raw in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        return struct.pack("<Q", len(h)) + h + data
    f32 = struct.pack("<6f", 1, -2, 0.5, 3, 0, 1e-3)
    put("safetensors", "f32", safetensors([("layers.0.q", "F32", [2, 3], f32)]))
    put("safetensors", "mixed", safetensors([
        ("layers.0.k", "BF16", [1, 2, 2], struct.pack("<4H", 0x3f80, 0xbf80, 0x4000, 0)),
        ("layers.0.v", "F16", [2, 2], struct.pack("<4H", 0x3c00, 0xbc00, 0x4000, 0)),
        ("ids", "I64", [2], struct.pack("<2q", 7, -1)),
        ("empty", "U8", [0, 3], b"")], {"format": "vlsparse-qkv-dump"}))

    # cache_rows, kv_batch: byte strings the targets decode (a few sizes and layouts)
    put("cache_rows", "small", bytes([1, 2, 9, 1, 3, 0, 1, 2, 1, 1, 2, 1, 2, 0, 1, 3, 1, 2, 3, 0]))
    put("cache_rows", "evict", bytes([3, 1, 20, 4, 2, 1, 1, 1, 4, 3, 5, 0, 7, 2, 1, 1, 1, 6, 1, 1, 2]))
    for i, mode in enumerate([0, 1, 2]):
        for lay in (0, 1, 3, 5):
            put("kv_batch", "m%d-l%d" % (mode, lay),
                bytes([mode, 2, lay, 1, 2, 1, 4, 5, 3, 0, 5, 0, 7, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 1, 1, 2, 2, 1, 0, 1, 2]))


if __name__ == "__main__":
    main()
