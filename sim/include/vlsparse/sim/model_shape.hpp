// vlsparse/sim/model_shape.hpp -- the simulator uses the library's ModelShape.
// Include: <vlsparse/sim/model_shape.hpp>
#pragma once

#include "vlsparse/core/model_shape.hpp"

namespace vlsparse::sim {
using ::vlsparse::ModelShape;
}  // namespace vlsparse::sim
