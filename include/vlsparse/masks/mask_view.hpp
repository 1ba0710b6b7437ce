// vlsparse/masks/mask_view.hpp -- the mask of a prompt as plain pointers, for the host and the GPU.
//
//   mask_rule_allows(row, video, window, dilation, i, j, b, sink)
//       THE pair rule of the BlindSight templates and PureKV's video masks (masks/templates.hpp states
//       it in words), from what it needs of query row i (MaskRowFacts, read once per row) and of key j
//       (its image b, whether it is a sink). MaskContext::allows on the host and the prefill kernels
//       on the GPU both evaluate this one function.
//   MaskContextView<I>  a MaskContext's per-token arrays as pointers (host memory: MaskContext::view();
//                       device memory: cuda::MaskedPrefillPlan uploads them as int32), with
//                       row(), allows() and row_intervals(); I is the position type (int64 on the
//                       host, int32 in kernels).
//   BlockMaskView<I>    the same plus one template per query head (BlockMask::view()).
//
// Header-only, no allocation, usable in __host__ __device__ code (VLSPARSE_HD under nvcc).
// Include: <vlsparse/masks/mask_view.hpp> (templates.hpp and block_mask.hpp include it).
#pragma once

#include <cstdint>

#include "vlsparse/core/config.hpp"

namespace vlsparse {

// A load of mask data that nothing writes while it is read: through the read-only data cache in
// device code (the per-row facts are loaded once per row group of a kernel), a plain load on the host.
template <class T>
VLSPARSE_HD inline T mask_load(const T* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return *p;
#endif
}

// What the rule needs of a query row i (for one template).
template <class I>
struct MaskRowFacts {
    I a = -1;      // the row's image (video), -1 for text
    I hi = 0;      // keys at or past hi are not allowed (the image's end when bidirectional, else i + 1)
    I vs = 0;      // the first position of the row's image
    I T = 0;       // tokens per frame when the row's image is a video under a video mask, else 0
    int tmpl = 0;  // the template, as MaskTemplate's value (0 Dense, 1 Sink, 2 Document, 3 Document-Sink)
};

// Whether query i may see key j: b = the image of key j (-1 for text), sink = key j is a sink of its
// image; video = VideoMask's value (0 none, 1 spatial, 2 temporal, 3 spatial_temporal, 4 local_window,
// 5 atrous), window (0: tokens per frame) and dilation its parameters. The template first, then, for
// a video query and a key of the same video, the video mask.
template <class I>
VLSPARSE_HD constexpr bool mask_rule_allows(const MaskRowFacts<I>& r, int video, I window, I dilation, I i, I j, I b,
                                            bool sink) {
    if (j == i) return true;      // no row is empty
    if (r.a < 0) return j < i;    // text query: causal
    if (j >= r.hi) return false;  // after the query (after its image, when bidirectional)
    if (b < 0) return true;       // a text key before the query
    const int t = r.tmpl;
    if (b != r.a) return t == 0 ? true : (t == 2 ? false : sink);  // an earlier image: Dense all, Document none,
                                                                   // Sink / Document-Sink its sinks
    if (t == 1 && !sink) return false;  // Sink, own image: only its sinks (and i itself)
    if (r.T == 0) return true;          // an image, or no video mask
    if (j > i) return false;            // video masks are causal
    const I fi = (i - r.vs) / r.T, si = (i - r.vs) - fi * r.T, fj = (j - r.vs) / r.T, sj = (j - r.vs) - fj * r.T;
    const I W = window > 0 ? window : r.T;
    switch (video) {
        case 1: return fj == 0 || fj == fi;
        case 2: return fj == 0 || (fj == fi - 1 && sj == si);
        case 3: return fj == 0 || fj == fi || (fj == fi - 1 && sj == si);
        case 4: return i - j < W;
        case 5: return (i - j) % dilation == 0 && (i - j) / dilation < W;
        default: return true;
    }
}

// A MaskContext (masks/templates.hpp) as pointers into host or device memory.
template <class I>
struct MaskContextView {
    I n = 0;
    const std::int32_t* token_image = nullptr;  // [n] image of each token, -1 for text
    const std::uint8_t* token_sink = nullptr;   // [n] 1 when the token is a sink of its image
    const I* image_start = nullptr;             // [images]
    const I* image_end = nullptr;               // [images]
    const I* frame_tokens = nullptr;            // [images] tokens per frame of a video, 0 for an image
                                                // (may be null when video == 0)
    const I* sink_start = nullptr;              // [images + 1] offsets into sink_pos (row_intervals only)
    const I* sink_pos = nullptr;                // the sink positions of every image, ascending (row_intervals only)
    int bidirectional = 0;
    int video = 0;  // VideoMask
    I video_window = 0;
    I video_dilation = 1;

    VLSPARSE_HD MaskRowFacts<I> row(int tmpl, I i) const {
        MaskRowFacts<I> r;
        r.tmpl = tmpl;
        r.a = mask_load(token_image + i);
        r.hi = i + 1;
        if (r.a >= 0) {
            if (bidirectional) r.hi = mask_load(image_end + r.a);
            r.vs = mask_load(image_start + r.a);
            r.T = video ? mask_load(frame_tokens + r.a) : 0;
        }
        return r;
    }
    VLSPARSE_HD bool allows(int tmpl, I i, I j) const {
        return mask_rule_allows(row(tmpl, i), video, video_window, video_dilation, i, j, static_cast<I>(token_image[j]),
                                token_sink[j] != 0);
    }

