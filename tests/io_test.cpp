// Tests of io/npy.hpp (.npy read/write) and io/golden.hpp (manifest, tensors, compare).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <vlsparse/io/golden.hpp>
#include <vlsparse/io/npy.hpp>
#include "error_of.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::Matches;
using vlsparse::NpyArray;

namespace {

// A fresh directory under the system temp dir, removed when the test case ends.
struct TempDir {
    fs::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        path = fs::temp_directory_path() /
               ("vlsparse_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    fs::path operator/(const std::string& name) const { return path / name; }
};

std::string file_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream os;
    os << f.rdbuf();
    return os.str();
}
void put_bytes(const fs::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// A .npy file assembled by hand: magic, version, header length, `dict` padded like numpy, data.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1, int minor = 0) {
    const std::size_t pre = major >= 2 ? 12 : 10;
    std::string h = dict;
    h.append(64 - (pre + h.size() + 1) % 64, ' ');
    h += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += static_cast<char>(minor);
    const std::size_t n = h.size();
    out += static_cast<char>(n & 0xFF);
    out += static_cast<char>((n >> 8) & 0xFF);
    if (major >= 2) out += std::string(2, '\0');
    return out + h + data;
}
std::string f32_bytes(std::initializer_list<float> v) {
    std::string s;
    for (float x : v) s.append(reinterpret_cast<const char*>(&x), 4);
    return s;
}

using vt::error_of;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
void round_trip(const TempDir& dir, const std::vector<T>& v, const std::vector<std::int64_t>& shape,
                const std::string& descr) {
    const auto p = dir / ("rt_" + descr.substr(1) + "_" + std::to_string(shape.size()) + ".npy");
    vlsparse::write_npy(p, v, shape);
    const NpyArray a = vlsparse::read_npy(p);
    CHECK(a.descr == descr);
    CHECK(a.shape == shape);
    CHECK(a.numel() == static_cast<std::int64_t>(v.size()));
    CHECK(a.data.size() == v.size() * sizeof(T));
    const auto back = a.template to_vector<T>();
    if constexpr (std::is_same_v<T, bool>) CHECK(back == v);
    else CHECK(same_bits(back, v));
    // The header is what numpy writes: a multiple of 64 bytes ending in '\n'.
    const std::string bytes = file_bytes(p);
    const std::size_t header = bytes.size() - v.size() * sizeof(T);
    CHECK(header % 64 == 0);
    CHECK(bytes[header - 1] == '\n');
    CHECK(vlsparse::npy_header(descr, shape) == bytes.substr(0, header));
}

template <class T>
std::vector<T> sample(std::size_t n) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double x = (static_cast<double>(i) - 3.0) * 1.25;
        if constexpr (std::is_same_v<T, vlsparse::half> || std::is_same_v<T, vlsparse::bfloat16>)
            v[i] = T(static_cast<float>(x));
        else if constexpr (std::is_same_v<T, bool>) v[i] = (i % 3) == 1;
        // Integers through int64 (a negative double to an unsigned type is undefined; int64 to it wraps).
        else if constexpr (std::is_integral_v<T>) v[i] = static_cast<T>(static_cast<std::int64_t>(x));
        else v[i] = static_cast<T>(x);
    }
    return v;
}

template <class T>
void round_trip_shapes(const TempDir& dir, const std::string& descr) {
    INFO("descr " << descr);
    round_trip(dir, sample<T>(1), {}, descr);           // rank 0
    round_trip(dir, sample<T>(7), {7}, descr);          // rank 1
    round_trip(dir, sample<T>(24), {2, 3, 4}, descr);   // rank 3
    round_trip(dir, sample<T>(0), {3, 0, 2}, descr);    // an empty dimension (rank 3 -> name differs)
    round_trip(dir, sample<T>(0), {0, 5, 1, 1}, descr); // empty, rank 4
}

}  // namespace

// ---- npy ----------------------------------------------------------------------------------------

TEST_CASE("npy: round trip of every dtype and shape", "[io][npy]") {
    TempDir dir;
    round_trip_shapes<float>(dir, "<f4");
    round_trip_shapes<double>(dir, "<f8");
    round_trip_shapes<vlsparse::half>(dir, "<f2");
    round_trip_shapes<vlsparse::bfloat16>(dir, "<u2");
    round_trip_shapes<std::int64_t>(dir, "<i8");
    round_trip_shapes<std::int32_t>(dir, "<i4");
    round_trip_shapes<std::int16_t>(dir, "<i2");
    round_trip_shapes<std::int8_t>(dir, "|i1");
    round_trip_shapes<std::uint8_t>(dir, "|u1");
    round_trip_shapes<std::uint16_t>(dir, "<u2");
    round_trip_shapes<std::uint32_t>(dir, "<u4");
    round_trip_shapes<std::uint64_t>(dir, "<u8");
    round_trip_shapes<bool>(dir, "|b1");

    // Special float values survive bit for bit.
    const std::vector<float> special{-0.0f, std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::max()};
    round_trip(dir, special, {5}, "<f4");
    const std::vector<std::int64_t> extremes{std::numeric_limits<std::int64_t>::min(),
                                             std::numeric_limits<std::int64_t>::max(), -1, 0};
    round_trip(dir, extremes, {2, 2}, "<i8");
    // Large first extent (header still a multiple of 64).
    round_trip(dir, std::vector<std::uint8_t>(100000, 7), {100000}, "|u1");
    // Pointer overload.
    const std::vector<double> d{1, 2, 3, 4, 5, 6};
    vlsparse::write_npy(dir / "ptr.npy", d.data(), {3, 2});
    CHECK(vlsparse::read_npy(dir / "ptr.npy").to_vector<double>() == d);
}

