#!/usr/bin/env python3
"""Record the post-RoPE Q/K/V of every decoder layer of a Hugging Face VLM, for vlsparse-sim.

Runs one prompt with images through a Qwen2-VL-family (Qwen2-VL, Qwen2.5-VL) or LLaVA-family
(LlavaForConditionalGeneration) model of the `transformers` library, records the query, key and
value states every decoder layer hands to its attention, and writes the dump directory that
vlsparse-sim reads (sim/include/vlsparse/sim/dump.hpp; docs/simulator-sources.md):

    OUT/manifest.json                 model, layers, heads, kv_heads, head_dim, dtype, layout,
                                      positions "post-RoPE", storage, decode_steps, scale, input_ids
    OUT/layer_{l:03d}_{q,k,v}.npy     q [n, heads, d], k / v [n, kv_heads, d]   (--format npy)
    OUT/qkv.safetensors               tensors "layers.{l}.q" / ".k" / ".v"       (--format safetensors)

How: the script registers its own attention function with transformers' AttentionInterface (the
library's documented extension point; written against transformers 5.17) and selects it for the
language model. Every decoder layer then calls it with exactly the tensors its attention consumes:
the queries and keys after the rotary embedding (M-RoPE for Qwen2-VL), the values, and the KV heads
before any GQA repetition. The function records them and computes the attention with PyTorch's SDPA,
as the model's default would. By default (--no-verify turns it off) the prefill attention is
recomputed from the recorded tensors in fp32 (causal softmax of scale * q.k over the KV head
h // (H / H_kv)) and compared with what the model computed, so a wrong capture cannot go unnoticed.

The layout (Layout::parse syntax) comes from the input ids: runs of the image token become image
segments, with the LLM's token grid (Qwen2-VL: image_grid_thw / spatial_merge_size; LLaVA: the
square patch grid); Qwen2-VL's <|vision_start|> / <|vision_end|> tokens become text segments of
length 1 (delimiters). --decode-steps N generates N tokens greedily and records their rows too.

Usage:
    # A real model (a local path or a hub id; needs its weights and processor files):
    python3 sim/tools/dump_qkv.py --model Qwen/Qwen2-VL-2B-Instruct --image cat.jpg --image dog.png \\
        --prompt "What differs between the two pictures?" --out dumps/qwen2vl_two
    python3 sim/tools/dump_qkv.py --model llava-hf/llava-1.5-7b-hf --synthetic-images 1 --out dumps/llava
    # No weights at hand: a small randomly initialised model built from the config classes:
    python3 sim/tools/dump_qkv.py --random-tiny qwen2-vl --synthetic-images 2 --decode-steps 3 --out /tmp/tiny_qwen
    python3 sim/tools/dump_qkv.py --random-tiny llava --synthetic-images 2 --format safetensors --out /tmp/tiny_llava
    # Then:
    vlsparse-sim run ... (a scenario whose source is {"kind": "dump", "path": "dumps/qwen2vl_two"})

Options: --dtype {fp32,fp16,bf16} storage dtype (default: the model's compute dtype);
--model-dtype {auto,fp32,fp16,bf16}; --device (default cuda if available); --image-size WxH for
synthetic images; --max-pixels for Qwen2-VL's image processor; --seed; --no-verify.
Needs torch, transformers, numpy and Pillow.
"""

import argparse
import inspect
import json
import math
import os
import struct
import sys
import time

import numpy as np

ATTN_NAME = "vlsparse_record"


