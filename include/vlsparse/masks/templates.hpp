// vlsparse/masks/templates.hpp -- BlindSight mask templates built from a prompt's layout.
//
//   allowed(i, j) for a prefill (query i and key j are positions in [0, n)):
//     j == i                                   always (no row is empty)
//     text query i                             j <= i (causal, dense)
//     image query i (image a), text key j      j <= i
//     image query i, key j in image a          Dense/Document/Document-Sink: j <= i (whole image when
//                                              bidirectional); Sink: j is a sink of a (and j <= i unless
//                                              bidirectional)
//     image query i, key j in image b < a      Dense: yes; Document: no; Sink, Document-Sink: j is a sink of b
//     key j after query i (or after image a when bidirectional): no
// BlindSight (Srikrishnan, Shah, Reinhardt 2025), Section 3 and 5.1; conventions in docs/blindsight.md.
// Sinks: the first ceil(sink_fraction * len) tokens of each image (default 0.1, Qwen family), or a
// list of fixed offsets inside each image (Gemma 3; offsets >= an image's length are ignored for it).
// Image and video segments are both "images" (one document each); text segments, delimiter tokens
// included, are always dense. Only prefill masks (n_q == n_k) are defined.
//
// PureKV video masks (ST-SpAttn and its ablations; docs/purekv.md), set on a
// context by make_video_mask_context, restrict the pairs of a video query i and a key j of the SAME
// video further (every other pair is left to the template): with F frames of T tokens, query i in
// frame f at slot s, key j in frame f' at slot s', j <= i always, j == i always allowed:
//     spatial           f' == 0  or  f' == f                  (first frame + own frame, causal)
//     temporal          f' == 0  or  (f' == f - 1 and s' == s)  (first frame + same slot one frame back)
//     spatial_temporal  spatial OR temporal (ST-SpAttn)
//     local_window      i - j < W                               (the W latest tokens; W = window, 0: T)
//     atrous            (i - j) % r == 0 and (i - j) / r < W      (W keys spaced r = dilation apart)
// allows(t, i, j) = template t allows (i, j) AND the video mask allows it; VideoMask::none (the
// default of make_mask_context) leaves the templates exactly as above.
// Include: <vlsparse/masks/templates.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/masks/mask_view.hpp"

namespace vlsparse {

// The four templates, in the order of increasing cost except Dense (Algorithm 1 tries Sink,
// Document, Document-Sink).
enum class MaskTemplate : std::uint8_t { dense = 0, sink = 1, document = 2, document_sink = 3 };
inline constexpr MaskTemplate kAllTemplates[] = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::document,
                                                 MaskTemplate::document_sink};

// The paper's names: "Dense", "Sink", "Document", "Document-Sink".
inline constexpr EnumName<MaskTemplate> kMaskTemplateNames[] = {{MaskTemplate::dense, "Dense"},
                                                                {MaskTemplate::sink, "Sink"},
                                                                {MaskTemplate::document, "Document"},
                                                                {MaskTemplate::document_sink, "Document-Sink"}};
constexpr std::span<const EnumName<MaskTemplate>> enum_names(MaskTemplate) { return kMaskTemplateNames; }
constexpr std::string_view to_string(MaskTemplate t) { return enum_name(t); }

inline MaskTemplate mask_template_from_string(std::string_view s, const char* fn = "mask_template_from_string") {
    if (const auto t = enum_from_name<MaskTemplate>(s)) return *t;
    throw error(fn, detail::concat("unknown mask template '", s, "', expected Dense, Sink, Document or Document-Sink"));
}

struct MaskOptions {
    double sink_fraction = 0.1;              // sinks: first ceil(sink_fraction * len) tokens of each image
    std::vector<std::int64_t> sink_offsets;  // non-empty: sinks at these offsets inside each image instead
    bool bidirectional_images = false;       // Gemma 3: an image query sees its whole image
};