TEST_CASE("npy: bytes are exactly what numpy.save writes", "[io][npy]") {
    TempDir dir;
    // np.save(f, np.array([[1.5, -2], [0, 3]], dtype='<f4')) with numpy >= 1.23 writes:
    //   "\x93NUMPY" 01 00, header length 0x0076 (118) little-endian,
    //   "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }" (59 chars),
    //   + 20 spaces (room for the first extent to grow to 21 digits: 21 - len("2")),
    //   + 38 spaces (pad 10 + 59 + 20 + 1 = 90 bytes up to 128), "\n", then 4 x float32 LE.
    const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
    REQUIRE(dict.size() == 59);
    const std::string expect = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict + std::string(58, ' ') + "\n" +
                               std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0\x00\x00\x00\x00\x00\x00\x40\x40", 16);
    REQUIRE(expect.size() == 144);
    const std::vector<float> v{1.5f, -2.0f, 0.0f, 3.0f};
    vlsparse::write_npy(dir / "a.npy", v, {2, 2});
    CHECK(file_bytes(dir / "a.npy") == expect);

    // np.save(f, np.array(7, dtype='<i8')): a 0-d array has no growth padding;
    // 10 + 55 + 1 = 66 bytes are padded with 62 spaces to 128.
    const std::string dict0 = "{'descr': '<i8', 'fortran_order': False, 'shape': (), }";
    REQUIRE(dict0.size() == 55);
    const std::string expect0 = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict0 + std::string(62, ' ') + "\n" +
                                std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8);
    const std::int64_t seven = 7;
    vlsparse::write_npy(dir / "b.npy", &seven, {});
    CHECK(file_bytes(dir / "b.npy") == expect0);

    // np.save(f, np.array([True, False])): '|b1', shape (2,) with its trailing comma.
    const std::string dictb = "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }";
    const std::string expectb = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dictb + std::string(60, ' ') + "\n" +
                                std::string("\x01\x00", 2);
    vlsparse::write_npy(dir / "c.npy", std::vector<bool>{true, false}, {2});
    CHECK(file_bytes(dir / "c.npy") == expectb);

    // When dict + growth padding + '\n' + preamble is exactly a multiple of 64, numpy pads a full 64
    // more: shape (2, 1 x 12, 100) has a 97-char dict + 20 spaces, 10 + 117 + 1 = 128, so the header is
    // 192 bytes (length field 182 = 0xB6) with 84 spaces. (Checked against numpy 1.24's np.save.)
    std::vector<std::int64_t> shape14{2};
    shape14.insert(shape14.end(), 12, 1);
    shape14.push_back(100);
    const std::string dict14 =
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 100), }";
    REQUIRE(dict14.size() == 97);
    const std::string header14 =
        std::string("\x93NUMPY\x01\x00\xb6\x00", 10) + dict14 + std::string(84, ' ') + "\n";
    CHECK(vlsparse::npy_header("<f4", shape14) == header14);
    std::vector<float> v14(200);
    for (std::size_t i = 0; i < v14.size(); ++i) v14[i] = static_cast<float>(i);
    vlsparse::write_npy(dir / "e.npy", v14, shape14);
    CHECK(file_bytes(dir / "e.npy").substr(0, 192) == header14);
    CHECK(vlsparse::read_npy(dir / "e.npy").to_vector<float>() == v14);

    // And we read numpy's bytes back.
    put_bytes(dir / "d.npy", expect);
    const NpyArray a = vlsparse::read_npy(dir / "d.npy");
    CHECK(a.descr == "<f4");
    CHECK(a.shape == std::vector<std::int64_t>{2, 2});
    CHECK(a.to_vector<float>() == v);
}

TEST_CASE("npy: reads header variants other writers produce", "[io][npy]") {
    TempDir dir;
    const std::string data = f32_bytes({1, 2, 3});
    auto read = [&](const std::string& bytes) {
        put_bytes(dir / "v.npy", bytes);
        return vlsparse::read_npy(dir / "v.npy");
    };
    // numpy < 1.23 (no growth padding), keys in another order, no trailing comma, double quotes,
    // Python 2 long literals, format 2.0 and 3.0, '<u1' for a 1-byte type.
    for (const std::string& dict :
         {std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"),
          std::string("{'shape': (3,), 'fortran_order': False, 'descr': '<f4'}"),
          std::string("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3L,)}"),
          std::string("{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 3 , ) , }")}) {
        INFO(dict);
        const NpyArray a = read(make_npy(dict, data));
        CHECK(a.descr == "<f4");
        CHECK(a.shape == std::vector<std::int64_t>{3});
        CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3});
    }
    const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }";
    CHECK(read(make_npy(dict, data, 2, 0)).shape == std::vector<std::int64_t>{1, 3});
    CHECK(read(make_npy(dict, data, 3, 0)).to_vector<float>() == std::vector<float>{1, 2, 3});
    const NpyArray u = read(make_npy("{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", "\x05\x06"));
    CHECK(u.descr == "|u1");
    CHECK(u.to_vector<std::uint8_t>() == std::vector<std::uint8_t>{5, 6});
}