def fail(msg):
    print("dump_qkv.py: error: " + msg, file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------------------------
# Recording attention
# ----------------------------------------------------------------------------------------------

class Recorder:
    """An attention function for transformers' AttentionInterface that records Q/K/V per layer."""

    def __init__(self, attn_modules, base, verify):
        self.layer_of = {id(m): i for i, m in enumerate(attn_modules)}
        self.n_layers = len(attn_modules)
        self.q = [[] for _ in attn_modules]
        self.k = [[] for _ in attn_modules]
        self.v = [[] for _ in attn_modules]
        self.base = base
        self.verify = verify
        self.scale = None
        self.worst = 0.0  # largest relative error of the verification
        self.calls = 0

    def __call__(self, module, query, key, value, attention_mask, *args, **kwargs):
        out = self.base(module, query, key, value, attention_mask, *args, **kwargs)
        layer = self.layer_of.get(id(module))
        if layer is None:  # the vision tower, or anything else: not recorded
            return out
        self.calls += 1
        if query.shape[0] != 1:
            raise RuntimeError("dump_qkv.py records batch size 1 only")
        # query [1, H, q_len, d]; key / value [1, H_kv, kv_len, d] (kv_len includes the cache).
        q_len, kv_len = query.shape[2], key.shape[2]
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None)
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if self.scale is None:
            self.scale = float(scaling)
        q = query[0].transpose(0, 1)                      # [q_len, H, d]
        k = key[0, :, kv_len - q_len:].transpose(0, 1)    # the new rows [q_len, H_kv, d]
        v = value[0, :, kv_len - q_len:].transpose(0, 1)
        self.q[layer].append(q.detach().float().cpu())
        self.k[layer].append(k.detach().float().cpu())
        self.v[layer].append(v.detach().float().cpu())
        if self.verify and q_len == kv_len and q_len > 1:
            self.check(layer, query, key, value, out[0], float(scaling))
        return out

    def check(self, layer, query, key, value, out, scaling):
        """The model's attention output against causal softmax(scale q.k) v from the recorded tensors."""
        import torch
        H, n, d = query.shape[1], query.shape[2], query.shape[3]
        Hkv = key.shape[1]
        group = H // Hkv
        got = out[0] if out.dim() == 4 else out           # [n, H, d]
        causal = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
        num = den = 0.0
        for h in range(H):
            qh = query[0, h].float()
            kh = key[0, h // group].float()
            vh = value[0, h // group].float()
            s = (qh @ kh.T) * scaling
            s = s.masked_fill(~causal, float("-inf"))
            ref = torch.softmax(s, dim=-1) @ vh             # [n, d]
            g = got[:, h].float()
            num += float(((ref - g) ** 2).sum())
            den += float((ref ** 2).sum())
        rel = math.sqrt(num / max(den, 1e-30))
        self.worst = max(self.worst, rel)


def register_recorder(recorder):
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_NAME, recorder)
    try:  # the same masks as SDPA (transformers >= 4.53); without it the mask is None and SDPA is causal
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    except ImportError:
        pass


def sdpa_base():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def decoder_attention_modules(model, n_layers):
    """The language model's attention modules, in layer order (not the vision tower's)."""
    import torch
    best = None
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) != n_layers:
            continue
        low = name.lower()
        if "vision" in low or "visual" in low:
            continue
        if all(hasattr(layer, "self_attn") and hasattr(layer.self_attn, "q_proj") for layer in mod):
            best = [layer.self_attn for layer in mod]
            break
    if best is None:
        fail("cannot find the decoder layers of the language model (a ModuleList of %d layers with self_attn)" % n_layers)
    return best


def select_recorder(model, attn_modules):
    """Selects the recording attention for the language model only (the vision tower keeps its own)."""
    try:
        model.set_attn_implementation({"text_config": ATTN_NAME})
    except Exception:  # older transformers: one implementation for every sub-model
        model.set_attn_implementation(ATTN_NAME)
    if any(getattr(m.config, "_attn_implementation", None) != ATTN_NAME for m in attn_modules):
        model.set_attn_implementation(ATTN_NAME)
    bad = [i for i, m in enumerate(attn_modules) if getattr(m.config, "_attn_implementation", None) != ATTN_NAME]
    if bad:
        fail("could not select the recording attention for decoder layers %s" % bad)


# ----------------------------------------------------------------------------------------------
# Models and inputs
# ----------------------------------------------------------------------------------------------

