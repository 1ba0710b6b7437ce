// vlsparse/core/layout.hpp -- the layout of a prompt: ordered text / image / video segments covering [0, n).
//
// Spec strings (comma separated, whitespace ignored):
//   text:35                 35 text tokens (delimiters such as <image_start> are text segments of length 1)
//   image:576               one image of 576 tokens
//   image:576[24x24]        ... with its h x w token grid (h * w must equal the count)
//   video:64x144            64 frames x 144 tokens per frame
//   video:64x144[12x12]     ... with the per-frame h x w grid (h * w must equal tokens per frame)
// e.g. "text:35,image:576,text:22" or "text:14,video:64x144,text:30".
// Every malformed layout (gap, overlap, zero length, beyond n, grid not matching) throws
// vlsparse::error naming the segment.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"

namespace vlsparse {

enum class SegmentKind : std::uint8_t { text, image, video };

inline constexpr EnumName<SegmentKind> kSegmentKindNames[] = {
    {SegmentKind::text, "text"}, {SegmentKind::image, "image"}, {SegmentKind::video, "video"}};
constexpr std::span<const EnumName<SegmentKind>> enum_names(SegmentKind) { return kSegmentKindNames; }
constexpr std::string_view to_string(SegmentKind k) { return enum_name(k); }

struct Segment {
    SegmentKind kind = SegmentKind::text;
    std::int64_t start = 0;   // first token position
    std::int64_t length = 0;  // number of tokens
    // Image: optional token grid (0 = unknown). Video: per-frame grid (0 = unknown).
    std::int64_t grid_h = 0, grid_w = 0;
    // Video only: frames x tokens_per_frame == length.
    std::int64_t frames = 0, tokens_per_frame = 0;

    std::int64_t end() const { return start + length; }
    bool is_visual() const { return kind != SegmentKind::text; }

    static Segment text(std::int64_t start, std::int64_t length) { return {SegmentKind::text, start, length}; }
    static Segment image(std::int64_t start, std::int64_t length, std::int64_t h = 0, std::int64_t w = 0) {
        return {SegmentKind::image, start, length, h, w};
    }
    static Segment video(std::int64_t start, std::int64_t frames, std::int64_t tokens_per_frame, std::int64_t h = 0,
                         std::int64_t w = 0) {
        return {SegmentKind::video, start, frames * tokens_per_frame, h, w, frames, tokens_per_frame};
    }
};

class Layout {
public:
    Layout() = default;

    // Validates: segments ordered, contiguous from 0, non-empty, grids matching. Throws vlsparse::error.
    explicit Layout(std::vector<Segment> segments) : segs_(std::move(segments)) { validate(); }

    // A single text segment of n tokens (a text-only prompt).
    static Layout text_only(std::int64_t n) {
        detail::require(n > 0, "Layout::text_only", "n = ", n, ", expected n > 0");
        return Layout({Segment::text(0, n)});
    }

    static Layout parse(std::string_view spec);

    // Layout from token ids: maximal runs of `image_token_id` become image segments, runs of
    // `video_token_id` become video segments of `tokens_per_frame`-token frames; everything else is text.
    static Layout from_token_ids(std::span<const std::int64_t> ids, std::int64_t image_token_id,
                                 std::optional<std::int64_t> video_token_id = std::nullopt,
                                 std::int64_t tokens_per_frame = 0);

    std::int64_t n() const { return segs_.empty() ? 0 : segs_.back().end(); }
    const std::vector<Segment>& segments() const { return segs_; }
    std::size_t size() const { return segs_.size(); }
    const Segment& operator[](std::size_t i) const { return segs_[i]; }

    // Index of the segment that holds position `pos` (0 <= pos < n).
    std::size_t segment_of(std::int64_t pos) const {
        detail::require(pos >= 0 && pos < n(), "Layout::segment_of", "pos = ", pos, ", expected 0 <= pos < ", n());
        auto it = std::upper_bound(segs_.begin(), segs_.end(), pos,
                                   [](std::int64_t p, const Segment& s) { return p < s.start; });
        return static_cast<std::size_t>(it - segs_.begin()) - 1;
    }
    SegmentKind kind_at(std::int64_t pos) const { return segs_[segment_of(pos)].kind; }
    bool is_text(std::int64_t pos) const { return kind_at(pos) == SegmentKind::text; }

    std::int64_t count(SegmentKind k) const {
        std::int64_t c = 0;
        for (const auto& s : segs_) c += s.kind == k ? s.length : 0;
        return c;
    }
    // Per-token flag: 1 for text tokens, 0 for image/video tokens.
    std::vector<std::uint8_t> text_mask() const {
        std::vector<std::uint8_t> m(static_cast<std::size_t>(n()), 0);
        for (const auto& s : segs_)
            if (s.kind == SegmentKind::text) std::fill(m.begin() + s.start, m.begin() + s.end(), 1);
        return m;
    }