TEST_CASE("npy: every malformed file throws naming the file and the problem", "[io][npy]") {
    TempDir dir;
    const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
    const std::string data = f32_bytes({1, 2, 3, 4});
    const std::string good = make_npy(good_dict, data);
    REQUIRE_NOTHROW(vlsparse::read_npy((put_bytes(dir / "good.npy", good), dir / "good.npy")));

    struct Case {
        const char* what;
        std::string bytes;
        const char* problem;  // substring of what()
    };
    auto dict_with = [](const std::string& descr, const std::string& fortran, const std::string& shape) {
        return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
    };
    std::string bad_magic = good;
    bad_magic[1] = 'X';
    std::string v11 = good;
    v11[7] = 1;
    std::string v40 = good;
    v40[6] = 4;
    std::string long_header = good;
    long_header[9] = 0x7F;  // header length 0x7F76 > file size
    const Case cases[] = {
        {"empty file", "", "empty file"},
        {"bad magic", bad_magic, "bad magic"},
        {"text file", "hello world, not numpy at all", "bad magic"},
        {"short header", good.substr(0, 8), "too short"},
        {"version 1.1", v11, "unsupported .npy format version 1.1"},
        {"version 4.0", v40, "unsupported .npy format version 4.0"},
        {"header length beyond the file", long_header, "header length 32630 exceeds"},
        {"fortran order", make_npy(dict_with("'<f4'", "True", "(2, 2)"), data), "fortran_order is True"},
        {"big-endian", make_npy(dict_with("'>f4'", "False", "(2, 2)"), data), "big-endian descr '>f4'"},
        {"big-endian int", make_npy(dict_with("'>i8'", "False", "(2,)"), data), "big-endian descr '>i8'"},
        {"complex", make_npy(dict_with("'<c8'", "False", "(2,)"), data), "unsupported descr '<c8'"},
        {"unicode", make_npy(dict_with("'<U2'", "False", "(2,)"), data), "unsupported descr '<U2'"},
        {"object", make_npy(dict_with("'|O'", "False", "(2,)"), data), "unsupported descr '|O'"},
        {"float128", make_npy(dict_with("'<f16'", "False", "(1,)"), data), "unsupported descr '<f16'"},
        {"native order", make_npy(dict_with("'=f4'", "False", "(2, 2)"), data), "unsupported descr '=f4'"},
        {"structured", make_npy(dict_with("[('a', '<f4')]", "False", "(2,)"), data), "structured"},
        {"truncated data", make_npy(good_dict, data.substr(0, 15)), "needs 16 data bytes, the file has 15 (truncated"},
        {"no data", make_npy(good_dict, ""), "needs 16 data bytes, the file has 0 (truncated"},
        {"trailing data", make_npy(good_dict, data + "xx"), "needs 16 data bytes, the file has 18 (data size"},
        {"shape/size mismatch", make_npy(dict_with("'<f4'", "False", "(3, 2)"), data), "shape (3, 2) of '<f4' needs 24"},
        {"missing key", make_npy("{'descr': '<f4', 'fortran_order': False, }", data), "no 'shape' key"},
        {"extra key", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", data),
         "unexpected key 'x'"},
        {"duplicate key", make_npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", data),
         "'descr' appears twice"},
        {"negative extent", make_npy(dict_with("'<f4'", "False", "(-4,)"), data), "non-negative integers"},
        {"float extent", make_npy(dict_with("'<f4'", "False", "(4.0,)"), data), "expected ',' or ')'"},
        {"shape not a tuple", make_npy(dict_with("'<f4'", "False", "4"), data), "expected '('"},
        {"fortran_order not a bool", make_npy(dict_with("'<f4'", "0", "(4,)"), data), "not True or False"},
        {"not a dict", make_npy("['descr', '<f4']", data), "expected '{'"},
        {"unterminated string", make_npy("{'descr: '<f4', 'fortran_order': False, 'shape': (4,)}", data),
         "malformed header"},
        {"huge extents", make_npy(dict_with("'<f4'", "False", "(4294967296, 4294967296)"), data), "too many elements"},
        {"extent overflows int64", make_npy(dict_with("'<f4'", "False", "(99999999999999999999,)"), data),
         "overflows int64"},
    };
    int i = 0;
    for (const auto& c : cases) {
        const auto p = dir / ("bad" + std::to_string(i++) + ".npy");
        put_bytes(p, c.bytes);
        INFO(c.what);
        const std::string msg = error_of([&] { (void)vlsparse::read_npy(p); });
        CHECK_THAT(msg, Contains("read_npy: '" + p.string() + "'"));
        CHECK_THAT(msg, Contains(c.problem));
        // The in-memory parser reports the same problem under the name it is given.
        const std::string mem = error_of([&] {
            (void)vlsparse::parse_npy(std::span<const std::byte>(reinterpret_cast<const std::byte*>(c.bytes.data()),
                                                                 c.bytes.size()),
                                      "buffer");
        });
        CHECK_THAT(mem, Contains("'buffer'") && Contains(c.problem));
    }

    // Unreadable paths.
    CHECK_THAT(error_of([&] { (void)vlsparse::read_npy(dir / "missing.npy"); }),
               Contains("read_npy: '" + (dir / "missing.npy").string() + "': no such file"));
    CHECK_THAT(error_of([&] { (void)vlsparse::read_npy(dir.path); }), Contains("is a directory"));
    if (::geteuid() != 0) {  // root reads anything, so the permission case only runs as a normal user
        put_bytes(dir / "noperm.npy", good);
        fs::permissions(dir / "noperm.npy", fs::perms::none);
        CHECK_THAT(error_of([&] { (void)vlsparse::read_npy(dir / "noperm.npy"); }), Contains("cannot open"));
    }
}

TEST_CASE("npy: a shape whose byte size wraps past 2^64 is rejected (issue 21)", "[io][npy][issue21]") {
    // (2^61 + 1,) of '<f8' needs 2^64 + 8 bytes; computed modulo 2^64 that is the 8 bytes the file
    // holds, so the file used to be accepted and to_vector then threw std::length_error.
    const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693953,), }";
    const std::string bytes = make_npy(dict, std::string(8, '\0'));
    const std::string msg = error_of([&] {
        (void)vlsparse::parse_npy(std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
                                  "wrap.npy");
    });
    CHECK_THAT(msg, Contains("read_npy: 'wrap.npy': shape (2305843009213693953,) of '<f8' has too many bytes"));
    // An NpyArray built by hand with such a shape: every accessor throws vlsparse::error.
    NpyArray a;
    a.descr = "<f8";
    a.shape = {2305843009213693953};
    a.data.resize(8);
    CHECK_THAT(error_of([&] { (void)a.to_vector<double>(); }), Contains("NpyArray::to_vector") && Contains("too many bytes"));
    CHECK_THAT(error_of([&] { (void)a.to_double(); }), Contains("NpyArray::to_double") && Contains("too many bytes"));
    TempDir dir;
    CHECK_THAT(error_of([&] { vlsparse::write_npy(dir / "w.npy", a); }), Contains("write_npy") && Contains("too many bytes"));
    // 2^60 elements of '<f8' (2^63 bytes) still fit the byte count: rejected as truncated, not as too large.
    const std::string fits = make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1152921504606846976,), }",
                                      std::string(8, '\0'));
    CHECK_THAT(error_of([&] {
                   (void)vlsparse::parse_npy(
                       std::span<const std::byte>(reinterpret_cast<const std::byte*>(fits.data()), fits.size()), "fits.npy");
               }),
               Contains("needs 9223372036854775808 data bytes, the file has 8 (truncated data)"));
}

TEST_CASE("npy: writing errors", "[io][npy]") {
    TempDir dir;
    const std::vector<float> v{1, 2, 3};
    CHECK_THAT(error_of([&] { vlsparse::write_npy(dir / "no" / "such" / "dir.npy", v, {3}); }),
               Contains("write_npy: '" + (dir / "no" / "such" / "dir.npy").string() + "': cannot open for writing"));
    CHECK_THAT(error_of([&] { vlsparse::write_npy(dir / "x.npy", v, {2, 2}); }),
               Contains("shape (2, 2) has 4 elements, the vector has 3"));
    CHECK_THAT(error_of([&] { vlsparse::write_npy(dir / "x.npy", v.data(), {-1, 3}); }),
               Contains("negative extent"));
    NpyArray bad;
    bad.descr = "<c8";
    bad.shape = {1};
    bad.data.resize(8);
    CHECK_THAT(error_of([&] { vlsparse::write_npy(dir / "x.npy", bad); }), Contains("unsupported descr '<c8'"));
    bad.descr = "<f4";
    CHECK_THAT(error_of([&] { vlsparse::write_npy(dir / "x.npy", bad); }),
               Contains("needs 4 data bytes, the array holds 8"));
    CHECK_THAT(error_of([&] { (void)NpyArray::from(static_cast<const float*>(nullptr), {2}); }),
               Contains("null data pointer"));
    CHECK_NOTHROW(NpyArray::from(static_cast<const float*>(nullptr), {0, 2}));
}

