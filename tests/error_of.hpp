// Test helper shared by the test files: the message of the vlsparse::error a call throws. One
// definition for every test file, so that they compile together as one translation unit (the unity
// builds of tests/meson.build).
#pragma once

#include <string>

#include <vlsparse/core/error.hpp>

namespace vt {

// The what() of the vlsparse::error that `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const vlsparse::error& e) {
        return e.what();
    }
    return "";
}

}  // namespace vt
