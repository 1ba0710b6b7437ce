// vlsparse/io/params_json.hpp -- every algorithm's Params to and from JSON, one header per algorithm:
//   <vlsparse/io/zipvl_json.hpp>       to_json(ZipVLParams), zipvl_params_from_json
//   <vlsparse/io/avl_json.hpp>         to_json(AvlParams), avl_params_from_json
//   <vlsparse/io/purekv_json.hpp>      to_json(PureKVParams), purekv_params_from_json
//   <vlsparse/io/blindsight_json.hpp>  to_json(BlindSightParams), blindsight_params_from_json, head maps
//   <vlsparse/io/baselines_json.hpp>   to_json / *_params_from_json of H2O, SnapKV, StreamingLLM, FastV,
//                                      random and fixed ratio; to_json(TokenBudget), token_budget_from_json
// One format everywhere: golden manifests (their "params"), the simulator's scenarios and reports and
// the Python module write and read these functions' JSON. to_json writes every field; from_json reads
// strictly through <vlsparse/io/json.hpp> (unknown keys, wrong types and unknown names are errors
// naming the key; keys not present keep their defaults) and validates the result.
// Needs nlohmann/json. Include: <vlsparse/io/params_json.hpp>
#pragma once

#include "vlsparse/io/avl_json.hpp"
#include "vlsparse/io/baselines_json.hpp"
#include "vlsparse/io/blindsight_json.hpp"
#include "vlsparse/io/purekv_json.hpp"
#include "vlsparse/io/zipvl_json.hpp"