TINY_VOCAB = 1024
TINY_IDS = dict(image=1000, video=1001, vision_start=1002, vision_end=1003)


def tiny_qwen2vl(torch_dtype):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    text = dict(vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},  # sums to head_dim / 2 = 16
                bos_token_id=None, eos_token_id=None, pad_token_id=0)
    vision = dict(depth=2, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2, in_channels=3,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    ids = dict(image_token_id=TINY_IDS["image"], video_token_id=TINY_IDS["video"],
               vision_start_token_id=TINY_IDS["vision_start"], vision_end_token_id=TINY_IDS["vision_end"])
    try:
        cfg = Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
    except TypeError:  # transformers before text_config: flat text parameters
        cfg = Qwen2VLConfig(vision_config=vision, **text, **ids)
    return Qwen2VLForConditionalGeneration(cfg).to(torch_dtype)


def tiny_llava(torch_dtype, image_size):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              image_size=image_size, patch_size=14, projection_dim=64)
    text = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0)
    grid = image_size // 14
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=TINY_IDS["image"],
                      image_seq_length=grid * grid, vision_feature_layer=-2, vision_feature_select_strategy="default")
    return LlavaForConditionalGeneration(cfg).to(torch_dtype)


def model_family(config):
    mt = getattr(config, "model_type", "")
    if mt in ("qwen2_vl", "qwen2_5_vl") or hasattr(config, "vision_start_token_id"):
        return "qwen2-vl"
    if mt == "llava" or hasattr(config, "image_token_index"):
        return "llava"
    fail("model type '%s' is neither Qwen2-VL nor LLaVA family" % mt)


def load_model(name, torch_dtype, device):
    import transformers
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(name)
    mt = getattr(config, "model_type", "")
    classes = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
               "llava": "LlavaForConditionalGeneration"}
    cls = getattr(transformers, classes[mt], None) if mt in classes else None
    if cls is None:
        cls = getattr(transformers, "AutoModelForImageTextToText", None) or transformers.AutoModelForVision2Seq
    kw = {}
    if device.startswith("cuda"):
        kw["device_map"] = device
    try:
        model = cls.from_pretrained(name, dtype=torch_dtype, **kw)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = cls.from_pretrained(name, torch_dtype=torch_dtype, **kw)
    return model


def synthetic_images(count, size, seed):
    from PIL import Image
    rng = np.random.default_rng(seed)
    w, h = size
    out = []
    for _ in range(count):
        # Smooth colour blobs plus noise: something for a vision tower to look at.
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.zeros((h, w, 3), dtype=np.float64)
        for _ in range(4):
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.1, 0.4) * min(w, h)
            colour = rng.uniform(0, 255, size=3)
            mask = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
            img += mask[..., None] * colour
        img += rng.normal(0, 12, size=img.shape)
        out.append(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)))
    return out


def processor_inputs(processor, family, images, prompt):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt}]
    messages = [{"role": "user", "content": content}]
    text = None
    if getattr(processor, "chat_template", None):
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if text is None:
        if family == "llava":
            text = "USER: " + "<image>\n" * len(images) + prompt + " ASSISTANT:"
        else:
            text = "".join("<|vision_start|><|image_pad|><|vision_end|>" for _ in images) + prompt
    return processor(text=[text], images=images or None, return_tensors="pt")


