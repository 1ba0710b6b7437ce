// vlsparse/sim/safetensors.hpp -- a minimal reader and writer of .safetensors files.
//
// Format (https://github.com/huggingface/safetensors): an 8-byte little-endian unsigned header
// length N, then N bytes of UTF-8 JSON, then the data. The JSON maps each tensor name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with byte offsets relative to the start of the data; an optional "__metadata__" entry maps
// strings to strings. Tensors are C order, little-endian.
// Reading checks everything a malformed or truncated file can get wrong (header length beyond the
// file, bad JSON, missing or mistyped fields, unknown dtype, shape not matching the byte range,
// ranges beyond the data or overlapping) and throws vlsparse::error naming the file and the
// tensor. read_float() converts F32, F16 and BF16 to fp32; other dtypes are listed but not read.
// The writer lays the tensors out in the given order, padding the header with spaces to a multiple
// of 8 bytes, as the reference implementation does.
// Needs nlohmann/json (3.10 or newer). Include: <vlsparse/sim/safetensors.hpp>
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"

namespace vlsparse::sim {

// Bytes per element of a safetensors dtype; 0 when unknown.
inline std::size_t safetensors_itemsize(std::string_view dtype) {
    if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
    if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
    if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
    if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
    return 0;
}

// One tensor of a file: its header entry.
struct SafetensorsEntry {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;  // byte range within the data section
    // The element count; throws vlsparse::error when it does not fit int64 (SafetensorsFile rejects
    // such headers when it opens the file, so its entries never throw).
    std::int64_t numel() const {
        constexpr const char* fn = "SafetensorsEntry::numel";
        for (auto e : shape)
            if (e < 0)
                throw ::vlsparse::error(fn, ::vlsparse::concat("tensor '", name, "': negative extent ", e));
        for (auto e : shape)
            if (e == 0) return 0;
        std::int64_t n = 1;
        for (auto e : shape) {
            if (n > std::numeric_limits<std::int64_t>::max() / e)
                throw ::vlsparse::error(fn, "tensor '" + name + "': its shape has too many elements");
            n *= e;
        }
        return n;
    }
};

// A tensor to write: dtype, shape and its raw little-endian bytes.
struct SafetensorsTensor {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> data;
};

namespace detail {

using ::vlsparse::require;

inline std::uint64_t read_le64(const unsigned char* b) {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
    return v;
}

// Product of the extents with overflow checks.
inline std::uint64_t checked_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize, const char* fn,
                                   const std::string& where) {
    std::uint64_t n = itemsize, count = 1;  // bytes; elements (at most 2^63 - 1, SafetensorsEntry::numel)
    for (auto e : shape) require(e >= 0, fn, where, ": negative extent ", e, " in its shape");
    for (auto e : shape)
        if (e == 0) return 0;
    for (auto e : shape) {
        const auto u = static_cast<std::uint64_t>(e);
        if (n > std::numeric_limits<std::uint64_t>::max() / u ||
            count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / u)
            throw ::vlsparse::error(fn, where + ": its shape has too many elements");
        n *= u;
        count *= u;
    }
    return n;
}

}  // namespace detail

