// vlsparse/io/json.hpp -- strict JSON reading with the JSON path of every problem: the one helper
// behind every Params <-> JSON function (io/*_json.hpp), the golden manifests and the simulator's
// scenario files.
//
// Every unknown key, wrong type, number that does not fit its field or unknown enum name throws
// vlsparse::error naming where it is and what was expected:
//   zipvl_params_from_json: params.tau: expected a number, got "x"
//   scenario: my.json: policies[1].params.heavy: unknown key (known keys: ...)
// so a typo in a manifest or a scenario never silently falls back to a default.
//
//   JsonPath w{"my.json", "params", "my_reader"};     // file (may be ""), JSON path, function named
//   check_object_keys(j, w, {"tau", "grouping"});      // j must be an object with only these keys
//   read_json_value(j["tau"], P.tau, w.key("tau"));    // a number that fits P.tau's type
//   read_json_value(j["grouping"], P.grouping, w.key("grouping"));  // an enum, by its name table
//   read_json_value(j["tols"], tols, w.key("tols"));   // a std::vector (array) or std::map<std::string, T>
//                                                      // (object): each element read as above
// A Params struct lists its fields once (json_fields, below); fields_to_json / fields_from_json write
// and read all of them: that is how every algorithm's to_json and *_params_from_json are made.
//
// Needs nlohmann/json (3.10 or newer). Include: <vlsparse/io/json.hpp>
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"

namespace vlsparse {

// "an integer", "a number", "a string", "a boolean", "an array", "an object" or "null".
inline std::string json_type_name(const nlohmann::json& j) {
    if (j.is_number_integer()) return "an integer";
    if (j.is_number()) return "a number";
    if (j.is_string()) return "a string";
    if (j.is_boolean()) return "a boolean";
    if (j.is_array()) return "an array";
    if (j.is_object()) return "an object";
    return "null";
}

// The value as JSON text, shortened to about 60 characters (for messages).
inline std::string json_repr(const nlohmann::json& j) {
    std::string s = j.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

// What is wrong with reading the JSON number `v` as T ("" when nothing is): the range is checked in
// the JSON's own type before narrowing, so an integer must fit T (4294967297 is not an int, -1 is not
// unsigned) and a number read as float must be 0 or within float's range (1e-50 would round to 0,
// 1e300 to inf). `v` must already be a number (an integer for integral T).
template <class T>
std::string json_number_problem(const nlohmann::json& v) {
    if constexpr (std::is_same_v<T, bool>) {
        return "";
    } else if constexpr (std::is_integral_v<T>) {
        using L = std::numeric_limits<T>;
        const std::string range = detail::concat("expected an integer in [", +L::min(), ", ", +L::max(), "]");
        if (v.is_number_unsigned())
            return v.template get<std::uint64_t>() > static_cast<std::uint64_t>(L::max()) ? range : "";
        const auto x = v.template get<std::int64_t>();
        if constexpr (std::is_signed_v<T>)
            return x < static_cast<std::int64_t>(L::min()) || x > static_cast<std::int64_t>(L::max()) ? range : "";
        else
            return x < 0 || static_cast<std::uint64_t>(x) > static_cast<std::uint64_t>(L::max()) ? range : "";
    } else {
        const auto x = v.template get<double>();
        if (!std::isfinite(x)) return "expected a finite number";
        if constexpr (std::is_same_v<T, float>) {
            using F = std::numeric_limits<float>;
            const double a = std::abs(x);
            if (a != 0.0 && (a < static_cast<double>(F::denorm_min()) || a > static_cast<double>(F::max())))
                return detail::concat("expected 0 or a magnitude in [", F::denorm_min(), ", ", F::max(), "] (fp32)");
        }
        return "";
    }
}

// Where a value sits: the file it came from ("" when none), its JSON path ("" = the top level) and
// the function errors name. Messages read "<fn>: <file>: <path>: <what>" ("<fn>: <path>: <what>"
// without a file).
struct JsonPath {
    std::string file;
    std::string path;
    std::string fn = "json";

    JsonPath key(std::string_view k) const {
        return {file, path.empty() ? std::string(k) : path + "." + std::string(k), fn};
    }
    JsonPath index(std::size_t i) const { return {file, path + "[" + std::to_string(i) + "]", fn}; }
    std::string str() const { return path.empty() ? std::string("(top level)") : path; }

    [[noreturn]] void fail(const std::string& msg) const {
        throw ::vlsparse::error(fn, (file.empty() ? std::string() : file + ": ") + str() + ": " + msg);
    }
    void require(bool ok, const std::string& msg) const {
        if (!ok) fail(msg);
    }
    // The path of a Params object from the prefix the *_params_from_json functions take
    // ("policies[0].params." -> "policies[0].params"; "" stays the top level).
    static JsonPath from_prefix(std::string_view prefix, std::string fn) {
        std::string p(prefix);
        if (!p.empty() && p.back() == '.') p.pop_back();
        return {"", std::move(p), std::move(fn)};
    }
};

// The value at `key`, or nullptr.
inline const nlohmann::json* find_key(const nlohmann::json& j, std::string_view key) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(std::string(key));
    return it == j.end() ? nullptr : &*it;
}

// Throws unless j is an object whose keys are all in `known`.
inline void check_object_keys(const nlohmann::json& j, const JsonPath& w, std::span<const std::string_view> known) {
    if (!j.is_object()) w.fail("expected an object, got " + json_repr(j));
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool ok = false;
        for (auto k : known) ok |= it.key() == k;
        if (!ok) {
            std::string list;
            for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
            w.key(it.key()).fail("unknown key (known keys: " + list + ")");
        }
    }
}
inline void check_object_keys(const nlohmann::json& j, const JsonPath& w, std::initializer_list<std::string_view> known) {
    check_object_keys(j, w, std::span<const std::string_view>(known.begin(), known.size()));
}

