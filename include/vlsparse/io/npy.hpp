// vlsparse/io/npy.hpp -- read and write NumPy .npy files (format 1.0, little-endian, C order).
//
// A .npy file is the 6-byte magic "\x93NUMPY", a version (1, 0), a little-endian uint16 header
// length, and an ASCII Python dict {'descr': ..., 'fortran_order': False, 'shape': (...), }, padded
// with spaces and ended by '\n' so that magic + header is a multiple of 64 bytes; then the raw data.
// Files written here are byte-for-byte what numpy.save (numpy >= 1.23) writes for the same array.
//
// Element types and their descr:
//   float '<f4', double '<f8', vlsparse::half '<f2', int64 '<i8', int32 '<i4', int16 '<i2', int8 '|i1',
//   uint64 '<u8', uint32 '<u4', uint16 '<u2', uint8 '|u1', bool '|b1',
//   vlsparse::bfloat16 '<u2': numpy has no bfloat16, so bf16 tensors are stored as their raw 16 bits
//   (uint16). In numpy, recover the values with
//       (a.astype(np.uint32) << 16).view(np.float32)
// Reading accepts versions 1.0, 2.0 and 3.0 (they differ only in the header length field and text
// encoding) and the descr values above. Every malformed file (bad magic, other version, Fortran
// order, big-endian or unknown descr, truncated or oversized data, unreadable path) throws
// vlsparse::error naming the file and the problem. No dependency beyond the standard library.
// Include: <vlsparse/io/npy.hpp> (also in <vlsparse/vlsparse.hpp>)
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"

namespace vlsparse {

// The numpy descr of each C++ element type that .npy files can hold.
template <class T>
struct npy_type;
template <> struct npy_type<float> { static constexpr std::string_view descr = "<f4"; };
template <> struct npy_type<double> { static constexpr std::string_view descr = "<f8"; };
template <> struct npy_type<half> { static constexpr std::string_view descr = "<f2"; };
template <> struct npy_type<bfloat16> { static constexpr std::string_view descr = "<u2"; };  // raw bits
template <> struct npy_type<std::int8_t> { static constexpr std::string_view descr = "|i1"; };
template <> struct npy_type<std::int16_t> { static constexpr std::string_view descr = "<i2"; };
template <> struct npy_type<std::int32_t> { static constexpr std::string_view descr = "<i4"; };
template <> struct npy_type<std::int64_t> { static constexpr std::string_view descr = "<i8"; };
template <> struct npy_type<std::uint8_t> { static constexpr std::string_view descr = "|u1"; };
template <> struct npy_type<std::uint16_t> { static constexpr std::string_view descr = "<u2"; };
template <> struct npy_type<std::uint32_t> { static constexpr std::string_view descr = "<u4"; };
template <> struct npy_type<std::uint64_t> { static constexpr std::string_view descr = "<u8"; };
template <> struct npy_type<bool> { static constexpr std::string_view descr = "|b1"; };

template <class T>
concept NpyElement = requires { npy_type<std::remove_const_t<T>>::descr; };

// How to_double() reads '<u2' data, which is either uint16 or the raw bits of bfloat16.
enum class U2As : std::uint8_t { uint16, bfloat16 };

// A shape as Python writes a tuple, the form of .npy headers and of this library's messages:
// (), (3,), (2, 3).
inline std::string npy_shape_repr(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    if (shape.size() == 1) s += ",";
    return s + ")";
}

namespace detail {

// Size in bytes of a supported, normalized descr; 0 when unsupported.
inline std::size_t npy_itemsize(std::string_view d) {
    if (d == "<f2" || d == "<i2" || d == "<u2") return 2;
    if (d == "<f4" || d == "<i4" || d == "<u4") return 4;
    if (d == "<f8" || d == "<i8" || d == "<u8") return 8;
    if (d == "|i1" || d == "|u1" || d == "|b1") return 1;
    return 0;
}

inline constexpr const char* npy_supported =
    "'<f2', '<f4', '<f8', '|i1', '<i2', '<i4', '<i8', '|u1', '<u2', '<u4', '<u8', '|b1'";

using ::vlsparse::npy_shape_repr;

// Product of the extents; throws on a negative extent or overflow.
inline std::int64_t npy_numel(const std::vector<std::int64_t>& shape, const char* fn, std::string_view what) {
    std::int64_t n = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
        require(shape[i] >= 0, fn, what, ": shape ", npy_shape_repr(shape), " has a negative extent in dimension ", i);
        if (shape[i] != 0 && n > std::numeric_limits<std::int64_t>::max() / shape[i])
            throw ::vlsparse::error(fn, concat(what, ": shape ", npy_shape_repr(shape), " has too many elements"));
        n *= shape[i];
    }
    return n;
}

// The data bytes of `shape` with elements of `itemsize` bytes; throws when the count does not fit
// size_t (the product of extents is checked by npy_numel, the byte count here: (2^61 + 1,) of '<f8'
// has 2^61 + 1 elements but 2^64 + 8 bytes).
inline std::size_t npy_nbytes(const std::vector<std::int64_t>& shape, std::size_t itemsize, std::string_view descr,
                              const char* fn, std::string_view what) {
    const auto n = static_cast<std::uint64_t>(npy_numel(shape, fn, what));
    if (itemsize != 0 && n > std::numeric_limits<std::size_t>::max() / itemsize)
        throw ::vlsparse::error(fn, concat(what, ": shape ", npy_shape_repr(shape), " of '", descr,
                                           "' has too many bytes (more than 2^64)"));
    return static_cast<std::size_t>(n * itemsize);
}

// Element bytes in little-endian order (a plain copy on little-endian hosts).
inline void npy_copy_le(void* dst, const void* src, std::size_t count, std::size_t itemsize) {
    if (count == 0) return;
    if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(dst, src, count * itemsize);
    } else {
        auto* d = static_cast<unsigned char*>(dst);
        const auto* s = static_cast<const unsigned char*>(src);
        for (std::size_t i = 0; i < count; ++i)
            for (std::size_t b = 0; b < itemsize; ++b) d[i * itemsize + b] = s[i * itemsize + itemsize - 1 - b];
    }
}