def tiny_inputs(family, model, images, rng, max_pixels):
    """input_ids (random text tokens around the images), pixel values and grids for a tiny model."""
    import torch

    def text(n):
        return [int(t) for t in rng.integers(1, 900, size=n)]

    ids, mm = [], []
    extra = {}
    if not images:
        ids = text(32)
    elif family == "qwen2-vl":
        from transformers import Qwen2VLImageProcessor
        ip = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels)
        px = ip(images=images, return_tensors="pt")
        grids = px["image_grid_thw"].tolist()
        merge = model.config.vision_config.spatial_merge_size
        ids += text(12)
        for i, (t, h, w) in enumerate(grids):
            ids += [TINY_IDS["vision_start"]] + [TINY_IDS["image"]] * (t * h * w // (merge * merge)) + [TINY_IDS["vision_end"]]
            ids += text(5 if i + 1 < len(grids) else 18)
        extra = dict(pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"])
    else:
        from transformers import CLIPImageProcessor
        size = model.config.vision_config.image_size
        ip = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
        px = ip(images=images, return_tensors="pt")
        per = model.config.image_seq_length
        ids += text(12)
        for i in range(len(images)):
            ids += [TINY_IDS["image"]] * per
            ids += text(5 if i + 1 < len(images) else 18)
        extra = dict(pixel_values=px["pixel_values"])
    mm = [1 if t == TINY_IDS["image"] else 0 for t in ids]
    inputs = dict(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **extra)
    if family == "qwen2-vl" and images:
        inputs["mm_token_type_ids"] = torch.tensor([mm], dtype=torch.int)
    return inputs


def image_segments_info(family, model, inputs, n_images):
    """Per image: (tokens, grid_h, grid_w) in prompt order (grid 0 x 0 when unknown)."""
    out = []
    if family == "qwen2-vl":
        thw = inputs.get("image_grid_thw")
        merge = model.config.vision_config.spatial_merge_size
        if thw is not None:
            for t, h, w in thw.tolist():
                cnt = t * h * w // (merge * merge)
                out.append((cnt, h // merge, w // merge) if t == 1 else (cnt, 0, 0))
    else:
        cfg = model.config
        per = getattr(cfg, "image_seq_length", None)
        vc = cfg.vision_config
        g = vc.image_size // vc.patch_size
        strategy = getattr(cfg, "vision_feature_select_strategy", "default")
        cnt = g * g if strategy == "default" else g * g + 1
        if per is not None and per != cnt:
            cnt = per
        for _ in range(n_images):
            out.append((cnt, g, g) if cnt == g * g else (cnt, 0, 0))
    return out


def build_layout(ids, image_id, video_id, delimiters, images):
    """The Layout::parse spec of a token id list."""
    segs, i, n, img = [], 0, len(ids), 0
    while i < n:
        if ids[i] == image_id:
            j = i
            while j < n and ids[j] == image_id:
                j += 1
            run = j - i
            while run > 0:  # a run may hold several images back to back
                if img < len(images):
                    cnt, gh, gw = images[img]
                    img += 1
                else:
                    cnt, gh, gw = run, 0, 0
                if cnt > run:
                    fail("image %d needs %d tokens but its run of image tokens has %d" % (img - 1, cnt, run))
                segs.append("image:%d" % cnt + ("[%dx%d]" % (gh, gw) if gh > 0 and gh * gw == cnt else ""))
                run -= cnt
            i = j
        elif video_id is not None and ids[i] == video_id:
            fail("video tokens are not supported by this script yet")
        else:
            j = i
            while j < n and ids[j] != image_id and (video_id is None or ids[j] != video_id):
                j += 1
            start = i
            for p in range(i, j):
                if ids[p] in delimiters:
                    if p > start:
                        segs.append("text:%d" % (p - start))
                    segs.append("text:1")
                    start = p + 1
            if j > start:
                segs.append("text:%d" % (j - start))
            i = j
    return ",".join(segs)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def to_storage(t, dtype):
    """A float tensor as a numpy array of the storage dtype (bf16: its raw bits as uint16)."""
    import torch
    if dtype == "fp32":
        return t.to(torch.float32).numpy()
    if dtype == "fp16":
        return t.to(torch.float16).numpy()
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


SAFETENSORS_DTYPE = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def write_safetensors(path, names, arrays, dtype):
    """A minimal safetensors writer: 8-byte header length, JSON header padded to 8 bytes, the data."""
    header, offset = {}, 0
    for name, a in zip(names, arrays):
        header[name] = {"dtype": SAFETENSORS_DTYPE[dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in arrays:
            f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a model path or hub id (Qwen2-VL, Qwen2.5-VL or LLaVA family)")
    src.add_argument("--random-tiny", choices=["qwen2-vl", "llava"],
                     help="a small randomly initialised model built from the config classes (no weights needed)")
    ap.add_argument("--image", action="append", default=[], help="an image file (repeat for several)")
    ap.add_argument("--synthetic-images", type=int, default=0, help="add N synthetic random images")
    ap.add_argument("--image-size", default=None, help="synthetic image size WxH (default 448x448, tiny models 224x224)")
    ap.add_argument("--max-pixels", type=int, default=None, help="Qwen2-VL image processor max_pixels")
    ap.add_argument("--prompt", default="Describe the images in detail.", help="the text of the prompt")
    ap.add_argument("--decode-steps", type=int, default=0, help="also record N greedily generated tokens")
    ap.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default=None, help="storage dtype")
    ap.add_argument("--model-dtype", choices=["auto", "fp32", "fp16", "bf16"], default="auto")
    ap.add_argument("--format", choices=["npy", "safetensors"], default="npy")
    ap.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-verify", action="store_true", help="skip recomputing the prefill attention")
    ap.add_argument("--out", required=True, help="the dump directory to write")
    args = ap.parse_args()

    import torch
    import transformers

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if args.decode_steps < 0:
        fail("--decode-steps must be >= 0")
    if args.synthetic_images < 0:
        fail("--synthetic-images must be >= 0")

    t0 = time.time()
    if args.random_tiny:
        family = args.random_tiny
        torch_dtype = torch.float32 if args.model_dtype == "auto" else dtypes[args.model_dtype]
        size = tuple(int(x) for x in (args.image_size or "224x224").split("x"))
        model = tiny_qwen2vl(torch_dtype) if family == "qwen2-vl" else tiny_llava(torch_dtype, size[1])
        model = model.to(device)
        model_name = "random-tiny-" + family + " (transformers %s, seed %d)" % (transformers.__version__, args.seed)
    else:
        torch_dtype = "auto" if args.model_dtype == "auto" else dtypes[args.model_dtype]
        model = load_model(args.model, torch_dtype, device)  # placed on a CUDA device by device_map
        if not device.startswith("cuda"):
            model = model.to(device)
        family = model_family(model.config)
        size = tuple(int(x) for x in (args.image_size or "448x448").split("x"))
        model_name = args.model
    model.eval()

    from PIL import Image
    images = [Image.open(p).convert("RGB") for p in args.image]
    images += synthetic_images(args.synthetic_images, size, args.seed)

    if args.random_tiny:
        inputs = tiny_inputs(family, model, images, rng, args.max_pixels or 28 * 28 * 1280)
    else:
        from transformers import AutoProcessor
        processor = AutoProcessor.from_pretrained(args.model)
        if args.max_pixels is not None and hasattr(processor, "image_processor"):
            ip = processor.image_processor
            ip.max_pixels = args.max_pixels
            if isinstance(getattr(ip, "size", None), dict) and "longest_edge" in ip.size:
                ip.size["longest_edge"] = args.max_pixels
        inputs = dict(processor_inputs(processor, family, images, args.prompt))
    fwd = inspect.signature(model.forward).parameters
    inputs = {k: v for k, v in inputs.items() if k in fwd or k in ("attention_mask",)}
    if "mm_token_type_ids" in fwd and "mm_token_type_ids" not in inputs and "image_grid_thw" in inputs:
        # transformers 5 computes Qwen2-VL's M-RoPE positions from the modality of each token.
        ids_t = inputs["input_ids"]
        mm = (ids_t == model.config.image_token_id).int()
        if getattr(model.config, "video_token_id", None) is not None:
            mm = mm + 2 * (ids_t == model.config.video_token_id).int()
        inputs["mm_token_type_ids"] = mm
    inputs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in inputs.items()}
    if "pixel_values" in inputs and inputs["pixel_values"].is_floating_point():
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)

    text_cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers = text_cfg.num_hidden_layers
    H = text_cfg.num_attention_heads
    Hkv = getattr(text_cfg, "num_key_value_heads", None) or H
    attn = decoder_attention_modules(model, n_layers)
    d = getattr(attn[0], "head_dim", None) or getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // H

    recorder = Recorder(attn, sdpa_base(), verify=not args.no_verify)
    register_recorder(recorder)
    select_recorder(model, attn)

    ids = inputs["input_ids"][0].tolist()
    n = len(ids)
    with torch.no_grad():
        if args.decode_steps == 0:
            model(**inputs, use_cache=False)
            generated = []
        else:
            steps = args.decode_steps
            out = model.generate(**inputs, max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False)
            generated = out[0, n:n + steps].tolist()
    rows = n + args.decode_steps
    for l in range(n_layers):
        got = sum(x.shape[0] for x in recorder.q[l])
        if got != rows:
            fail("layer %d recorded %d rows, expected %d (prompt %d + decode steps %d)" % (l, got, rows, n, args.decode_steps))
    if not args.no_verify:
        tol = 2e-3 if model.dtype == torch.float32 else 3e-2
        print("verify: prefill attention recomputed from the recorded q/k/v, worst relative error %.2e (limit %.0e)"
              % (recorder.worst, tol))
        if not recorder.worst <= tol:
            fail("the recorded tensors do not reproduce the model's attention (relative error %.3e)" % recorder.worst)

    # Layout of the prompt.
    cfg = model.config
    image_id = getattr(cfg, "image_token_id", None)
    if image_id is None:
        image_id = getattr(cfg, "image_token_index", None)
    video_id = getattr(cfg, "video_token_id", None)
    delimiters = set()
    for key in ("vision_start_token_id", "vision_end_token_id"):
        if getattr(cfg, key, None) is not None:
            delimiters.add(getattr(cfg, key))
    n_images = len(images)
    layout = build_layout(ids, image_id, video_id, delimiters, image_segments_info(family, model, inputs, n_images))

    dtype = args.dtype or {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(model.dtype, "fp32")
    os.makedirs(args.out, exist_ok=True)
    names, arrays = [], []
    for l in range(n_layers):
        for which, parts, heads in (("q", recorder.q[l], H), ("k", recorder.k[l], Hkv), ("v", recorder.v[l], Hkv)):
            t = torch.cat(parts, dim=0)
            if tuple(t.shape) != (rows, heads, d):
                fail("layer %d %s has shape %s, expected %s" % (l, which, tuple(t.shape), (rows, heads, d)))
            a = to_storage(t, dtype)
            if args.format == "npy":
                np.save(os.path.join(args.out, "layer_%03d_%s.npy" % (l, which)), a)
            else:
                names.append("layers.%d.%s" % (l, which))
                arrays.append(a)
    if args.format == "safetensors":
        write_safetensors(os.path.join(args.out, "qkv.safetensors"), names, arrays, dtype)
    manifest = {
        "format": "vlsparse-qkv-dump",
        "version": 1,
        "model": model_name,
        "layers": n_layers,
        "heads": H,
        "kv_heads": Hkv,
        "head_dim": d,
        "dtype": dtype,
        "layout": layout,
        "positions": "post-RoPE",
        "storage": args.format,
        "decode_steps": args.decode_steps,
        "scale": recorder.scale,
        "input_ids": ids + generated,
        "transformers": transformers.__version__,
        "images": [os.path.basename(p) for p in args.image] + ["synthetic"] * args.synthetic_images,
        "prompt": args.prompt if not args.random_tiny else "(random token ids)",
    }
    if args.format == "safetensors":
        manifest["file"] = "qkv.safetensors"
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print("wrote %s: %s, %d layers, %d/%d heads, head_dim %d, %s, %d tokens (%s) + %d decode steps, %.1f s"
          % (args.out, model_name, n_layers, H, Hkv, d, dtype, n, layout, args.decode_steps, time.time() - t0))


if __name__ == "__main__":
    main()