// An integer in [lo, hi] at `key`; absent: `fallback`, or an error when there is none.
inline std::int64_t read_int(const nlohmann::json& j, std::string_view key, const JsonPath& w, std::int64_t lo,
                             std::int64_t hi, std::optional<std::int64_t> fallback = std::nullopt) {
    const nlohmann::json* v = find_key(j, key);
    const JsonPath at = w.key(key);
    const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v) {
        if (fallback) return *fallback;
        at.fail("missing (expected " + range + ")");
    }
    if (!v->is_number_integer()) at.fail("expected " + range + ", got " + json_repr(*v));
    std::int64_t x = 0;
    if (v->is_number_unsigned()) {
        const auto u = v->get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            at.fail("expected " + range + ", got " + json_repr(*v));
        x = static_cast<std::int64_t>(u);
    } else {
        x = v->get<std::int64_t>();
    }
    if (x < lo || x > hi) at.fail("expected " + range + ", got " + json_repr(*v));
    return x;
}

// A string at `key`; absent: `fallback`, or an error when there is none.
inline std::string read_string(const nlohmann::json& j, std::string_view key, const JsonPath& w,
                               std::optional<std::string> fallback = std::nullopt) {
    const nlohmann::json* v = find_key(j, key);
    if (!v) {
        if (fallback) return *fallback;
        w.key(key).fail("missing (expected a string)");
    }
    if (!v->is_string()) w.key(key).fail("expected a string, got " + json_repr(*v));
    return v->get<std::string>();
}

// Reads `v` into `out`, strictly: a boolean for bool, an integer that fits for integral types, a
// finite number that fits for floating types, a name of the enum's table (enum_names(E)) for an
// enum. Errors name `at`.
template <class T>
void read_json_value(const nlohmann::json& v, T& out, const JsonPath& at) {
    if constexpr (std::is_enum_v<T>) {
        if (!v.is_string()) at.fail("expected a string (one of " + enum_name_list<T>() + "), got " + json_repr(v));
        const auto s = v.get<std::string>();
        const auto e = enum_from_name<T>(s);
        if (!e) at.fail("unknown value '" + s + "', expected one of " + enum_name_list<T>());
        out = *e;
    } else if constexpr (std::is_same_v<T, bool>) {
        if (!v.is_boolean()) at.fail("expected true or false, got " + json_repr(v));
        out = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
        if (!v.is_number_integer()) at.fail("expected an integer, got " + json_repr(v));
        if (const std::string p = json_number_problem<T>(v); !p.empty()) at.fail(p + ", got " + json_repr(v));
        out = v.get<T>();
    } else {
        static_assert(std::is_floating_point_v<T>, "read_json_value: a bool, an integer, a floating type or an enum");
        if (!v.is_number()) at.fail("expected a number, got " + json_repr(v));
        if (const std::string p = json_number_problem<T>(v); !p.empty()) at.fail(p + ", got " + json_repr(v));
        out = v.get<T>();
    }
}

// An array, each element read as above (errors name the element, "key[i]").
template <class T>
void read_json_value(const nlohmann::json& v, std::vector<T>& out, const JsonPath& at) {
    if (!v.is_array()) at.fail("expected an array, got " + json_repr(v));
    std::vector<T> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) read_json_value(v[i], r[i], at.index(i));
    out = std::move(r);
}

// An object, each value read as above (errors name the value, "key.name"): e.g. {"fp64": 1e-12} as a
// std::map<std::string, double>.
template <class T>
void read_json_value(const nlohmann::json& v, std::map<std::string, T>& out, const JsonPath& at) {
    if (!v.is_object()) at.fail("expected an object, got " + json_repr(v));
    std::map<std::string, T> r;
    for (auto it = v.begin(); it != v.end(); ++it) read_json_value(it.value(), r[it.key()], at.key(it.key()));
    out = std::move(r);
}

// ---- Params described by one list of fields -----------------------------------------------------
// A Params struct P opts in with one overload, found by argument-dependent lookup, that names each of
// its fields once, with its JSON key:
//   template <class Self, class F>
//       requires std::same_as<std::remove_const_t<Self>, P>
//   void json_fields(Self& p, F&& f) { f("tau", p.tau); f("grouping", p.grouping); ... }
// fields_to_json then writes every field and fields_from_json reads them strictly, so the keys, the
// writer and the reader cannot drift apart. A field is a bool, an integer, a floating type, an enum
// with a name table (core/enum_names.hpp), a std::vector of those, or a type with its own to_json and
// read_json_value overloads (e.g. TokenBudget, io/baselines_json.hpp).