TEST_CASE("npy: typed accessors", "[io][npy]") {
    const std::vector<float> v{1.5f, -2.0f, 0.25f};
    const NpyArray a = NpyArray::from(v, {3});
    CHECK(a.to_vector<float>() == v);
    CHECK_THAT(error_of([&] { (void)a.to_vector<double>(); }),
               Matches("NpyArray::to_vector: the array holds '<f4', the requested element type is '<f8'"));
    CHECK_THROWS_AS(a.to_vector<std::int32_t>(), vlsparse::error);
    CHECK(a.to_double() == std::vector<double>{1.5, -2.0, 0.25});

    // to_double converts every numeric descr.
    CHECK(NpyArray::from(std::vector<std::int8_t>{-128, 127}, {2}).to_double() == std::vector<double>{-128, 127});
    CHECK(NpyArray::from(std::vector<std::int16_t>{-300, 2}, {2}).to_double() == std::vector<double>{-300, 2});
    CHECK(NpyArray::from(std::vector<std::int32_t>{-70000}, {1}).to_double() == std::vector<double>{-70000});
    CHECK(NpyArray::from(std::vector<std::int64_t>{-(1LL << 40)}, {1}).to_double() ==
          std::vector<double>{-1099511627776.0});
    CHECK(NpyArray::from(std::vector<std::uint8_t>{255}, {1}).to_double() == std::vector<double>{255});
    CHECK(NpyArray::from(std::vector<std::uint32_t>{4000000000u}, {1}).to_double() == std::vector<double>{4e9});
    CHECK(NpyArray::from(std::vector<std::uint64_t>{1ull << 63}, {1}).to_double() ==
          std::vector<double>{9223372036854775808.0});
    CHECK(NpyArray::from(std::vector<bool>{true, false, true}, {3}).to_double() == std::vector<double>{1, 0, 1});
    CHECK(NpyArray::from(std::vector<double>{0.1}, {}).to_double() == std::vector<double>{0.1});
    const std::vector<vlsparse::half> h{vlsparse::half(0.5f), vlsparse::half(-3.0f)};
    CHECK(NpyArray::from(h, {2}).to_double() == std::vector<double>{0.5, -3.0});
    // '<u2' is uint16 unless asked to read bfloat16 bits.
    const std::vector<vlsparse::bfloat16> b{vlsparse::bfloat16(1.0f), vlsparse::bfloat16(-2.5f)};
    const NpyArray ab = NpyArray::from(b, {2});
    CHECK(ab.descr == "<u2");
    CHECK(ab.to_double() == std::vector<double>{0x3F80, 0xC020});
    CHECK(ab.to_double(vlsparse::U2As::bfloat16) == std::vector<double>{1.0, -2.5});
    const auto back = ab.to_vector<vlsparse::bfloat16>();
    CHECK(back[1].bits == 0xC020);
    CHECK(ab.to_vector<std::uint16_t>() == std::vector<std::uint16_t>{0x3F80, 0xC020});
    // bool reads nonzero bytes as true.
    NpyArray bb = NpyArray::from(std::vector<bool>{true, false}, {2});
    bb.data[0] = std::byte{2};
    CHECK(bb.to_vector<bool>() == std::vector<bool>{true, false});
    CHECK_THROWS_AS(bb.to_vector<std::uint8_t>(), vlsparse::error);  // '|b1' is not '|u1'
    // A data size that does not match the shape is caught by the accessors.
    NpyArray broken = a;
    broken.data.pop_back();
    CHECK_THAT(error_of([&] { (void)broken.to_vector<float>(); }), Contains("holds 11 bytes"));
    CHECK_THROWS_AS(broken.to_double(), vlsparse::error);
}

// ---- golden manifest ----------------------------------------------------------------------------