// A minimal parser of the header dict numpy writes (a Python literal).
class NpyHeaderParser {
public:
    NpyHeaderParser(std::string_view text, std::string_view name) : t_(text), name_(name) {}

    void parse(std::string& descr, bool& fortran, std::vector<std::int64_t>& shape) {
        bool has_descr = false, has_fortran = false, has_shape = false;
        skip_ws();
        expect('{');
        for (;;) {
            skip_ws();
            if (peek() == '}') break;
            const std::string key = parse_string("a quoted key");
            skip_ws();
            expect(':');
            skip_ws();
            if (key == "descr") {
                fail_if(has_descr, "key 'descr' appears twice");
                if (peek() != '\'' && peek() != '"')
                    fail("'descr' is not a string (structured and nested dtypes are not supported)");
                descr = parse_string("a descr string");
                has_descr = true;
            } else if (key == "fortran_order") {
                fail_if(has_fortran, "key 'fortran_order' appears twice");
                fortran = parse_bool();
                has_fortran = true;
            } else if (key == "shape") {
                fail_if(has_shape, "key 'shape' appears twice");
                shape = parse_tuple();
                has_shape = true;
            } else {
                fail("unexpected key '" + key + "' (expected exactly 'descr', 'fortran_order' and 'shape')");
            }
            skip_ws();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            skip_ws();
            fail_if(peek() != '}', "expected ',' or '}' after the value of '" + key + "'");
        }
        expect('}');
        skip_ws();
        fail_if(i_ != t_.size(), "unexpected text after the header dict");
        fail_if(!has_descr, "the header has no 'descr' key");
        fail_if(!has_fortran, "the header has no 'fortran_order' key");
        fail_if(!has_shape, "the header has no 'shape' key");
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw ::vlsparse::error("read_npy", concat("'", name_, "': malformed header (", what, "): ", t_));
    }
    void fail_if(bool bad, const std::string& what) const {
        if (bad) fail(what);
    }
    char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
    void skip_ws() {
        while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) ++i_;
    }
    void expect(char c) {
        fail_if(peek() != c, std::string("expected '") + c + "'");
        ++i_;
    }
    std::string parse_string(const char* what) {
        const char q = peek();
        fail_if(q != '\'' && q != '"', std::string("expected ") + what);
        ++i_;
        const auto end = t_.find(q, i_);
        fail_if(end == std::string_view::npos, "unterminated string");
        std::string s(t_.substr(i_, end - i_));
        i_ = end + 1;
        return s;
    }
    bool parse_bool() {
        if (t_.substr(i_, 4) == "True") {
            i_ += 4;
            return true;
        }
        if (t_.substr(i_, 5) == "False") {
            i_ += 5;
            return false;
        }
        fail("'fortran_order' is not True or False");
    }
    std::vector<std::int64_t> parse_tuple() {
        std::vector<std::int64_t> out;
        expect('(');
        for (;;) {
            skip_ws();
            if (peek() == ')') break;
            fail_if(!(peek() >= '0' && peek() <= '9'), "'shape' holds something other than non-negative integers");
            std::int64_t v = 0;
            while (peek() >= '0' && peek() <= '9') {
                const int digit = peek() - '0';
                fail_if(v > (std::numeric_limits<std::int64_t>::max() - digit) / 10, "a 'shape' extent overflows int64");
                v = v * 10 + digit;
                ++i_;
            }
            if (peek() == 'L') ++i_;  // Python 2 long literal
            out.push_back(v);
            skip_ws();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            skip_ws();
            fail_if(peek() != ')', "expected ',' or ')' in 'shape'");
        }
        expect(')');
        return out;
    }

    std::string_view t_;
    std::string_view name_;
    std::size_t i_ = 0;
};

}  // namespace detail