    // The spec string of this layout (parse(to_string()) == *this).
    std::string to_string() const;

    // Throws unless n() == expected_n, naming the caller.
    void require_tokens(std::int64_t expected_n, const char* fn) const {
        detail::require(n() == expected_n, fn, "layout covers ", n(), " tokens (", to_string(), "), but the input has ",
                        expected_n, " tokens");
    }

    bool operator==(const Layout& o) const {
        if (segs_.size() != o.segs_.size()) return false;
        for (std::size_t i = 0; i < segs_.size(); ++i) {
            const auto &a = segs_[i], &b = o.segs_[i];
            if (a.kind != b.kind || a.start != b.start || a.length != b.length || a.grid_h != b.grid_h ||
                a.grid_w != b.grid_w || a.frames != b.frames || a.tokens_per_frame != b.tokens_per_frame)
                return false;
        }
        return true;
    }

private:
    void validate() const;
    std::vector<Segment> segs_;
};

inline void Layout::validate() const {
    constexpr const char* fn = "Layout";
    detail::require(!segs_.empty(), fn, "a layout needs at least one segment");
    std::int64_t expect = 0;
    for (std::size_t i = 0; i < segs_.size(); ++i) {
        const Segment& s = segs_[i];
        const auto kind = enum_name(s.kind);
        detail::require(s.length > 0, fn, "segment ", i, " (", kind, ") has length ", s.length, ", expected > 0");
        detail::require(s.length <= std::numeric_limits<std::int64_t>::max() - expect, fn, "segment ", i, " (", kind,
                        ") has length ", s.length, ", which overflows the token count");
        detail::require(s.start == expect, fn, "segment ", i, " (", kind, ") starts at ", s.start, ", expected ", expect,
                        s.start > expect ? " (gap after the previous segment)" : " (overlaps the previous segment)");
        if (s.kind == SegmentKind::video) {
            detail::require(s.frames > 0 && s.tokens_per_frame > 0 && s.frames <= s.length / s.tokens_per_frame &&
                                s.frames * s.tokens_per_frame == s.length,
                            fn, "segment ", i, " (video) has ", s.frames, " frames x ", s.tokens_per_frame,
                            " tokens, which does not match its length ", s.length);
        } else {
            detail::require(s.frames == 0 && s.tokens_per_frame == 0, fn, "segment ", i, " (", kind,
                            ") has frames set; only video segments have frames");
        }
        if (s.kind == SegmentKind::text) {
            detail::require(s.grid_h == 0 && s.grid_w == 0, fn, "segment ", i, " (text) has a grid; only image and video segments have one");
        } else if (s.grid_h != 0 || s.grid_w != 0) {
            const std::int64_t cells = s.kind == SegmentKind::image ? s.length : s.tokens_per_frame;
            detail::require(s.grid_h > 0 && s.grid_w > 0 && s.grid_h <= cells / s.grid_w && s.grid_h * s.grid_w == cells,
                            fn, "segment ", i, " (", kind, ") grid ", s.grid_h, "x", s.grid_w, " does not match its ", cells,
                            s.kind == SegmentKind::image ? " tokens" : " tokens per frame");
        }
        expect = s.end();
    }
}

namespace detail {
inline std::int64_t parse_count(std::string_view t, std::string_view item, std::size_t index) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    require(!t.empty() && t.front() != '-' && ec == std::errc() && p == t.data() + t.size(), "Layout::parse",
            "segment ", index, " '", item, "': '", t, "' is not a non-negative integer");
    return v;
}
// Parses "AxB" into two counts.
inline std::pair<std::int64_t, std::int64_t> parse_pair(std::string_view t, std::string_view item, std::size_t index) {
    const auto x = t.find('x');
    require(x != std::string_view::npos, "Layout::parse", "segment ", index, " '", item, "': expected AxB, got '", t,
            "'");
    return {parse_count(t.substr(0, x), item, index), parse_count(t.substr(x + 1), item, index)};
}
}  // namespace detail

