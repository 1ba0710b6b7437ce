// Fuzz target: the .safetensors reader (vlsparse::sim::SafetensorsFile, which the dump loader uses).
// Beyond "no crash": every accepted entry has a known dtype, a byte range inside the data section
// whose size is numel x itemsize, and no two non-empty ranges overlap; every tensor's bytes read back
// (and F32 / F16 / BF16 ones convert to floats). Written again with write_safetensors (tensors
// packed in header order) the file reads back to the same names, dtypes, shapes, bytes and metadata.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "vlsparse/sim/safetensors.hpp"

using vlsparse::sim::SafetensorsFile;
using vlsparse::sim::SafetensorsTensor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto in = fuzz::scratch() / "in.safetensors";
    fuzz::write_file(in, data, size);
    std::optional<SafetensorsFile> f;
    try {
        f.emplace(in);
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return 0;
    }
    FUZZ_CHECK(size >= 8, "accepted a file of ", size, " bytes");
    std::uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | data[i];
    const std::uint64_t data_size = size - 8 - hlen;

    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    std::vector<SafetensorsTensor> tensors;
    for (const auto& e : f->tensors()) {
        const std::size_t item = vlsparse::sim::safetensors_itemsize(e.dtype);
        FUZZ_CHECK(item != 0, "tensor '", e.name, "': accepted unknown dtype '", e.dtype, "'");
        const auto n = static_cast<std::uint64_t>(e.numel());
        FUZZ_CHECK(e.begin <= e.end && e.end <= data_size, "tensor '", e.name, "': range [", e.begin, ", ", e.end,
                   ") outside the ", data_size, " data bytes");
        FUZZ_CHECK(e.end - e.begin == n * item, "tensor '", e.name, "': range of ", e.end - e.begin, " bytes for ", n,
                   " elements of ", item);
        if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
        FUZZ_CHECK(f->find(e.name) != nullptr, "find('", e.name, "') found nothing");
        auto bytes = f->read_bytes(e);
        FUZZ_CHECK(bytes.size() == e.end - e.begin, "tensor '", e.name, "': read ", bytes.size(), " bytes");
        FUZZ_CHECK(std::equal(bytes.begin(), bytes.end(), reinterpret_cast<const std::byte*>(data) + 8 + hlen + e.begin),
                   "tensor '", e.name, "': read_bytes differs from the file");
        if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16")
            FUZZ_CHECK(f->read_float(e.name).size() == n, "tensor '", e.name, "': read_float size");
        tensors.push_back({e.name, e.dtype, e.shape, std::move(bytes)});
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i)
        FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second, "accepted overlapping tensors: [", ranges[i - 1].first, ", ",
                   ranges[i - 1].second, ") and [", ranges[i].first, ", ", ranges[i].second, ")");

    // Written again, read again: the same tensors and metadata.
    const auto out = fuzz::scratch() / "out.safetensors";
    try {
        vlsparse::sim::write_safetensors(out, tensors, f->metadata());
    } catch (const vlsparse::error& e) {
        // The writer refuses only names the reader accepts but cannot be written back: an empty name.
        bool empty_name = false;
        for (const auto& t : tensors) empty_name |= t.name.empty();
        FUZZ_CHECK(empty_name, "write_safetensors refused what the reader accepted: ", e.what());
        return 0;
    }
    SafetensorsFile g(out);
    FUZZ_CHECK(g.tensors().size() == tensors.size(), "rewritten file has ", g.tensors().size(), " tensors, expected ",
               tensors.size());
    FUZZ_CHECK(g.metadata() == f->metadata(), "rewritten metadata differs");
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const auto& e = g.tensors()[i];
        FUZZ_CHECK(e.name == tensors[i].name && e.dtype == tensors[i].dtype && e.shape == tensors[i].shape,
                   "rewritten tensor ", i, " ('", e.name, "') differs");
        FUZZ_CHECK(g.read_bytes(e) == tensors[i].data, "rewritten tensor '", e.name, "' has other bytes");
    }
    return 0;
}