// PureKV's video masks (the header comment gives each one's definition).
enum class VideoMask : std::uint8_t { none = 0, spatial = 1, temporal = 2, spatial_temporal = 3, local_window = 4, atrous = 5 };
inline constexpr VideoMask kVideoMasks[] = {VideoMask::spatial, VideoMask::temporal, VideoMask::spatial_temporal,
                                            VideoMask::local_window, VideoMask::atrous};

inline constexpr EnumName<VideoMask> kVideoMaskNames[] = {{VideoMask::none, "none"},
                                                          {VideoMask::spatial, "spatial"},
                                                          {VideoMask::temporal, "temporal"},
                                                          {VideoMask::spatial_temporal, "spatial_temporal"},
                                                          {VideoMask::local_window, "local_window"},
                                                          {VideoMask::atrous, "atrous"}};
constexpr std::span<const EnumName<VideoMask>> enum_names(VideoMask) { return kVideoMaskNames; }
constexpr std::string_view to_string(VideoMask m) { return enum_name(m); }

inline VideoMask video_mask_from_string(std::string_view s, const char* fn = "video_mask_from_string") {
    if (const auto m = enum_from_name<VideoMask>(s)) return *m;
    throw error(fn, detail::concat("unknown video mask '", s,
                                   "', expected none, spatial, temporal, spatial_temporal, local_window or atrous"));
}

struct VideoMaskOptions {
    VideoMask kind = VideoMask::spatial_temporal;  // ST-SpAttn
    std::int64_t window = 0;    // local_window, atrous: keys a video query sees in its video (itself included);
                                // 0 = the video's tokens per frame
    std::int64_t dilation = 2;  // atrous: distance between consecutive keys (>= 1; 1 is local_window)
};

inline void check_video_mask_options(const VideoMaskOptions& o, const char* fn) {
    detail::require(static_cast<std::uint8_t>(o.kind) <= static_cast<std::uint8_t>(VideoMask::atrous), fn,
                    "video mask kind has value ", static_cast<int>(o.kind),
                    ", expected none, spatial, temporal, spatial_temporal, local_window or atrous");
    detail::require(o.window >= 0, fn, "video mask window = ", o.window, ", expected >= 0 (0 = tokens per frame)");
    detail::require(o.dilation >= 1, fn, "video mask dilation = ", o.dilation, ", expected >= 1");
}

inline void check_mask_options(const MaskOptions& o, const char* fn) {
    detail::require(std::isfinite(o.sink_fraction) && o.sink_fraction > 0.0 && o.sink_fraction <= 1.0, fn,
                    "sink_fraction = ", o.sink_fraction, ", expected 0 < sink_fraction <= 1");
    for (std::size_t t = 0; t < o.sink_offsets.size(); ++t) {
        detail::require(o.sink_offsets[t] >= 0, fn, "sink_offsets[", t, "] = ", o.sink_offsets[t], ", expected >= 0");
        detail::require(t == 0 || o.sink_offsets[t] > o.sink_offsets[t - 1], fn, "sink_offsets[", t, "] = ",
                        o.sink_offsets[t], ", expected strictly ascending offsets");
    }
}

// A half-open interval of key positions [lo, hi).
struct KeyInterval {
    std::int64_t lo = 0, hi = 0;
};

// The mask description of one prompt: per-token arrays, plain data (what a kernel consumes).
struct MaskContext {
    std::int64_t n = 0;
    bool bidirectional_images = false;
    std::vector<std::int32_t> token_image;  // [n] image index of the token, -1 for text
    std::vector<std::uint8_t> token_sink;   // [n] 1 when the token is a sink of its image
    std::vector<std::int64_t> image_start;  // [images] first position
    std::vector<std::int64_t> image_end;    // [images] one past the last position
    std::vector<std::int64_t> sink_start;   // [images + 1] offsets into sink_pos
    std::vector<std::int64_t> sink_pos;     // sink positions of every image, ascending
    std::vector<std::int64_t> image_frame_tokens;  // [images] tokens per frame of a video segment, 0 for an image
    // PureKV video mask on video-query x same-video-key pairs (make_video_mask_context); none: no effect.
    VideoMask video = VideoMask::none;
    std::int64_t video_window = 0;    // local_window / atrous keys per query; 0 = tokens per frame
    std::int64_t video_dilation = 1;  // atrous spacing

