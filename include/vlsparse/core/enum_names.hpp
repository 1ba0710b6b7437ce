// vlsparse/core/enum_names.hpp -- one name table per enum, written next to the enum.
//
// An enum E that has names declares, in its own header and namespace,
//   inline constexpr EnumName<E> kENames[] = {{E::a, "a"}, {E::b, "b"}};
//   constexpr std::span<const EnumName<E>> enum_names(E) { return kENames; }
//   constexpr std::string_view to_string(E e) { return enum_name(e); }
// and every reader and writer (to_string, the JSON of the Params, the simulator) uses that table,
// so a name is spelled once. enum_from_name<E>("a") finds a value by name; enum_name_list<E>()
// gives "a, b" for messages.
// Include: <vlsparse/core/enum_names.hpp>
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace vlsparse {

template <class E>
struct EnumName {
    E value;
    std::string_view name;
};

// The name of `e` in its table (found by argument-dependent lookup of enum_names(E)); "?" when the
// value is not in the table.
template <class E>
constexpr std::string_view enum_name(E e) {
    for (const auto& x : enum_names(e))
        if (x.value == e) return x.name;
    return "?";
}

// The value named `s`, or nothing.
template <class E>
constexpr std::optional<E> enum_from_name(std::string_view s) {
    for (const auto& x : enum_names(E{}))
        if (x.name == s) return x.value;
    return std::nullopt;
}

// "a, b, c": the names of E in table order, for messages.
template <class E>
std::string enum_name_list() {
    std::string out;
    for (const auto& x : enum_names(E{})) {
        if (!out.empty()) out += ", ";
        out += x.name;
    }
    return out;
}

}  // namespace vlsparse