// An opened .safetensors file: the parsed, validated header; tensors are read on demand.
class SafetensorsFile {
public:
    explicit SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
        constexpr const char* fn = "read_safetensors";
        const std::string name = path_.string();
        std::error_code ec;
        const auto st = std::filesystem::status(path_, ec);
        detail::require(std::filesystem::exists(st), fn, "'", name, "': no such file");
        detail::require(!std::filesystem::is_directory(st), fn, "'", name, "': is a directory, expected a .safetensors file");
        std::ifstream f(path_, std::ios::binary);
        detail::require(static_cast<bool>(f), fn, "'", name, "': cannot open for reading");
        f.seekg(0, std::ios::end);
        const auto size = f.tellg();
        detail::require(size >= 0, fn, "'", name, "': cannot determine the file size");
        file_size_ = static_cast<std::uint64_t>(size);
        detail::require(file_size_ >= 8, fn, "'", name, "': ", file_size_,
                        " bytes is too short for the 8-byte header length (truncated file)");
        f.seekg(0, std::ios::beg);
        unsigned char len[8];
        f.read(reinterpret_cast<char*>(len), 8);
        detail::require(static_cast<bool>(f), fn, "'", name, "': read error");
        const std::uint64_t hlen = detail::read_le64(len);
        detail::require(hlen <= file_size_ - 8, fn, "'", name, "': header length ", hlen, " exceeds the ", file_size_ - 8,
                        " bytes after the length field (truncated file, or not a safetensors file)");
        detail::require(hlen <= 100'000'000, fn, "'", name, "': header length ", hlen, " is over 100 MB");
        std::string header(static_cast<std::size_t>(hlen), '\0');
        f.read(header.data(), static_cast<std::streamsize>(hlen));
        detail::require(static_cast<bool>(f), fn, "'", name, "': read error");
        data_start_ = 8 + hlen;
        parse_header(header);
    }

    const std::filesystem::path& path() const { return path_; }
    const std::vector<SafetensorsEntry>& tensors() const { return entries_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // The entry called `name`, or nullptr.
    const SafetensorsEntry* find(std::string_view name) const {
        for (const auto& e : entries_)
            if (e.name == name) return &e;
        return nullptr;
    }

    // The raw little-endian bytes of a tensor.
    std::vector<std::byte> read_bytes(const SafetensorsEntry& e) const {
        constexpr const char* fn = "read_safetensors";
        std::ifstream f(path_, std::ios::binary);
        detail::require(static_cast<bool>(f), fn, "'", path_.string(), "': cannot open for reading");
        std::vector<std::byte> out(static_cast<std::size_t>(e.end - e.begin));
        f.seekg(static_cast<std::streamoff>(data_start_ + e.begin), std::ios::beg);
        if (!out.empty()) f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
        detail::require(static_cast<bool>(f), fn, "'", path_.string(), "': tensor '", e.name,
                        "': read error (was the file truncated after it was opened?)");
        return out;
    }

    // A tensor's elements as fp32; F32, F16 and BF16 only.
    std::vector<float> read_float(std::string_view name) const {
        constexpr const char* fn = "read_safetensors";
        const SafetensorsEntry* e = find(name);
        detail::require(e != nullptr, fn, "'", path_.string(), "': no tensor named '", name, "'");
        detail::require(e->dtype == "F32" || e->dtype == "F16" || e->dtype == "BF16", fn, "'", path_.string(),
                        "': tensor '", e->name, "' has dtype ", e->dtype, ", expected F32, F16 or BF16");
        const auto raw = read_bytes(*e);
        const auto n = static_cast<std::size_t>(e->numel());
        std::vector<float> out(n);
        const auto* b = reinterpret_cast<const unsigned char*>(raw.data());
        if (e->dtype == "F32") {
            for (std::size_t i = 0; i < n; ++i) {
                const std::uint32_t u = static_cast<std::uint32_t>(b[4 * i]) | (static_cast<std::uint32_t>(b[4 * i + 1]) << 8) |
                                        (static_cast<std::uint32_t>(b[4 * i + 2]) << 16) |
                                        (static_cast<std::uint32_t>(b[4 * i + 3]) << 24);
                out[i] = ::vlsparse::bits_float(u);
            }
        } else {
            const bool bf = e->dtype == "BF16";
            for (std::size_t i = 0; i < n; ++i) {
                const auto u = static_cast<std::uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));
                out[i] = bf ? bfloat16::to_float(u) : half::to_float(u);
            }
        }
        return out;
    }