inline Layout Layout::parse(std::string_view spec) {
    constexpr const char* fn = "Layout::parse";
    std::string clean;
    for (char c : spec)
        if (!std::isspace(static_cast<unsigned char>(c))) clean.push_back(c);
    detail::require(!clean.empty(), fn, "empty layout spec; expected e.g. \"text:35,image:576,text:22\"");
    std::vector<Segment> segs;
    std::int64_t pos = 0;
    std::size_t begin = 0, index = 0;
    std::string_view all(clean);
    while (begin <= all.size()) {
        std::size_t comma = all.find(',', begin);
        if (comma == std::string_view::npos) comma = all.size();
        const std::string_view item = all.substr(begin, comma - begin);
        detail::require(!item.empty(), fn, "segment ", index, " is empty (two commas in a row, or a trailing comma) in '",
                        spec, "'");
        const auto colon = item.find(':');
        detail::require(colon != std::string_view::npos, fn, "segment ", index, " '", item,
                        "': expected kind:count with kind text, image or video");
        const std::string_view kind_name = item.substr(0, colon);
        const std::optional<SegmentKind> kind = enum_from_name<SegmentKind>(kind_name);
        std::string_view rest = item.substr(colon + 1);
        std::int64_t gh = 0, gw = 0;
        if (const auto br = rest.find('['); br != std::string_view::npos) {
            detail::require(rest.back() == ']', fn, "segment ", index, " '", item, "': unterminated grid '[...]'");
            std::tie(gh, gw) = detail::parse_pair(rest.substr(br + 1, rest.size() - br - 2), item, index);
            detail::require(gh > 0 && gw > 0, fn, "segment ", index, " '", item, "': grid extents must be > 0");
            rest = rest.substr(0, br);
        }
        Segment s;
        if (kind == SegmentKind::text || kind == SegmentKind::image) {
            const std::int64_t len = detail::parse_count(rest, item, index);
            detail::require(len > 0, fn, "segment ", index, " '", item, "' has length 0, expected > 0");
            detail::require(kind == SegmentKind::image || (gh == 0 && gw == 0), fn, "segment ", index, " '", item,
                            "': text segments have no grid");
            s = kind == SegmentKind::text ? Segment::text(pos, len) : Segment::image(pos, len, gh, gw);
        } else if (kind == SegmentKind::video) {
            auto [frames, tpf] = detail::parse_pair(rest, item, index);
            detail::require(frames > 0 && tpf > 0, fn, "segment ", index, " '", item,
                            "': expected frames x tokens-per-frame, both > 0");
            detail::require(frames <= std::numeric_limits<std::int64_t>::max() / tpf, fn, "segment ", index, " '", item,
                            "': frames x tokens-per-frame overflows int64");
            s = Segment::video(pos, frames, tpf, gh, gw);
        } else {
            throw error(fn, detail::concat("segment ", index, " '", item, "': unknown kind '", kind_name,
                                           "', expected text, image or video"));
        }
        detail::require(s.length <= std::numeric_limits<std::int64_t>::max() - pos, fn, "segment ", index, " '", item,
                        "': the token count overflows int64");
        segs.push_back(s);
        pos += s.length;
        ++index;
        if (comma == all.size()) break;
        begin = comma + 1;
    }
    return Layout(std::move(segs));
}

inline Layout Layout::from_token_ids(std::span<const std::int64_t> ids, std::int64_t image_token_id,
                                     std::optional<std::int64_t> video_token_id, std::int64_t tokens_per_frame) {
    constexpr const char* fn = "Layout::from_token_ids";
    detail::require(!ids.empty(), fn, "no token ids");
    detail::require(!video_token_id || tokens_per_frame > 0, fn, "tokens_per_frame = ", tokens_per_frame,
                    ", expected > 0 when a video token id is given");
    std::vector<Segment> segs;
    const auto n = static_cast<std::int64_t>(ids.size());
    std::int64_t i = 0;
    auto kind_of = [&](std::int64_t id) {
        if (id == image_token_id) return SegmentKind::image;
        if (video_token_id && id == *video_token_id) return SegmentKind::video;
        return SegmentKind::text;
    };
    while (i < n) {
        const SegmentKind k = kind_of(ids[i]);
        std::int64_t j = i;
        while (j < n && kind_of(ids[j]) == k) ++j;
        if (k == SegmentKind::video) {
            detail::require((j - i) % tokens_per_frame == 0, fn, "video run at ", i, " has ", j - i,
                            " tokens, not a multiple of tokens_per_frame = ", tokens_per_frame);
            segs.push_back(Segment::video(i, (j - i) / tokens_per_frame, tokens_per_frame));
        } else {
            segs.push_back(Segment{k, i, j - i});
        }
        i = j;
    }
    return Layout(std::move(segs));
}

inline std::string Layout::to_string() const {
    std::string out;
    for (const auto& s : segs_) {
        if (!out.empty()) out += ',';
        out += enum_name(s.kind);
        out += ':';
        // Appends only: `std::to_string(a) + "x" + ...` draws a -Wrestrict false positive from GCC 12 at -O3.
        if (s.kind == SegmentKind::video) {
            out += std::to_string(s.frames);
            out += 'x';
            out += std::to_string(s.tokens_per_frame);
        } else {
            out += std::to_string(s.length);
        }
        if (s.grid_h || s.grid_w) {
            out += '[';
            out += std::to_string(s.grid_h);
            out += 'x';
            out += std::to_string(s.grid_w);
            out += ']';
        }
    }
    return out;
}

}  // namespace vlsparse