    std::int64_t images() const { return static_cast<std::int64_t>(image_start.size()); }

    // The exact definition of the masks (the header comment), one pair at a time: the template, then
    // the video mask, by the one rule the GPU kernels evaluate too (masks/mask_view.hpp). Equal to
    // template_allows(t, i, j) && video_allows(i, j) (a test checks it pair by pair).
    bool allows(MaskTemplate t, std::int64_t i, std::int64_t j) const {
        return view().allows(static_cast<int>(t), i, j);
    }

    // The per-token arrays as pointers (valid while this context lives and is not modified).
    MaskContextView<std::int64_t> view() const {
        MaskContextView<std::int64_t> v;
        v.n = n;
        v.token_image = token_image.data();
        v.token_sink = token_sink.data();
        v.image_start = image_start.data();
        v.image_end = image_end.data();
        v.frame_tokens = image_frame_tokens.empty() ? nullptr : image_frame_tokens.data();
        v.sink_start = sink_start.data();
        v.sink_pos = sink_pos.data();
        v.bidirectional = bidirectional_images ? 1 : 0;
        v.video = static_cast<int>(video);
        v.video_window = video_window;
        v.video_dilation = video_dilation;
        return v;
    }

    // The template alone (the video mask ignored).
    bool template_allows(MaskTemplate t, std::int64_t i, std::int64_t j) const {
        if (j == i) return true;
        const std::int32_t a = token_image[static_cast<std::size_t>(i)];
        if (a < 0) return j < i;
        const std::int64_t hi = bidirectional_images ? image_end[static_cast<std::size_t>(a)] : i + 1;
        if (j >= hi) return false;
        const std::int32_t b = token_image[static_cast<std::size_t>(j)];
        if (b < 0) return true;  // text key before the query (or before its image)
        const bool sink = token_sink[static_cast<std::size_t>(j)] != 0;
        if (b == a) return t == MaskTemplate::sink ? sink : true;
        switch (t) {  // b < a
            case MaskTemplate::dense: return true;
            case MaskTemplate::document: return false;
            default: return sink;
        }
    }

    // The video mask alone: true unless i is a video token, j lies in the same video and the mask
    // (VideoMask) excludes the pair.
    bool video_allows(std::int64_t i, std::int64_t j) const {
        if (video == VideoMask::none || j == i) return true;
        const std::int32_t a = token_image[static_cast<std::size_t>(i)];
        if (a < 0 || token_image[static_cast<std::size_t>(j)] != a) return true;
        const std::int64_t T = image_frame_tokens[static_cast<std::size_t>(a)];
        if (T == 0) return true;  // an image, not a video
        if (j > i) return false;
        const std::int64_t vs = image_start[static_cast<std::size_t>(a)];
        const std::int64_t fi = (i - vs) / T, si = (i - vs) % T, fj = (j - vs) / T, sj = (j - vs) % T;
        const std::int64_t W = video_window > 0 ? video_window : T;
        switch (video) {
            case VideoMask::spatial: return fj == 0 || fj == fi;
            case VideoMask::temporal: return fj == 0 || (fj == fi - 1 && sj == si);
            case VideoMask::spatial_temporal: return fj == 0 || fj == fi || (fj == fi - 1 && sj == si);
            case VideoMask::local_window: return i - j < W;
            case VideoMask::atrous: return (i - j) % video_dilation == 0 && (i - j) / video_dilation < W;
            case VideoMask::none: break;
        }
        return true;
    }

