// vlsparse/policies/policy.hpp -- one policy interface for every algorithm, and every algorithm's adapter.
//
// A policy answers three questions an engine (or the simulator) asks, layer by layer:
//   prefill:  which positions each layer's KV cache keeps after the prefill, whether the layer's
//             prefill attention is token-sparse or masked, and which tokens stay in the sequence for
//             the later layers                                           -> PrefillDecision
//   decode:   which cached positions decode step t of layer l reads      -> TokenSelection
//   feedback: after the step, the step's head-mean attention; the policy may evict (H2O)
// The concepts PrefillPolicy, DecodePolicy and Policy say it in C++20; AnyPolicy erases the type for
// a runtime choice. Adapters turn every algorithm of the library into a Policy, one header each:
// DensePolicy (dense_policy.hpp), ZipVLPolicy (zipvl_policy.hpp), AvlPolicy (avl_policy.hpp),
// BlindSightPolicy (blindsight_policy.hpp), PureKVPolicy (purekv_policy.hpp) and the baselines
// H2OPolicy, SnapKVPolicy, StreamingLLMPolicy, FastVPolicy, RandomPolicy, FixedRatioPolicy
// (baselines_policy.hpp). Each adapter calls the library's own functions (SIMD path) exactly as an
// engine would; tests/policy_test.cpp checks that. This header is the interface
// (policy_interface.hpp) and every adapter.
//
// Engine loop (see docs/baselines.md, "The policy interface"):
//   policy.begin(layout, shape);
//   positions = 0..n-1
//   for l in 0..L-1: d = policy.prefill({&layout, shape, l, q_l, k_l, v_l, positions});
//                    run the layer's prefill (dense / d.mask / token-sparse over d.kv), fill the cache,
//                    cache.keep(d.kv); if (!d.sequence.empty()) positions = d.sequence (rows dropped)
//   for t = 0, 1, ...: for l: append the token's K/V; read = policy.decode_read(l, t, cached_l);
//                    attend over `read`; if (auto k = policy.decode_observe(l, t, read, attn)) cache.keep(*k)
// Include: <vlsparse/policies/policy.hpp> (or <vlsparse/vlsparse.hpp>); <vlsparse/policies/policy_interface.hpp>
// for the interface alone, <vlsparse/policies/<algo>_policy.hpp> for one adapter.
#pragma once

#include "vlsparse/policies/avl_policy.hpp"
#include "vlsparse/policies/baselines_policy.hpp"
#include "vlsparse/policies/blindsight_policy.hpp"
#include "vlsparse/policies/dense_policy.hpp"
#include "vlsparse/policies/policy_interface.hpp"
#include "vlsparse/policies/purekv_policy.hpp"
#include "vlsparse/policies/zipvl_policy.hpp"

namespace vlsparse {

// Every adapter satisfies the interface.
static_assert(Policy<DensePolicy> && Policy<ZipVLPolicy> && Policy<AvlPolicy> && Policy<BlindSightPolicy> &&
              Policy<PureKVPolicy> && Policy<H2OPolicy> && Policy<SnapKVPolicy> && Policy<StreamingLLMPolicy> &&
              Policy<FastVPolicy> && Policy<RandomPolicy> && Policy<FixedRatioPolicy> && Policy<AnyPolicy>);

}  // namespace vlsparse
