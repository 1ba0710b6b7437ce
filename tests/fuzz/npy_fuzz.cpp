// Fuzz target: the .npy reader (parse_npy, which read_npy calls on a file's bytes).
// Beyond "no crash": an accepted array holds exactly numel x itemsize bytes; written again (the
// header numpy writes + the data) it parses back to the same descr, shape and bytes; that rewrite is
// stable (rewriting it again gives the same bytes), and an input that already is in numpy's own v1.0
// form is reproduced byte for byte. Every element converts to double. read_npy on the same bytes in a
// file gives the same array.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "vlsparse/io/npy.hpp"

using vlsparse::NpyArray;

namespace {

std::string rewrite(const NpyArray& a) {
    std::string out = vlsparse::npy_header(a.descr, a.shape);
    out.append(reinterpret_cast<const char*>(a.data.data()), a.data.size());
    return out;
}

bool same(const NpyArray& a, const NpyArray& b) { return a.descr == b.descr && a.shape == b.shape && a.data == b.data; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    NpyArray a;
    try {
        a = vlsparse::parse_npy(bytes, "fuzz.npy");
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return 0;
    }
    const std::size_t item = a.itemsize();
    FUZZ_CHECK(item != 0, "accepted descr '", a.descr, "' has no item size");
    const auto n = static_cast<std::size_t>(a.numel());
    FUZZ_CHECK(a.data.size() == n * item, "accepted array holds ", a.data.size(), " bytes for ", n, " elements of ", item);
    const std::vector<double> values = a.to_double();
    FUZZ_CHECK(values.size() == n, "to_double gave ", values.size(), " values for ", n, " elements");

    std::string w;
    try {
        w = rewrite(a);
    } catch (const vlsparse::error& e) {
        // Only a header that cannot fit format 1.0 (65535 bytes) may be refused: a very long shape.
        FUZZ_CHECK(std::string_view(e.what()).find("does not fit format 1.0") != std::string_view::npos,
                   "npy_header refused an accepted array: ", e.what());
        return 0;
    }
    NpyArray b;
    try {
        b = vlsparse::parse_npy(std::span<const std::byte>(reinterpret_cast<const std::byte*>(w.data()), w.size()), "rewritten");
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "the rewritten array does not parse: ", e.what());
    }
    FUZZ_CHECK(same(a, b), "the rewritten array differs (descr '", a.descr, "' / '", b.descr, "')");
    FUZZ_CHECK(rewrite(b) == w, "rewriting is not stable");
    const bool v1 = size >= 8 && data[6] == 1 && data[7] == 0;
    const bool canonical_header = v1 && size >= w.size() - a.data.size() &&
                                  std::memcmp(data, w.data(), w.size() - a.data.size()) == 0;
    if (canonical_header)
        FUZZ_CHECK(size == w.size() && std::memcmp(data, w.data(), size) == 0, "a numpy-form file is not reproduced byte for byte");

    // The same bytes through read_npy (a file).
    const auto path = fuzz::scratch() / "in.npy";
    fuzz::write_file(path, data, size);
    NpyArray c;
    try {
        c = vlsparse::read_npy(path);
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "read_npy refused what parse_npy accepted: ", e.what());
    }
    FUZZ_CHECK(same(a, c), "read_npy differs from parse_npy");
    // write_npy writes the same bytes as the rewrite.
    vlsparse::write_npy(fuzz::scratch() / "out.npy", a);
    FUZZ_CHECK(fuzz::read_file(fuzz::scratch() / "out.npy") == w, "write_npy differs from npy_header + data");
    return 0;
}