    // The keys query i may see, as sorted disjoint non-adjacent intervals (appended to `out` after
    // clearing it). Same set as allows(t, i, j) over j; O(segments + sinks) per row, plus O(window)
    // for the atrous video mask. One definition for the host and the GPU: MaskContextView::row_intervals.
    void row_intervals(MaskTemplate t, std::int64_t i, std::vector<KeyInterval>& out) const {
        out.clear();
        view().row_intervals(static_cast<int>(t), i,
                             [&](std::int64_t lo, std::int64_t hi) { out.push_back(KeyInterval{lo, hi}); });
    }

    // Number of keys query i may see.
    std::int64_t row_count(MaskTemplate t, std::int64_t i, std::vector<KeyInterval>& scratch) const {
        row_intervals(t, i, scratch);
        std::int64_t c = 0;
        for (const auto& iv : scratch) c += iv.hi - iv.lo;
        return c;
    }
};

// Builds the mask description of a layout. Throws on bad options.
inline MaskContext make_mask_context(const Layout& layout, const MaskOptions& opt = {}) {
    constexpr const char* fn = "make_mask_context";
    check_mask_options(opt, fn);
    detail::require(layout.n() > 0, fn, "empty layout, expected at least one token");
    MaskContext c;
    c.n = layout.n();
    c.bidirectional_images = opt.bidirectional_images;
    c.token_image.assign(static_cast<std::size_t>(c.n), -1);
    c.token_sink.assign(static_cast<std::size_t>(c.n), 0);
    c.sink_start.push_back(0);
    for (const auto& s : layout.segments()) {
        if (!s.is_visual()) continue;
        const auto img = static_cast<std::int32_t>(c.image_start.size());
        c.image_start.push_back(s.start);
        c.image_end.push_back(s.end());
        c.image_frame_tokens.push_back(s.kind == SegmentKind::video ? s.tokens_per_frame : 0);
        for (std::int64_t p = s.start; p < s.end(); ++p) c.token_image[static_cast<std::size_t>(p)] = img;
        if (opt.sink_offsets.empty()) {
            // ceil(fraction * len), computed so that exact products (0.25 * 8 = 2) are not pushed up by rounding.
            const double x = opt.sink_fraction * static_cast<double>(s.length);
            auto cnt = static_cast<std::int64_t>(std::ceil(x - 1e-9 * std::max(1.0, x)));
            cnt = std::clamp<std::int64_t>(cnt, 1, s.length);
            for (std::int64_t p = s.start; p < s.start + cnt; ++p) c.sink_pos.push_back(p);
        } else {
            for (auto off : opt.sink_offsets)
                if (off < s.length) c.sink_pos.push_back(s.start + off);
        }
        c.sink_start.push_back(static_cast<std::int64_t>(c.sink_pos.size()));
    }
    for (auto p : c.sink_pos) c.token_sink[static_cast<std::size_t>(p)] = 1;
    return c;
}

// The mask description of a layout with a PureKV video mask on its video segments (ST-SpAttn by
// default). `mask` sets the sinks and bidirectionality the templates use (PureKV itself pairs the
// video mask with the Dense template on every head). Throws on bad options.
inline MaskContext make_video_mask_context(const Layout& layout, const VideoMaskOptions& video,
                                           const MaskOptions& mask = {}) {
    constexpr const char* fn = "make_video_mask_context";
    check_video_mask_options(video, fn);
    MaskContext c = make_mask_context(layout, mask);
    c.video = video.kind;
    c.video_window = video.window;
    c.video_dilation = video.dilation;
    return c;
}

// Dense boolean expansion [n, n] (row-major, 1 = allowed) of one template: for tests and pictures.
inline std::vector<std::uint8_t> expand_mask(const MaskContext& c, MaskTemplate t) {
    std::vector<std::uint8_t> m(static_cast<std::size_t>(c.n * c.n), 0);
    for (std::int64_t i = 0; i < c.n; ++i)
        for (std::int64_t j = 0; j < c.n; ++j) m[static_cast<std::size_t>(i * c.n + j)] = c.allows(t, i, j) ? 1 : 0;
    return m;
}

}  // namespace vlsparse
