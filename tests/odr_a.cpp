// ODR check, translation unit A: every public header in a second TU of the same program.
#include <vlsparse/vlsparse.hpp>
#include <vlsparse/reference/zipvl.hpp>
#include <vlsparse/io/golden.hpp>

int odr_b();

int main() {
    const auto l = vlsparse::Layout::parse("text:3,image:4");
    return (l.n() == 7 && odr_b() == 7) ? 0 : 1;
}