namespace {

vlsparse::GoldenManifest sample_manifest(const fs::path& dir) {
    vlsparse::GoldenManifest m;
    m.algorithm = "zipvl";
    m.case_name = "tiny_gqa";
    m.generator = "vlsparse-golden 0.1.0";
    m.params = {{"tau", 0.975}, {"recent", 4}, {"random", 2}, {"seed", 1234}, {"grouping", "layer"}};
    m.layout = "text:3,image:4,text:1";
    vlsparse::GoldenTensor q;
    q.name = "q";
    q.description = "queries [n, H, d]";
    const std::vector<vlsparse::half> qd(8 * 2 * 4, vlsparse::half(0.5f));
    vlsparse::write_tensor(dir, q, qd, {8, 2, 4});
    m.inputs.push_back(q);
    vlsparse::GoldenTensor idx;
    idx.name = "indices";
    idx.metric = "exact";
    const std::vector<std::int64_t> id{0, 2, 5, 7};
    vlsparse::write_tensor(dir, idx, id.data(), {4});
    m.outputs.push_back(idx);
    vlsparse::GoldenTensor sc;
    sc.name = "scores";
    sc.file = "normalized_scores.npy";
    sc.metric = "rel";
    sc.tol = 1e-6;
    const std::vector<double> s{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
    vlsparse::write_tensor(dir, sc, s, {8});
    m.outputs.push_back(sc);
    vlsparse::GoldenTensor mask;
    mask.name = "mask";
    mask.metric = "exact";
    vlsparse::write_tensor(dir, mask, std::vector<bool>{true, false, true}, {3});
    m.outputs.push_back(mask);
    vlsparse::GoldenTensor o;
    o.name = "out";
    o.metric = "nmse";
    o.tol = 1e-10;
    o.tols = {{"fp64", 1e-13}, {"fp32", 1e-10}, {"bf16", 1e-4}};
    const std::vector<float> od(8 * 2 * 4, 0.25f);
    vlsparse::write_tensor(dir, o, od, {8, 2, 4});
    m.outputs.push_back(o);
    vlsparse::GoldenTensor bf;
    bf.name = "kv_bf16";
    bf.metric = "abs";
    bf.tol = 0.01;
    const std::vector<vlsparse::bfloat16> bd(3, vlsparse::bfloat16(1.5f));
    vlsparse::write_tensor(dir, bf, bd, {3});
    m.outputs.push_back(bf);
    return m;
}

}  // namespace

TEST_CASE("golden: write_tensor fills the entry; manifest round trip", "[io][golden]") {
    TempDir dir;
    const auto m = sample_manifest(dir.path);
    REQUIRE(m.inputs.size() == 1);
    CHECK(m.inputs[0].file == "q.npy");
    CHECK(m.inputs[0].dtype == "fp16");
    CHECK(m.inputs[0].shape == std::vector<std::int64_t>{8, 2, 4});
    CHECK(m.output("indices").dtype == "int64");
    CHECK(m.output("scores").file == "normalized_scores.npy");
    CHECK(m.output("scores").dtype == "fp64");
    CHECK(m.output("mask").dtype == "bool");
    CHECK(m.output("out").dtype == "fp32");
    CHECK(m.output("kv_bf16").dtype == "bf16");
    CHECK_THAT(error_of([&] { (void)m.output("nope"); }), Contains("no output named 'nope'") && Contains("'scores'"));

    vlsparse::write_manifest(dir.path, m);
    const auto r = vlsparse::read_manifest(dir.path);
    CHECK(r.algorithm == m.algorithm);
    CHECK(r.case_name == m.case_name);
    CHECK(r.generator == m.generator);
    CHECK(r.note == "generated by reference/, do not edit");
    CHECK(r.params == m.params);
    CHECK(r.layout == m.layout);
    REQUIRE(r.inputs.size() == m.inputs.size());
    REQUIRE(r.outputs.size() == m.outputs.size());
    for (std::size_t i = 0; i < m.outputs.size(); ++i) {
        const auto &a = r.outputs[i], &b = m.outputs[i];
        CHECK(a.name == b.name);
        CHECK(a.file == b.file);
        CHECK(a.dtype == b.dtype);
        CHECK(a.shape == b.shape);
        CHECK(a.metric == b.metric);
        CHECK(a.tol == b.tol);
        CHECK(a.tols == b.tols);
        CHECK(a.description == b.description);
    }
    CHECK(r.output("out").tol_for("fp64") == 1e-13);
    CHECK(r.output("out").tol_for("bf16") == 1e-4);
    CHECK(r.output("out").tol_for("fp16") == 1e-10);  // not listed: tol
    CHECK(r.output("scores").tols.empty());
    CHECK(r.output("scores").tol_for("fp64") == 1e-6);
    CHECK(r.inputs[0].description == "queries [n, H, d]");
    CHECK(r.inputs[0].metric.empty());

    // Stable text: writing what was read gives the same bytes; keys in the documented order.
    const std::string text = file_bytes(dir / "manifest.json");
    CHECK(vlsparse::manifest_json(r) == text);
    CHECK(text.back() == '\n');
    const auto pos = [&](const char* key) { return text.find(std::string("\"") + key + "\":"); };
    CHECK(pos("algorithm") < pos("case"));
    CHECK(pos("case") < pos("generator"));
    CHECK(pos("generator") < pos("note"));
    CHECK(pos("note") < pos("layout"));
    CHECK(pos("layout") < pos("params"));
    CHECK(pos("params") < pos("inputs"));
    CHECK(pos("inputs") < pos("outputs"));
    CHECK(pos("grouping") < pos("random"));  // params keys sorted
    CHECK(pos("random") < pos("recent"));
    CHECK_THAT(text, Contains("\n  \"algorithm\": \"zipvl\",\n"));  // pretty printed, two spaces

    // Tensors read back with the manifest's dtype and shape checked.
    const auto q = vlsparse::read_tensor(dir.path, r.input("q"));
    CHECK(q.descr == "<f2");
    CHECK(q.to_double() == std::vector<double>(64, 0.5));
    CHECK(vlsparse::read_tensor(dir.path, r.output("indices")).to_vector<std::int64_t>() ==
          std::vector<std::int64_t>{0, 2, 5, 7});
    CHECK(vlsparse::read_tensor(dir.path, r.output("mask")).to_vector<bool>() == std::vector<bool>{true, false, true});
    CHECK(vlsparse::read_tensor(dir.path, r.output("kv_bf16")).to_double(vlsparse::U2As::bfloat16) ==
          std::vector<double>(3, 1.5));

    auto wrong_shape = r.output("scores");
    wrong_shape.shape = {2, 4};
    CHECK_THAT(error_of([&] { (void)vlsparse::read_tensor(dir.path, wrong_shape); }),
               Contains("read_tensor") && Contains("normalized_scores.npy") && Contains("(tensor 'scores')") &&
                   Contains("the file has shape [8], the manifest says [2, 4]"));
    auto wrong_dtype = r.output("scores");
    wrong_dtype.dtype = "fp32";
    CHECK_THAT(error_of([&] { (void)vlsparse::read_tensor(dir.path, wrong_dtype); }),
               Contains("the file holds '<f8', the manifest says fp32 ('<f4')"));
    auto missing = r.output("scores");
    missing.file = "gone.npy";
    CHECK_THAT(error_of([&] { (void)vlsparse::read_tensor(dir.path, missing); }), Contains("no such file"));
}

TEST_CASE("golden: manifest validation errors", "[io][golden]") {
    TempDir dir;
    const auto m = sample_manifest(dir.path);
    const nlohmann::json base = nlohmann::json::parse(vlsparse::manifest_json(m));
    auto with = [&](auto&& edit) {
        nlohmann::json j = base;
        edit(j);
        std::ofstream(dir / "manifest.json") << j.dump(2);
        return error_of([&] { (void)vlsparse::read_manifest(dir.path); });
    };
    const std::string mf = (dir / "manifest.json").string();
    // Every message names the file and the JSON path: "read_manifest: <file>: <path>: <what>".
    auto at = [&](const std::string& path, const std::string& what) { return "read_manifest: " + mf + ": " + path + ": " + what; };
    CHECK(with([](nlohmann::json&) {}).empty());
    CHECK_THAT(with([](nlohmann::json& j) { j.erase("algorithm"); }),
               Matches(at("algorithm", "missing \\(expected a string\\)")));
    CHECK_THAT(with([](nlohmann::json& j) { j.erase("case"); }), Contains(at("case", "missing (expected a string)")));
    CHECK_THAT(with([](nlohmann::json& j) { j.erase("params"); }), Contains(at("params", "missing (expected an object)")));
    CHECK_THAT(with([](nlohmann::json& j) { j.erase("outputs"); }),
               Contains(at("outputs", "missing (expected an array of tensor entries)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["generator"] = 3; }), Contains(at("generator", "expected a string, got 3")));
    CHECK_THAT(with([](nlohmann::json& j) { j["note"] = false; }), Contains(at("note", "expected a string, got false")));
    CHECK_THAT(with([](nlohmann::json& j) { j["generator"] = ""; }),
               Contains(at("generator", "expected a non-empty string, got \"\"")));
    CHECK_THAT(with([](nlohmann::json& j) { j["params"] = "tau=1"; }),
               Contains(at("params", "expected an object, got \"tau=1\"")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"] = nlohmann::json::object(); }),
               Contains(at("inputs", "expected an array of tensor entries, got {}")));
    CHECK_THAT(with([](nlohmann::json& j) { j["extra"] = 1; }), Contains(at("extra", "unknown key (known keys: algorithm, ")));
    CHECK_THAT(with([](nlohmann::json& j) { j = nlohmann::json::array(); }),
               Contains(at("(top level)", "expected an object, got []")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["metric"] = "l2"; }),
               Contains(at("outputs[1].metric", "unknown metric 'l2', expected exact, rel, nmse or abs")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["metric"] = 2; }),
               Contains(at("outputs[1].metric", "expected a string, got 2")));
    CHECK_THAT(with([](nlohmann::json& j) {
                   j["outputs"][0].erase("metric");
                   j["outputs"][0].erase("tol");
               }),
               Contains(at("outputs[0].metric", "missing (expected exact, rel, nmse or abs: every output has a metric)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1].erase("tol"); }),
               Contains(at("outputs[1].tol", "missing (expected a number: metric 'rel' needs a tolerance)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["tol"] = -1; }),
               Contains(at("outputs[1].tol", "expected a finite tolerance >= 0, got -1")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["tol"] = "1e-5"; }),
               Contains(at("outputs[1].tol", "expected a number, got \"1e-5\"")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][2]["dtype"] = "float32"; }),
               Contains(at("outputs[2].dtype", "unknown dtype 'float32', expected fp32, fp64, fp16, bf16, int64, int32, "
                                               "uint8 or bool")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][2].erase("dtype"); }),
               Contains(at("outputs[2].dtype", "missing (expected a string)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][2]["shape"] = "3"; }),
               Contains(at("outputs[2].shape", "expected an array, got \"3\"")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][2]["shape"] = {3.5}; }),
               Contains(at("outputs[2].shape[0]", "expected an integer, got 3.5")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][2].erase("shape"); }),
               Contains(at("outputs[2].shape", "missing (expected an array of integers)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][2]["shape"] = {2, -3}; }),
               Contains(at("outputs[2].shape[1]", "negative extent -3")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0].erase("file"); }),
               Contains(at("inputs[0].file", "missing (expected a string)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0]["fiel"] = "x.npy"; }),
               Contains(at("inputs[0].fiel", "unknown key (known keys: name, file, dtype, shape, metric, tol, tols, "
                                             "description)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0]["name"] = ""; }),
               Contains(at("inputs[0].name", "expected a tensor name, got \"\"")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0]["file"] = "../q.npy"; }),
               Contains(at("inputs[0].file", "'../q.npy' must be a plain file name inside the case folder")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0]["file"] = "q.bin"; }),
               Contains(at("inputs[0].file", "'q.bin' must end in .npy")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][0]["name"] = "q"; }),
               Contains(at("outputs[0].name", "'q' is used twice (also at inputs[0].name)")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][0]["file"] = "q.npy"; }),
               Contains(at("outputs[0].file", "'q.npy' is used twice (also at inputs[0].file)")));
    CHECK(with([](nlohmann::json& j) { j["inputs"][0]["metric"] = "exact"; }).empty());  // inputs may carry one
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0]["tol"] = 0.5; }),
               Contains(at("inputs[0].tol", "given without a 'metric'")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0] = 5; }), Contains(at("inputs[0]", "expected an object, got 5")));
    // Per-precision tolerances ("tols"): known precisions, numbers >= 0, only beside a numeric metric.
    CHECK(with([](nlohmann::json& j) { j["outputs"][1]["tols"] = {{"fp64", 1e-12}, {"fp32", 1e-6}}; }).empty());
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["tols"] = {{"fp8", 1e-1}}; }),
               Contains(at("outputs[1].tols.fp8", "unknown precision 'fp8', expected fp64, fp32, fp16 or bf16")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["tols"] = {{"fp64", -1.0}}; }),
               Contains(at("outputs[1].tols.fp64", "expected a finite tolerance >= 0, got -1")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["tols"] = {{"fp64", "1e-12"}}; }),
               Contains(at("outputs[1].tols.fp64", "expected a number, got \"1e-12\"")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][1]["tols"] = 1e-12; }),
               Contains(at("outputs[1].tols", "expected an object, got 1e-12")));
    CHECK_THAT(with([](nlohmann::json& j) { j["outputs"][0]["tols"] = {{"fp64", 0.0}}; }),
               Contains(at("outputs[0].tols", "per-precision tolerances need metric rel, nmse or abs, got metric 'exact'")));
    CHECK_THAT(with([](nlohmann::json& j) { j["inputs"][0]["tols"] = {{"fp64", 0.0}}; }),
               Contains(at("inputs[0].tols", "per-precision tolerances need metric rel, nmse or abs, got no metric")));

    std::ofstream(dir / "manifest.json") << "{\"algorithm\": \"zipvl\",";
    CHECK_THAT(error_of([&] { (void)vlsparse::read_manifest(dir.path); }),
               Contains("read_manifest: " + mf + ": invalid JSON"));
    CHECK_THAT(error_of([&] { (void)vlsparse::read_manifest(dir / "nowhere"); }),
               Contains("read_manifest: " + (dir / "nowhere" / "manifest.json").string() + ": cannot open"));

    // write_manifest validates too.
    auto bad = m;
    bad.outputs[0].metric = "close";
    CHECK_THAT(error_of([&] { vlsparse::write_manifest(dir.path, bad); }),
               Contains("write_manifest: manifest.json: outputs[0].metric: unknown metric 'close'"));
    bad = m;
    bad.algorithm.clear();
    CHECK_THAT(error_of([&] { vlsparse::write_manifest(dir.path, bad); }),
               Contains("write_manifest: manifest.json: algorithm: expected a non-empty string, got \"\""));
    // write_tensor from an NpyArray infers the dtype from the descr.
    vlsparse::GoldenTensor fromarr;
    fromarr.name = "arr";
    vlsparse::write_tensor(dir.path, fromarr, NpyArray::from(std::vector<std::int32_t>{1, 2}, {2}));
    CHECK(fromarr.dtype == "int32");
    CHECK(fromarr.file == "arr.npy");
    CHECK(vlsparse::read_tensor(dir.path, fromarr).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2});
    vlsparse::GoldenTensor u16;
    u16.name = "u16";
    CHECK(error_of([&] {
              vlsparse::write_tensor(dir.path, u16, NpyArray::from(std::vector<std::uint32_t>{1}, {1}));
          }) == "write_tensor: tensor 'u16': descr '<u4' has no golden dtype (fp32 fp64 fp16 bf16 int64 int32 uint8 bool)");
    vlsparse::GoldenTensor unnamed;
    const float x = 1;
    CHECK_THAT(error_of([&] { vlsparse::write_tensor(dir.path, unnamed, &x, {1}); }), Contains("has no name"));
}

