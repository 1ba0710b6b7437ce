// Fuzz target: Layout::parse (the prompt-layout spec string) and Layout::from_token_ids.
// Beyond "no crash": an accepted layout covers [0, n) with ordered, non-empty segments, parses back
// from its to_string() to an equal layout (and the same string), is accepted by the Layout(segments)
// constructor, and answers segment_of() at every segment's first and last token. Token ids made from
// the same bytes give a layout whose every token has the kind of its id.
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "vlsparse/core/layout.hpp"

using vlsparse::Layout;
using vlsparse::SegmentKind;

namespace {

void check_layout(const Layout& L, const char* what) {
    FUZZ_CHECK(L.size() >= 1, what, ": an accepted layout with no segment");
    std::int64_t expect = 0;
    for (std::size_t i = 0; i < L.size(); ++i) {
        const auto& s = L[i];
        FUZZ_CHECK(s.start == expect && s.length > 0, what, ": segment ", i, " at ", s.start, " of length ", s.length);
        if (s.kind == SegmentKind::video)
            FUZZ_CHECK(s.frames > 0 && s.tokens_per_frame > 0 && s.frames * s.tokens_per_frame == s.length, what,
                       ": video segment ", i, " frames x tokens_per_frame != length");
        expect = s.end();
        FUZZ_CHECK(L.segment_of(s.start) == i && L.segment_of(s.end() - 1) == i, what, ": segment_of(segment ", i, ")");
    }
    FUZZ_CHECK(L.n() == expect, what, ": n() = ", L.n(), ", segments end at ", expect);
    FUZZ_CHECK(L.count(SegmentKind::text) + L.count(SegmentKind::image) + L.count(SegmentKind::video) == L.n(), what,
               ": counts do not add up to n");
    const std::string s = L.to_string();
    Layout again;
    try {
        again = Layout::parse(s);
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, what, ": to_string() '", s, "' does not parse back: ", e.what());
    }
    FUZZ_CHECK(again == L, what, ": parse(to_string()) differs from the layout: '", s, "' -> '", again.to_string(), "'");
    FUZZ_CHECK(again.to_string() == s, what, ": to_string() is not stable: '", s, "' -> '", again.to_string(), "'");
    FUZZ_CHECK(Layout(L.segments()) == L, what, ": Layout(segments) differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // 1. The bytes as a spec string.
    const std::string_view spec(reinterpret_cast<const char*>(data), size);
    try {
        const Layout L = Layout::parse(spec);
        check_layout(L, "Layout::parse");
        // Without whitespace, a spec without leading zeros is its to_string().
        std::string clean;
        for (char c : spec)
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') clean.push_back(c);
        bool leading_zero = false;
        for (std::size_t i = 0; i + 1 < clean.size(); ++i)
            leading_zero |= clean[i] == '0' && (i == 0 || !std::isdigit(static_cast<unsigned char>(clean[i - 1]))) &&
                            std::isdigit(static_cast<unsigned char>(clean[i + 1]));
        if (!leading_zero)
            FUZZ_CHECK(clean == L.to_string(), "Layout::parse: '", clean, "' reads as '", L.to_string(), "'");
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
    }

    // 2. The bytes as token ids: 0 and 3 text, 1 the image token, 2 the video token (frames of
    // 1 + size % 4 tokens).
    if (size == 0) return 0;
    std::vector<std::int64_t> ids(size);
    for (std::size_t i = 0; i < size; ++i) ids[i] = data[i] % 4;
    const std::int64_t tpf = 1 + static_cast<std::int64_t>(size % 4);
    try {
        const Layout L = Layout::from_token_ids(ids, 1, std::optional<std::int64_t>(2), tpf);
        check_layout(L, "Layout::from_token_ids");
        FUZZ_CHECK(L.n() == static_cast<std::int64_t>(size), "from_token_ids: n = ", L.n(), " for ", size, " ids");
        for (std::size_t i = 0; i < size; ++i) {
            const SegmentKind want = ids[i] == 1 ? SegmentKind::image : ids[i] == 2 ? SegmentKind::video : SegmentKind::text;
            FUZZ_CHECK(L.kind_at(static_cast<std::int64_t>(i)) == want, "from_token_ids: token ", i, " has the wrong kind");
        }
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
    }
    return 0;
}