private:
    void parse_header(const std::string& header) {
        constexpr const char* fn = "read_safetensors";
        const std::string name = path_.string();
        nlohmann::ordered_json j;  // keeps the tensors in the header's order
        try {
            j = nlohmann::ordered_json::parse(header);
        } catch (const nlohmann::json::exception& ex) {
            throw ::vlsparse::error(fn, "'" + name + "': the header is not valid JSON (" + ex.what() + ")");
        }
        detail::require(j.is_object(), fn, "'", name, "': the header is not a JSON object");
        const std::uint64_t data_size = file_size_ - data_start_;
        for (auto it = j.begin(); it != j.end(); ++it) {
            const std::string& key = it.key();
            const auto& v = it.value();
            if (key == "__metadata__") {
                detail::require(v.is_object(), fn, "'", name, "': __metadata__ is not an object");
                for (auto m = v.begin(); m != v.end(); ++m) {
                    detail::require(m.value().is_string(), fn, "'", name, "': __metadata__ '", m.key(),
                                    "' is not a string");
                    metadata_[m.key()] = m.value().get<std::string>();
                }
                continue;
            }
            const std::string where = "'" + name + "': tensor '" + key + "'";
            detail::require(v.is_object(), fn, where, ": its entry is not an object");
            detail::require(v.contains("dtype") && v["dtype"].is_string(), fn, where, ": no string 'dtype'");
            detail::require(v.contains("shape") && v["shape"].is_array(), fn, where, ": no array 'shape'");
            detail::require(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                            fn, where, ": no 'data_offsets' [begin, end]");
            SafetensorsEntry e;
            e.name = key;
            e.dtype = v["dtype"].get<std::string>();
            for (const auto& x : v["shape"]) {
                detail::require(x.is_number_integer(), fn, where, ": 'shape' holds a non-integer");
                e.shape.push_back(x.get<std::int64_t>());
            }
            for (const auto& x : v["data_offsets"])
                detail::require(x.is_number_unsigned() || (x.is_number_integer() && x.get<std::int64_t>() >= 0), fn, where,
                                ": 'data_offsets' holds something other than non-negative integers");
            e.begin = v["data_offsets"][0].get<std::uint64_t>();
            e.end = v["data_offsets"][1].get<std::uint64_t>();
            const std::size_t item = safetensors_itemsize(e.dtype);
            detail::require(item != 0, fn, where, ": unknown dtype '", e.dtype,
                            "', expected one of F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2");
            detail::require(e.begin <= e.end, fn, where, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
            const std::uint64_t need = detail::checked_bytes(e.shape, item, fn, where);
            detail::require(e.end - e.begin == need, fn, where, ": shape of ", need / item, " ", e.dtype,
                            " elements needs ", need, " bytes, data_offsets [", e.begin, ", ", e.end, "] hold ",
                            e.end - e.begin);
            detail::require(e.end <= data_size, fn, where, ": data_offsets end at byte ", e.end, " but the file holds ",
                            data_size, " data bytes (truncated file)");
            entries_.push_back(std::move(e));
        }
        // Non-empty ranges sorted by their start must each begin at or after the end of the one before.
        // (Empty ranges hold no byte: left out, they cannot hide an overlap of their neighbours.)
        std::vector<const SafetensorsEntry*> sorted;
        for (const auto& e : entries_)
            if (e.begin != e.end) sorted.push_back(&e);
        std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->begin < b->begin; });
        for (std::size_t i = 1; i < sorted.size(); ++i)
            detail::require(sorted[i]->begin >= sorted[i - 1]->end, fn, "'", name, "': tensors '", sorted[i - 1]->name,
                            "' and '", sorted[i]->name, "' overlap in the data section");
    }

    std::filesystem::path path_;
    std::uint64_t file_size_ = 0, data_start_ = 0;
    std::vector<SafetensorsEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (in this order) and `metadata` as a .safetensors file, replacing any existing one.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
    constexpr const char* fn = "write_safetensors";
    const std::string name = path.string();
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        nlohmann::ordered_json m = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata) m[k] = v;
        j["__metadata__"] = m;
    }
    std::uint64_t offset = 0;
    for (const auto& t : tensors) {
        const std::string where = "'" + name + "': tensor '" + t.name + "'";
        detail::require(!t.name.empty() && t.name != "__metadata__", fn, where, ": invalid name");
        detail::require(!j.contains(t.name), fn, where, ": appears twice");
        const std::size_t item = safetensors_itemsize(t.dtype);
        detail::require(item != 0, fn, where, ": unknown dtype '", t.dtype, "'");
        const std::uint64_t need = detail::checked_bytes(t.shape, item, fn, where);
        detail::require(t.data.size() == need, fn, where, ": shape needs ", need, " bytes, the tensor holds ", t.data.size());
        j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + need}}};
        offset += need;
    }
    std::string header = j.dump();
    header.append((8 - header.size() % 8) % 8, ' ');
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    detail::require(static_cast<bool>(f), fn, "'", name, "': cannot open for writing");
    unsigned char len[8];
    std::uint64_t h = header.size();
    for (int i = 0; i < 8; ++i, h >>= 8) len[i] = static_cast<unsigned char>(h & 0xFF);
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& t : tensors)
        if (!t.data.empty()) f.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    f.close();
    detail::require(!f.fail(), fn, "'", name, "': write error");
}

// fp32 values as the raw little-endian bytes of a safetensors dtype (F32, F16 or BF16; rounding to nearest even).
inline std::vector<std::byte> safetensors_encode(const std::vector<float>& x, std::string_view dtype) {
    constexpr const char* fn = "safetensors_encode";
    ::vlsparse::require(dtype == "F32" || dtype == "F16" || dtype == "BF16", fn, "dtype '", dtype,
                                "', expected F32, F16 or BF16");
    const std::size_t item = dtype == "F32" ? 4 : 2;
    std::vector<std::byte> out(x.size() * item);
    auto* b = reinterpret_cast<unsigned char*>(out.data());
    for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint32_t u = dtype == "F32"   ? ::vlsparse::float_bits(x[i])
                          : dtype == "F16" ? half::from_float(x[i])
                                           : bfloat16::from_float(x[i]);
        for (std::size_t k = 0; k < item; ++k, u >>= 8) b[i * item + k] = static_cast<unsigned char>(u & 0xFF);
    }
    return out;
}

}  // namespace vlsparse::sim