// ---- compare ------------------------------------------------------------------------------------

namespace {
vlsparse::GoldenTensor spec(const std::string& metric, double tol, std::vector<std::int64_t> shape,
                            const std::string& dtype = "fp32") {
    vlsparse::GoldenTensor t;
    t.name = "t";
    t.file = "t.npy";
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.metric = metric;
    t.tol = tol;
    return t;
}
}  // namespace

TEST_CASE("compare: exact", "[io][golden][compare]") {
    const auto s = spec("exact", 0, {2, 3}, "int64");
    const auto e = NpyArray::from(std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}, {2, 3});
    auto r = vlsparse::compare(s, e, e);
    CHECK(r.pass);
    CHECK(r.detail == "exact: all 6 elements equal");

    const auto g = NpyArray::from(std::vector<std::int64_t>{0, 1, 2, 3, 9, 8}, {2, 3});
    r = vlsparse::compare(s, e, g);
    CHECK_FALSE(r.pass);
    CHECK(r.value == 2);
    CHECK(r.detail == "exact: 2 of 6 elements differ; first difference at flat index 4 [1, 1]: expected 4, got 9 (|diff| = 5)");
    CHECK((r.first == 4 && r.expected == 4 && r.got == 9 && r.diff == 5));  // the deciding element, as fields

    // Values, not bytes: int32 indices from a port match int64 goldens.
    CHECK(vlsparse::compare(s, e, NpyArray::from(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5}, {2, 3})).pass);
    CHECK(vlsparse::compare(s, e, NpyArray::from(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3})).pass);
    CHECK_FALSE(vlsparse::compare(s, e, NpyArray::from(std::vector<double>{0, 1, 2, 3, 4, 5.5}, {2, 3})).pass);
    // 64-bit integers are compared exactly, beyond double's 53 bits.
    const std::int64_t big = (std::int64_t{1} << 60) + 1;
    const auto s1 = spec("exact", 0, {1}, "int64");
    CHECK_FALSE(vlsparse::compare(s1, NpyArray::from(&big, {1}),
                                  NpyArray::from(std::vector<std::int64_t>{big - 1}, {1}))
                    .pass);
    CHECK(vlsparse::compare(s1, NpyArray::from(&big, {1}), NpyArray::from(&big, {1})).pass);
    const std::int64_t m1 = -1;
    const std::uint64_t umax = ~0ull;
    CHECK_FALSE(vlsparse::compare(s1, NpyArray::from(&m1, {1}), NpyArray::from(&umax, {1})).pass);
    const std::int8_t m1b = -1;
    CHECK(vlsparse::compare(s1, NpyArray::from(&m1, {1}), NpyArray::from(&m1b, {1})).pass);
    // Masks: bool against uint8.
    const auto sm = spec("exact", 0, {3}, "bool");
    CHECK(vlsparse::compare(sm, NpyArray::from(std::vector<bool>{true, false, true}, {3}),
                            NpyArray::from(std::vector<std::uint8_t>{1, 0, 1}, {3}))
              .pass);
    const auto rm = vlsparse::compare(sm, NpyArray::from(std::vector<bool>{true, false, true}, {3}),
                                      NpyArray::from(std::vector<bool>{true, true, true}, {3}));
    CHECK_FALSE(rm.pass);
    CHECK_THAT(rm.detail, Contains("flat index 1 [1]: expected 0, got 1"));
    // Floats under exact: -0 == +0, NaN matches NaN only.
    const auto sf = spec("exact", 0, {2});
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(vlsparse::compare(sf, NpyArray::from(std::vector<float>{0.0f, nan}, {2}),
                            NpyArray::from(std::vector<float>{-0.0f, nan}, {2}))
              .pass);
    CHECK_FALSE(vlsparse::compare(sf, NpyArray::from(std::vector<float>{0.0f, nan}, {2}),
                                  NpyArray::from(std::vector<float>{0.0f, 1.0f}, {2}))
                    .pass);
}