// An array read from (or to be written to) a .npy file: descr, shape and the raw little-endian bytes.
struct NpyArray {
    std::string descr;                // normalized numpy descr, e.g. "<f4", "|u1"
    std::vector<std::int64_t> shape;  // C order; {} for a 0-d array (one element)
    std::vector<std::byte> data;      // numel() * itemsize() bytes, little-endian

    std::int64_t numel() const { return detail::npy_numel(shape, "NpyArray::numel", "array"); }
    std::size_t itemsize() const { return detail::npy_itemsize(descr); }

    // The elements as T; descr must be exactly npy_type<T>::descr (e.g. "<f4" for float; "<u2" for
    // bfloat16 and uint16 alike). Throws vlsparse::error naming both descrs otherwise.
    template <NpyElement T>
    std::vector<T> to_vector() const {
        constexpr const char* fn = "NpyArray::to_vector";
        const std::string_view want = npy_type<T>::descr;
        detail::require(descr == want, fn, "the array holds '", descr, "', the requested element type is '", want, "'");
        const std::size_t bytes = detail::npy_nbytes(shape, sizeof(T), descr, fn, "array");
        const std::size_t n = bytes / sizeof(T);
        detail::require(data.size() == bytes, fn, "the array holds ", data.size(), " bytes, shape ",
                        detail::npy_shape_repr(shape), " of '", descr, "' needs ", bytes);
        if constexpr (std::is_same_v<T, bool>) {
            std::vector<bool> out(n);
            for (std::size_t i = 0; i < n; ++i) out[i] = data[i] != std::byte{0};
            return out;
        } else {
            std::vector<T> out(n);
            detail::npy_copy_le(out.data(), data.data(), n, sizeof(T));
            return out;
        }
    }

    // Element i (flat, C order) converted to double, from any supported descr. '<u2' is read as
    // uint16 unless u2 == U2As::bfloat16. 64-bit integers beyond 2^53 lose precision.
    double at_double(std::size_t i, U2As u2 = U2As::uint16) const {
        const std::size_t sz = itemsize();
        detail::require(sz != 0, "NpyArray::at_double", "unsupported descr '", descr, "'");
        detail::require((i + 1) * sz <= data.size(), "NpyArray::at_double", "index ", i, " is beyond the ",
                        data.size() / sz, " elements held");
        unsigned char b[8];
        detail::npy_copy_le(b, data.data() + i * sz, 1, sz);
        const char kind = descr[1];
        auto get = [&](auto v) {
            std::memcpy(&v, b, sizeof(v));
            return v;
        };
        switch (sz) {
            case 1:
                return kind == 'i' ? static_cast<double>(get(std::int8_t{})) : kind == 'b' ? (b[0] != 0 ? 1.0 : 0.0)
                                                                                            : static_cast<double>(b[0]);
            case 2: {
                const auto u = get(std::uint16_t{});
                if (kind == 'f') return half::to_float(u);
                if (kind == 'i') return static_cast<double>(get(std::int16_t{}));
                return u2 == U2As::bfloat16 ? static_cast<double>(bfloat16::to_float(u)) : static_cast<double>(u);
            }
            case 4:
                return kind == 'f' ? static_cast<double>(get(float{}))
                       : kind == 'i' ? static_cast<double>(get(std::int32_t{}))
                                     : static_cast<double>(get(std::uint32_t{}));
            default:
                return kind == 'f' ? get(double{})
                       : kind == 'i' ? static_cast<double>(get(std::int64_t{}))
                                     : static_cast<double>(get(std::uint64_t{}));
        }
    }