    // The keys query i may see under template tmpl (the set allows(tmpl, i, j) gives over j), as
    // half-open intervals [lo, hi) handed to emit(lo, hi) in ascending order, disjoint and never
    // touching. O(images before i's image) per row when each image's sinks are one run of positions
    // (sink_fraction: its first tokens), plus O(sinks) of the images whose sinks are not (sink_offsets
    // with gaps) and of a video query's own video under the Sink template, plus O(window) for the
    // atrous video mask; no allocation, so a kernel can walk a row's intervals as the host does
    // (MaskContext::row_intervals collects them in a vector). Needs sink_start and sink_pos.
    template <class Emit>
    VLSPARSE_HD void row_intervals(int tmpl, I i, Emit&& emit) const {
        // Keys at or past `cap` belong to a video query's own video: the video mask decides them below.
        struct Merge {
            Emit& emit;
            I cap, lo = 0, hi = 0;
            bool open = false;
            VLSPARSE_HD void push(I l, I h) {
                if (h > cap) h = cap;
                if (l >= h) return;
                if (open && hi >= l) {
                    if (h > hi) hi = h;
                    return;
                }
                if (open) emit(lo, hi);
                lo = l, hi = h, open = true;
            }
            VLSPARSE_HD void finish() {
                if (open) emit(lo, hi);
                open = false;
            }
        };
        const MaskRowFacts<I> r = row(tmpl, i);
        Merge out{emit, r.T > 0 ? r.vs : n};  // n: past every key
        // Image b's sinks when they are one run of positions [p0, p1) (ascending and unique, so the span
        // equals the count): handed over as one interval instead of one per sink.
        auto sink_run = [&](I b, I& s0, I& e, I& p0, I& p1) {
            s0 = mask_load(sink_start + b);
            e = mask_load(sink_start + b + 1);
            if (s0 >= e) return false;
            p0 = mask_load(sink_pos + s0);
            p1 = mask_load(sink_pos + e - 1) + 1;
            return p1 - p0 == e - s0;
        };
        if (r.a < 0 || tmpl == 0) {
            out.push(0, r.hi);  // text: causal; Dense image query: everything before hi
        } else {
            I pos = 0;  // text between earlier images, their sinks unless Document
            for (I b = 0; b < r.a; ++b) {
                out.push(pos, mask_load(image_start + b));
                if (tmpl != 2) {
                    I s0, e, p0, p1;
                    if (sink_run(b, s0, e, p0, p1)) {
                        out.push(p0, p1);
                    } else {
                        for (I s = s0; s < e; ++s) {
                            const I p = mask_load(sink_pos + s);
                            out.push(p, p + 1);
                        }
                    }
                }
                pos = mask_load(image_end + b);
            }
            out.push(pos, r.vs);
            if (tmpl == 1) {  // Sink: the own image's sinks before hi, and i itself
                I s0, e, p0, p1;
                if (sink_run(r.a, s0, e, p0, p1)) {  // the part of the run before hi, with i in its place
                    const I q = p1 < r.hi ? p1 : r.hi;
                    if (i < p0) out.push(i, i + 1);
                    out.push(p0, q);
                    if (i >= p0) out.push(i, i + 1);
                } else {
                    bool self = false;
                    for (I s = s0; s < e; ++s) {
                        const I p = mask_load(sink_pos + s);
                        if (p >= r.hi) break;
                        if (!self && i < p) out.push(i, i + 1), self = true;
                        out.push(p, p + 1);
                    }
                    if (!self) out.push(i, i + 1);
                }
            } else {
                out.push(r.vs, r.hi);
            }
        }
        if (r.T > 0) {  // a video query: its own video's keys by the video mask (causal)
            out.cap = i + 1;
            const I vs = r.vs, T = r.T, fi = (i - vs) / T, si = (i - vs) - fi * T;
            const I W = video_window > 0 ? video_window : T;
            if (tmpl == 1) {  // Sink: the video's sinks before i that the video mask keeps, then i
                for (I s = mask_load(sink_start + r.a), e = mask_load(sink_start + r.a + 1); s < e; ++s) {
                    const I p = mask_load(sink_pos + s);
                    if (p >= i) break;
                    if (mask_rule_allows(r, video, video_window, video_dilation, i, p, r.a, true)) out.push(p, p + 1);
                }
                out.push(i, i + 1);
            } else if (video == 4) {  // local_window
                out.push(i - W + 1 > vs ? i - W + 1 : vs, i + 1);
            } else if (video == 5) {  // atrous
                I steps = (i - vs) / video_dilation;
                if (steps > W - 1) steps = W - 1;
                for (I s = steps; s >= 0; --s) out.push(i - s * video_dilation, i - s * video_dilation + 1);
            } else if (video >= 1 && video <= 3 && fi > 0) {  // spatial, temporal, spatial_temporal
                out.push(vs, vs + T);
                if (video != 1 && fi >= 2) out.push(vs + (fi - 1) * T + si, vs + (fi - 1) * T + si + 1);
                if (video == 2) out.push(i, i + 1);
                else out.push(vs + fi * T, i + 1);
            } else {  // the first frame (every mask keeps it whole), or an unknown mask value
                out.push(vs, i + 1);
            }
        }
        out.finish();
    }
};

// A BlockMask (masks/block_mask.hpp): the context and the template of each query head.
template <class I>
struct BlockMaskView {
    MaskContextView<I> context;
    const std::uint8_t* head_template = nullptr;  // [H] MaskTemplate of each query head

    VLSPARSE_HD bool allows(I h, I i, I j) const { return context.allows(head_template[h], i, j); }
};

}  // namespace vlsparse
