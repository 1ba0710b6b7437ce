// vlsparse/sim/json_util.hpp -- strict JSON reading with the JSON path of every problem.
//
// The simulator's scenario files and policy parameters are read through these helpers, so every
// unknown key, wrong type or out-of-range value is reported as
//   scenario: <file>: policies[1].params.tau: expected a number, got "x"
// (the file, the JSON path, what was expected and what was found). A Params object is checked
// against the JSON of its defaults (to_json(Params{})): the defaults name the known keys and their
// types; the library's own *_from_json then checks enum names and ranges, and its message is
// re-addressed to the path of the key it names.
// Include: <vlsparse/sim/json_util.hpp>
#pragma once

#include <cctype>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/error.hpp"

namespace vlsparse::sim {

using json = nlohmann::json;

// "a number", "a string", ... for messages.
inline std::string json_type_name(const json& j) {
    if (j.is_number_integer()) return "an integer";
    if (j.is_number()) return "a number";
    if (j.is_string()) return "a string";
    if (j.is_boolean()) return "a boolean";
    if (j.is_array()) return "an array";
    if (j.is_object()) return "an object";
    return "null";
}

// The value as JSON text, shortened to about 60 characters.
inline std::string json_repr(const json& j) {
    std::string s = j.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

// Where a value sits: the file (may be empty) and the JSON path ("" = the root).
struct JsonWhere {
    std::string file;
    std::string path;

    JsonWhere key(std::string_view k) const { return {file, path.empty() ? std::string(k) : path + "." + std::string(k)}; }
    JsonWhere index(std::size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
    std::string str() const { return path.empty() ? std::string("(top level)") : path; }

    [[noreturn]] void fail(const std::string& msg) const {
        throw ::vlsparse::error("scenario", (file.empty() ? std::string() : file + ": ") + str() + ": " + msg);
    }
    void require(bool ok, const std::string& msg) const {
        if (!ok) fail(msg);
    }
};

// Throws unless j is an object whose keys are all in `known`.
inline void check_object_keys(const json& j, const JsonWhere& w, std::initializer_list<std::string_view> known) {
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

inline const json* find_key(const json& j, std::string_view key) {
    auto it = j.find(std::string(key));
    return it == j.end() ? nullptr : &*it;
}

inline std::int64_t read_int(const json& j, std::string_view key, const JsonWhere& w, std::int64_t lo, std::int64_t hi,
                             std::optional<std::int64_t> fallback = std::nullopt) {
    const json* v = find_key(j, key);
    const JsonWhere at = w.key(key);
    if (!v) {
        if (fallback) return *fallback;
        at.fail("missing (expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "])");
    }
    if (!v->is_number_integer())
        at.fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + json_repr(*v));
    std::int64_t x = 0;
    if (v->is_number_unsigned()) {
        const auto u = v->get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            at.fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + json_repr(*v));
        x = static_cast<std::int64_t>(u);
    } else {
        x = v->get<std::int64_t>();
    }
    if (x < lo || x > hi)
        at.fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + json_repr(*v));
    return x;
}

inline std::string read_string(const json& j, std::string_view key, const JsonWhere& w,
                               std::optional<std::string> fallback = std::nullopt) {
    const json* v = find_key(j, key);
    if (!v) {
        if (fallback) return *fallback;
        w.key(key).fail("missing (expected a string)");
    }
    if (!v->is_string()) w.key(key).fail("expected a string, got " + json_repr(*v));
    return v->get<std::string>();
}

// Checks `params` against the JSON of a Params struct's defaults: an object, every key known, every
// value of the default's type (integer, number, boolean, string, array, object). `extra` lists keys the
// caller handles itself (their types are not checked here).
inline void check_params_like(const json& params, const json& defaults, const JsonWhere& w,
                              std::initializer_list<std::string_view> extra = {}) {
    if (!params.is_object()) w.fail("expected an object, got " + json_repr(params));
    for (auto it = params.begin(); it != params.end(); ++it) {
        bool is_extra = false;
        for (auto k : extra) is_extra |= it.key() == k;
        if (is_extra) continue;
        const JsonWhere at = w.key(it.key());
        if (!defaults.contains(it.key())) {
            std::string list;
            for (auto d = defaults.begin(); d != defaults.end(); ++d) list += (list.empty() ? "" : ", ") + d.key();
            for (auto k : extra) list += (list.empty() ? "" : ", ") + std::string(k);
            at.fail("unknown key (known keys: " + list + ")");
        }
        const json& def = defaults.at(it.key());
        const json& v = it.value();
        if (def.is_boolean() && !v.is_boolean()) at.fail("expected true or false, got " + json_repr(v));
        if (def.is_number_integer() && !v.is_number_integer()) at.fail("expected an integer, got " + json_repr(v));
        if (def.is_number_float() && !v.is_number()) at.fail("expected a number, got " + json_repr(v));
        if (def.is_string() && !v.is_string()) at.fail("expected a string, got " + json_repr(v));
        if (def.is_array() && !v.is_array()) at.fail("expected an array, got " + json_repr(v));
        if (def.is_object() && !v.is_object()) at.fail("expected an object, got " + json_repr(v));
    }
}

// Runs `parse()` (a library *_from_json call) and re-addresses its vlsparse::error to the JSON path:
// a message "fn: key = value, expected ..." naming a key of `params` becomes "<path>.key = value,
// expected ..."; any other message is prefixed with the path of the params object.
template <class F>
auto with_json_path(const json& params, const JsonWhere& w, F&& parse) -> decltype(parse()) {
    try {
        return parse();
    } catch (const ::vlsparse::error& e) {
        std::string msg = e.what();
        if (const auto c = msg.find(": "); c != std::string::npos) msg = msg.substr(c + 2);
        std::size_t k = 0;
        while (k < msg.size() && (std::isalnum(static_cast<unsigned char>(msg[k])) || msg[k] == '_')) ++k;
        if (!w.path.empty() && msg.compare(0, w.path.size(), w.path) == 0)  // already addressed
            throw ::vlsparse::error("scenario", (w.file.empty() ? std::string() : w.file + ": ") + msg);
        const std::string key = msg.substr(0, k);
        if (!key.empty() && params.is_object() && msg.compare(k, 3, " = ") == 0) {
            const JsonWhere at = w.key(key);
            throw ::vlsparse::error("scenario", (at.file.empty() ? std::string() : at.file + ": ") + at.str() +
                                                    msg.substr(k));
        }
        w.fail(msg);
    }
}

}  // namespace vlsparse::sim