    // Every element converted to double (see at_double).
    std::vector<double> to_double(U2As u2 = U2As::uint16) const {
        const std::size_t sz = itemsize();
        detail::require(sz != 0, "NpyArray::to_double", "unsupported descr '", descr, "'");
        const std::size_t bytes = detail::npy_nbytes(shape, sz, descr, "NpyArray::to_double", "array");
        const std::size_t n = bytes / sz;
        detail::require(data.size() == bytes, "NpyArray::to_double", "descr '", descr, "' with shape ",
                        detail::npy_shape_repr(shape), " does not match ", data.size(), " data bytes");
        std::vector<double> out(n);
        for (std::size_t i = 0; i < n; ++i) out[i] = at_double(i, u2);
        return out;
    }

    // An array holding a copy of `count = prod(shape)` elements at `p` (p may be null when count is 0).
    template <NpyElement T>
    static NpyArray from(const T* p, std::vector<std::int64_t> shape) {
        using U = std::remove_const_t<T>;
        static_assert(std::is_trivially_copyable_v<U>, "npy elements are trivially copyable");
        NpyArray a;
        a.descr = std::string(npy_type<U>::descr);
        const std::size_t n =
            detail::npy_nbytes(shape, sizeof(U), npy_type<U>::descr, "NpyArray::from", "array") / sizeof(U);
        detail::require(n == 0 || p != nullptr, "NpyArray::from", "null data pointer for shape ",
                        detail::npy_shape_repr(shape));
        a.shape = std::move(shape);
        a.data.resize(n * sizeof(U));
        if constexpr (std::is_same_v<U, bool>) {
            for (std::size_t i = 0; i < n; ++i) a.data[i] = p[i] ? std::byte{1} : std::byte{0};
        } else {
            detail::npy_copy_le(a.data.data(), p, n, sizeof(U));
        }
        return a;
    }
    template <NpyElement T>
    static NpyArray from(const std::vector<T>& v, std::vector<std::int64_t> shape) {
        const auto n = detail::npy_numel(shape, "NpyArray::from", "array");
        detail::require(n == static_cast<std::int64_t>(v.size()), "NpyArray::from", "shape ",
                        detail::npy_shape_repr(shape), " has ", n, " elements, the vector has ", v.size());
        if constexpr (std::is_same_v<T, bool>) {
            std::vector<std::uint8_t> b(v.begin(), v.end());
            NpyArray a = from(b.data(), std::move(shape));
            a.descr = "|b1";
            return a;
        } else {
            return from(v.data(), std::move(shape));
        }
    }
};

// The complete .npy v1.0 header numpy writes for `descr` and `shape` (C order): magic, version,
// header length and the space-padded dict ending in '\n'; its size is a multiple of 64.
inline std::string npy_header(std::string_view descr, const std::vector<std::int64_t>& shape) {
    std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " +
                       detail::npy_shape_repr(shape) + ", }";
    // numpy >= 1.23 leaves room for the first extent to grow to 21 digits.
    if (!shape.empty()) dict.append(21 - std::to_string(shape[0]).size(), ' ');
    const std::size_t hlen = dict.size() + 1;               // + '\n'
    const std::size_t pad = 64 - (10 + hlen) % 64;          // numpy pads 64 when already aligned
    const std::size_t total = hlen + pad;
    detail::require(total <= 65535, "npy_header", "header of ", total, " bytes does not fit format 1.0");
    std::string out("\x93NUMPY\x01\x00", 8);
    out.push_back(static_cast<char>(total & 0xFF));
    out.push_back(static_cast<char>(total >> 8));
    out += dict;
    out.append(pad, ' ');
    out.push_back('\n');
    return out;
}