TEST_CASE("compare: rel, abs, nmse", "[io][golden][compare]") {
    const auto e = NpyArray::from(std::vector<float>{1, -2, 4, 0}, {2, 2});
    const auto g = NpyArray::from(std::vector<float>{1, -2, 4.5f, 0.25f}, {2, 2});  // diffs 0 0 0.5 0.25

    // rel = max|diff| / max|expected| = 0.5 / 4 = 0.125
    auto r = vlsparse::compare(spec("rel", 0.125, {2, 2}), e, g);
    CHECK(r.pass);
    CHECK(r.value == 0.125);
    CHECK(r.detail == "rel: max|got-expected|/max|expected| = 0.125 <= tol 0.125 over 4 elements");
    r = vlsparse::compare(spec("rel", 0.1, {2, 2}), e, g);
    CHECK_FALSE(r.pass);
    CHECK(r.detail == "rel: max|got-expected|/max|expected| = 0.125 > tol 0.1 over 4 elements; first element over "
                      "tolerance at flat index 2 [1, 0]: expected 4, got 4.5 (|diff| = 0.5)");
    // With tol 0.05 the limit is 0.2, so element 2 (0.5) is the first over it; with 0.01 still element 2.
    CHECK_THAT(vlsparse::compare(spec("rel", 0.05, {2, 2}), e, g).detail, Contains("flat index 2 [1, 0]"));

    // abs = 0.5
    r = vlsparse::compare(spec("abs", 0.5, {2, 2}), e, g);
    CHECK(r.pass);
    CHECK(r.value == 0.5);
    r = vlsparse::compare(spec("abs", 0.2, {2, 2}), e, g);
    CHECK_FALSE(r.pass);
    CHECK_THAT(r.detail, Contains("abs: max|got-expected| = 0.5 > tol 0.2") &&
                             Contains("first element over tolerance at flat index 2 [1, 0]: expected 4, got 4.5"));
    r = vlsparse::compare(spec("abs", 0.3, {2, 2}), e, g);
    CHECK_FALSE(r.pass);
    CHECK_THAT(r.detail, Contains("flat index 2 [1, 0]"));
    // The first element over tolerance is reported, not the largest: diffs 0, 0.25, 0, 1 with tol 0.1.
    const auto g2 = NpyArray::from(std::vector<float>{1, -1.75f, 4, 1}, {2, 2});  // diffs 0 0.25 0 1
    CHECK_THAT(vlsparse::compare(spec("abs", 0.1, {2, 2}), e, g2).detail,
               Contains("flat index 1 [0, 1]: expected -2, got -1.75"));
    // An element exactly at the tolerance is not over it: with tol 0.25 the first one over is index 3.
    CHECK_THAT(vlsparse::compare(spec("abs", 0.25, {2, 2}), e, g2).detail,
               Contains("first element over tolerance at flat index 3 [1, 1]: expected 0, got 1"));

    // nmse = (0.25 + 0.0625) / (1 + 4 + 16) = 0.3125 / 21
    r = vlsparse::compare(spec("nmse", 0.015, {2, 2}), e, g);
    CHECK(r.pass);
    CHECK(r.value == Approx(0.3125 / 21).epsilon(1e-12));
    r = vlsparse::compare(spec("nmse", 0.01, {2, 2}), e, g);
    CHECK_FALSE(r.pass);
    CHECK_THAT(r.detail, Contains("nmse: ||got-expected||^2/||expected||^2 = 0.01488") &&
                             Contains("> tol 0.01") && Contains("first difference at flat index 2 [1, 0]"));
    CHECK(r.first == 2);  // nmse: the first nonzero difference
    CHECK(r.diff == std::fabs(r.got - r.expected));

    // Both zero passes every metric; zero expected with nonzero got fails.
    const auto z = NpyArray::from(std::vector<double>{0, 0, 0}, {3});
    const auto nz = NpyArray::from(std::vector<double>{0, 1e-30, 0}, {3});
    for (const char* m : {"nmse", "rel"}) {
        INFO(m);
        CHECK(vlsparse::compare(spec(m, 1e-3, {3}), z, z).pass);
        CHECK_FALSE(vlsparse::compare(spec(m, 1e-3, {3}), z, nz).pass);
    }
    CHECK(vlsparse::compare(spec("abs", 1e-3, {3}), z, nz).pass);

    // Non-finite values: NaN in got fails (it is never silently dropped), equal infinities match.
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const auto e3 = NpyArray::from(std::vector<float>{1, 2, inf}, {3});
    for (const char* m : {"rel", "abs", "nmse"}) {
        INFO(m);
        CHECK(vlsparse::compare(spec(m, 1e-6, {3}), e3, e3).pass);
        const auto rn = vlsparse::compare(spec(m, 1e6, {3}), e3, NpyArray::from(std::vector<float>{1, nan, inf}, {3}));
        CHECK_FALSE(rn.pass);
        CHECK_THAT(rn.detail, Contains("flat index 1 [1]: expected 2, got nan"));
        CHECK_FALSE(vlsparse::compare(spec(m, 1e6, {3}), e3, NpyArray::from(std::vector<float>{1, 2, -inf}, {3})).pass);
    }

    // bf16 goldens are compared as bfloat16 values, not as their uint16 bits.
    const auto eb = NpyArray::from(std::vector<vlsparse::bfloat16>{vlsparse::bfloat16(1.0f)}, {1});
    const auto gb = NpyArray::from(std::vector<vlsparse::bfloat16>{vlsparse::bfloat16(1.0078125f)}, {1});
    CHECK(vlsparse::compare(spec("abs", 0.01, {1}, "bf16"), eb, gb).pass);         // |1.0078 - 1| < 0.01
    CHECK_FALSE(vlsparse::compare(spec("abs", 0.01, {1}, "uint8"), eb, gb).pass);  // as bits: 0x3F81 - 0x3F80 = 1
    CHECK(vlsparse::compare(spec("abs", 0.01, {1}, "bf16"), eb, NpyArray::from(std::vector<float>{1.005f}, {1})).pass);
}

