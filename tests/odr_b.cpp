// ODR check, translation unit B.
#include <vlsparse/vlsparse.hpp>
#include <vlsparse/reference/zipvl.hpp>
#include <vlsparse/io/golden.hpp>

int odr_b() { return static_cast<int>(vlsparse::Layout::parse("image:5,text:2").n()); }