// Parses the bytes of a whole .npy file; `name` (a path) appears in every error message.
inline NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view name = "<memory>") {
    constexpr const char* fn = "read_npy";
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
    detail::require(!bytes.empty(), fn, "'", name, "': empty file, not a .npy file");
    detail::require(std::memcmp(b, "\x93NUMPY", std::min<std::size_t>(6, bytes.size())) == 0, fn, "'", name,
                    "': bad magic, not a .npy file (expected \\x93NUMPY)");
    detail::require(bytes.size() >= 10, fn, "'", name, "': file of ", bytes.size(),
                    " bytes is too short for a .npy header (truncated file)");
    const int major = b[6], minor = b[7];
    detail::require((major == 1 || major == 2 || major == 3) && minor == 0, fn, "'", name,
                    "': unsupported .npy format version ", major, ".", minor, ", expected 1.0, 2.0 or 3.0");
    std::size_t hstart = 10, hlen = static_cast<std::size_t>(b[8]) | (static_cast<std::size_t>(b[9]) << 8);
    if (major >= 2) {
        detail::require(bytes.size() >= 12, fn, "'", name, "': truncated header");
        hstart = 12;
        hlen = static_cast<std::size_t>(b[8]) | (static_cast<std::size_t>(b[9]) << 8) |
               (static_cast<std::size_t>(b[10]) << 16) | (static_cast<std::size_t>(b[11]) << 24);
    }
    detail::require(hlen <= bytes.size() - hstart, fn, "'", name, "': header length ", hlen, " exceeds the ",
                    bytes.size() - hstart, " bytes that follow (truncated file)");
    const std::string_view header(reinterpret_cast<const char*>(b + hstart), hlen);

    NpyArray a;
    bool fortran = false;
    detail::NpyHeaderParser(header, name).parse(a.descr, fortran, a.shape);
    detail::require(!fortran, fn, "'", name,
                    "': fortran_order is True; only C-order arrays are supported (save np.ascontiguousarray(a))");

    // Normalize the byte-order character: 1-byte types use '|' whatever the writer put there.
    std::string d = a.descr;
    if (d.size() == 3 && d[2] == '1' && (d[0] == '<' || d[0] == '>' || d[0] == '=')) d[0] = '|';
    if (d.size() >= 2 && d[0] == '>' && detail::npy_itemsize("<" + d.substr(1)) != 0)
        throw error(fn, detail::concat("'", name, "': big-endian descr '", a.descr,
                                       "' is not supported; save arr.astype(arr.dtype.newbyteorder('<'))"));
    detail::require(detail::npy_itemsize(d) != 0, fn, "'", name, "': unsupported descr '", a.descr, "', expected one of ",
                    detail::npy_supported);
    a.descr = d;

    const std::size_t have = bytes.size() - hstart - hlen;
    const std::size_t need =
        detail::npy_nbytes(a.shape, detail::npy_itemsize(d), d, fn, std::string("'") + std::string(name) + "'");
    detail::require(need == have, fn, "'", name, "': shape ", detail::npy_shape_repr(a.shape), " of '", d, "' needs ",
                    need, " data bytes, the file has ", have,
                    have < need ? " (truncated data)" : " (data size does not match the shape)");
    a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(hstart + hlen), bytes.end());
    return a;
}

// Reads a .npy file.
inline NpyArray read_npy(const std::filesystem::path& path) {
    constexpr const char* fn = "read_npy";
    const std::string name = path.string();
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    detail::require(std::filesystem::exists(st), fn, "'", name, "': no such file");
    detail::require(!std::filesystem::is_directory(st), fn, "'", name, "': is a directory, expected a .npy file");
    std::ifstream f(path, std::ios::binary);
    detail::require(static_cast<bool>(f), fn, "'", name, "': cannot open for reading");
    f.seekg(0, std::ios::end);
    const auto size = f.tellg();
    detail::require(size >= 0, fn, "'", name, "': cannot determine the file size");
    f.seekg(0, std::ios::beg);
    std::vector<std::byte> bytes(static_cast<std::size_t>(size));
    if (!bytes.empty()) f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    detail::require(static_cast<bool>(f), fn, "'", name, "': read error");
    return parse_npy(bytes, name);
}

// Writes `a` as a .npy v1.0 file (replacing any existing file).
inline void write_npy(const std::filesystem::path& path, const NpyArray& a) {
    constexpr const char* fn = "write_npy";
    const std::string name = path.string();
    const std::size_t sz = detail::npy_itemsize(a.descr);
    detail::require(sz != 0, fn, "'", name, "': unsupported descr '", a.descr, "', expected one of ",
                    detail::npy_supported);
    const std::size_t need = detail::npy_nbytes(a.shape, sz, a.descr, fn, "'" + name + "'");
    detail::require(a.data.size() == need, fn, "'", name, "': shape ", detail::npy_shape_repr(a.shape), " of '",
                    a.descr, "' needs ", need, " data bytes, the array holds ", a.data.size());
    const std::string header = npy_header(a.descr, a.shape);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    detail::require(static_cast<bool>(f), fn, "'", name, "': cannot open for writing");
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    if (!a.data.empty()) f.write(reinterpret_cast<const char*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
    f.close();
    detail::require(!f.fail(), fn, "'", name, "': write error");
}

// Writes prod(shape) elements of T from `data` (C order) as a .npy file, e.g.
//   write_npy("scores.npy", scores.data(), {n_heads, n});
template <NpyElement T>
void write_npy(const std::filesystem::path& path, const T* data, const std::vector<std::int64_t>& shape) {
    write_npy(path, NpyArray::from(data, shape));
}
template <NpyElement T>
void write_npy(const std::filesystem::path& path, const std::vector<T>& data, const std::vector<std::int64_t>& shape) {
    write_npy(path, NpyArray::from(data, shape));
}

}  // namespace vlsparse