// The JSON of one field's value: enums by name, class types through their own to_json.
template <class T>
nlohmann::json json_value_of(const T& v) {
    if constexpr (std::is_enum_v<T>)
        return std::string(enum_name(v));
    else if constexpr (std::is_class_v<T> && requires { to_json(v); })
        return to_json(v);
    else
        return nlohmann::json(v);
}

// The keys of P's fields, in the order json_fields lists them.
template <class P>
std::vector<std::string_view> json_field_keys() {
    P p{};
    std::vector<std::string_view> keys;
    json_fields(p, [&](std::string_view key, const auto&) { keys.push_back(key); });
    return keys;
}

// Every field of `p`, one key each.
template <class P>
nlohmann::json fields_to_json(const P& p) {
    nlohmann::json j = nlohmann::json::object();
    json_fields(p, [&](std::string_view key, const auto& v) { j[std::string(key)] = json_value_of(v); });
    return j;
}

// P with the fields present in `j` read strictly (the others keep their defaults): `j` must be an
// object whose keys are P's keys or `extra` (the caller reads those).
template <class P>
P fields_from_json(const nlohmann::json& j, const JsonPath& w, std::initializer_list<std::string_view> extra = {}) {
    std::vector<std::string_view> known = json_field_keys<P>();
    known.insert(known.end(), extra.begin(), extra.end());
    check_object_keys(j, w, known);
    P p{};
    json_fields(p, [&](std::string_view key, auto& v) {
        if (const nlohmann::json* x = find_key(j, key)) read_json_value(*x, v, w.key(key));
    });
    return p;
}

// Checks `params` against the JSON of a struct's defaults (e.g. the simulator's source params): an
// object, every key known, every value of the default's type (integer, number, boolean, string, array,
// object). `extra` lists keys the caller handles itself (their types are not checked here).
inline void check_params_like(const nlohmann::json& params, const nlohmann::json& defaults, const JsonPath& w,
                              std::initializer_list<std::string_view> extra = {}) {
    if (!params.is_object()) w.fail("expected an object, got " + json_repr(params));
    for (auto it = params.begin(); it != params.end(); ++it) {
        bool is_extra = false;
        for (auto k : extra) is_extra |= it.key() == k;
        if (is_extra) continue;
        const JsonPath at = w.key(it.key());
        if (!defaults.contains(it.key())) {
            std::string list;
            for (auto d = defaults.begin(); d != defaults.end(); ++d) list += (list.empty() ? "" : ", ") + d.key();
            for (auto k : extra) list += (list.empty() ? "" : ", ") + std::string(k);
            at.fail("unknown key (known keys: " + list + ")");
        }
        const nlohmann::json& def = defaults.at(it.key());
        const nlohmann::json& v = it.value();
        if (def.is_boolean() && !v.is_boolean()) at.fail("expected true or false, got " + json_repr(v));
        if (def.is_number_integer() && !v.is_number_integer()) at.fail("expected an integer, got " + json_repr(v));
        if (def.is_number_float() && !v.is_number()) at.fail("expected a number, got " + json_repr(v));
        if (def.is_string() && !v.is_string()) at.fail("expected a string, got " + json_repr(v));
        if (def.is_array() && !v.is_array()) at.fail("expected an array, got " + json_repr(v));
        if (def.is_object() && !v.is_object()) at.fail("expected an object, got " + json_repr(v));
    }
}

// Runs `parse()` (e.g. a *_params_from_json call, or a validate()) and re-addresses its
// vlsparse::error to the JSON path: a message "fn: key = value, expected ..." naming a key of `params`
// becomes "<w.fn>: <file>: <path>.key = value, expected ..."; a message already naming w's path keeps
// it; any other message is given the path of the params object.
template <class F>
auto with_json_path(const nlohmann::json& params, const JsonPath& w, F&& parse) -> decltype(parse()) {
    try {
        return parse();
    } catch (const ::vlsparse::error& e) {
        std::string msg = e.what();
        if (const auto c = msg.find(": "); c != std::string::npos) msg = msg.substr(c + 2);
        std::size_t k = 0;
        while (k < msg.size() && (std::isalnum(static_cast<unsigned char>(msg[k])) || msg[k] == '_')) ++k;
        if (!w.path.empty() && msg.compare(0, w.path.size(), w.path) == 0)  // already addressed
            throw ::vlsparse::error(w.fn, (w.file.empty() ? std::string() : w.file + ": ") + msg);
        const std::string key = msg.substr(0, k);
        if (!key.empty() && params.is_object() && msg.compare(k, 3, " = ") == 0) {
            const JsonPath at = w.key(key);
            throw ::vlsparse::error(w.fn, (at.file.empty() ? std::string() : at.file + ": ") + at.str() + msg.substr(k));
        }
        w.fail(msg);
    }
}

}  // namespace vlsparse