TEST_CASE("compare: shape mismatch and bad specs", "[io][golden][compare]") {
    const auto e = NpyArray::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    const auto t = NpyArray::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
    for (const char* m : {"exact", "rel", "abs", "nmse"}) {
        const auto r = vlsparse::compare(spec(m, 1, {2, 3}), e, t);
        CHECK_FALSE(r.pass);
        CHECK(r.detail == "shape mismatch: expected [2, 3], got [3, 2]");
    }
    const auto flat = NpyArray::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {6});
    CHECK(vlsparse::compare(spec("exact", 0, {2, 3}), e, flat).detail == "shape mismatch: expected [2, 3], got [6]");
    // The golden array must have the manifest's shape too.
    CHECK_THAT(vlsparse::compare(spec("exact", 0, {6}), e, e).detail,
               Contains("the golden tensor has shape [2, 3], the manifest says [6]"));
    // Empty tensors compare equal.
    const auto empty = NpyArray::from(std::vector<float>{}, {0, 3});
    CHECK(vlsparse::compare(spec("nmse", 0, {0, 3}), empty, empty).pass);
    CHECK(vlsparse::compare(spec("exact", 0, {0, 3}), empty, empty).pass);
    // A malformed array is reported, not read out of bounds.
    NpyArray broken = e;
    broken.data.resize(8);
    CHECK_THAT(vlsparse::compare(spec("abs", 1, {2, 3}), e, broken).detail, Contains("got array is malformed"));
    CHECK_THAT(error_of([&] { (void)vlsparse::compare(spec("l1", 1, {2, 3}), e, e); }),
               Contains("compare: tensor 't' has unknown metric 'l1'"));
    CHECK_THAT(error_of([&] { (void)vlsparse::compare(spec("", 1, {2, 3}), e, e); }), Contains("has no metric"));
}

TEST_CASE("golden: end to end through files", "[io][golden][compare]") {
    TempDir dir;
    auto m = sample_manifest(dir.path);
    vlsparse::write_manifest(dir.path, m);
    const auto r = vlsparse::read_manifest(dir.path);
    // A "port" that reproduces every output passes; one that perturbs the scores fails on them only.
    for (const auto& t : r.outputs) {
        const auto expected = vlsparse::read_tensor(dir.path, t);
        INFO(t.name);
        CHECK(vlsparse::compare(t, expected, expected).pass);
    }
    const auto& sc = r.output("scores");
    std::vector<double> s = vlsparse::read_tensor(dir.path, sc).to_vector<double>();
    s[5] += 1e-3;
    const auto res = vlsparse::compare(sc, vlsparse::read_tensor(dir.path, sc), NpyArray::from(s, {8}));
    CHECK_FALSE(res.pass);
    CHECK_THAT(res.detail, Contains("rel:") && Contains("flat index 5 [5]: expected 0.6, got 0.60"));
}
