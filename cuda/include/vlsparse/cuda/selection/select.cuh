// vlsparse/cuda/selection/select.cuh -- deterministic selection on the GPU: the reusable routines every
// policy's selection ends in (namespace vlsparse::cuda::detail), and ZipVL's last step built from them.
//
//   block_count_for_mass: p = min { p : sum of the p largest scores >= target }   (ZipVL Eq. 7)
//   block_topk_threshold: the k-th largest score v and how many scores equal to v are taken, so that
//                         "score > v, or score == v among the first `need` positions" is the top-k in
//                         the library's one ranking order (score descending, position ascending)
//   block_compact:        the kept positions, ascending, as one list
//
// All three run over one score vector (one group, one sequence) in a RadixTeam: one thread block, or on
// Hopper a thread-block cluster of up to 8 blocks, each ranking a contiguous slice of the positions
// and adding its histograms to the others' through distributed shared memory (so one vector is ranked
// by up to 8 multiprocessors instead of one). Radix selection over the bits of non-negative fp32
// scores (whose bit patterns order like the values): four passes of 8-bit digits, each a
// shared-memory histogram. Masses are summed in 64-bit fixed point
// (integer additions are associative, so the result does not depend on the order in which threads
// add), counts in integers: the same input gives the same output on every run. Each thread folds runs
// of equal digits before touching shared memory, so the first passes, where nearly every score shares
// the exponent byte, do not serialize on one counter.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vlsparse/cuda/common.cuh"

namespace vlsparse::cuda::detail {

// The thread blocks that rank one score vector together: a thread-block cluster (sm_90 and later,
// launched with a cluster dimension by launch_select_kernel) or a single block. Block `rank` of
// `size` owns the positions [slice_lo, slice_hi) of a vector of n (contiguous slices of
// team_slice(n, size), the same split the host sizes the shared-memory cache by).
inline constexpr int kMaxTeam = 8;  // the portable cluster size
__host__ __device__ constexpr int team_slice(int n, int size) { return ((n + size - 1) / size + 31) / 32 * 32; }

struct RadixTeam {
    int rank = 0, size = 1;

    __device__ static RadixTeam current() {
        RadixTeam t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        t.rank = static_cast<int>(__clusterRelativeBlockRank());
        t.size = static_cast<int>(__clusterSizeInBlocks());
#endif
        return t;
    }
    __device__ int slice_lo(int n) const { return min(n, rank * team_slice(n, size)); }
    __device__ int slice_hi(int n) const { return min(n, (rank + 1) * team_slice(n, size)); }
    // Every thread of every block of the team; shared-memory writes before it are visible to the
    // team's reads after it (the cluster barrier has release / acquire semantics).
    __device__ void sync() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (size > 1) {
            __cluster_barrier_arrive();  // release
            __cluster_barrier_wait();    // acquire
            return;
        }
#endif
        __syncthreads();
    }
    // The same shared-memory object in block r of the team.
    template <class T>
    __device__ T* peer(T* p, int r) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (size > 1) return static_cast<T*>(__cluster_map_shared_rank(p, static_cast<unsigned>(r)));
#endif
        (void)r;
        return p;
    }
};

inline constexpr int kSelectThreads = 1024;

inline constexpr int kSelectWarps = kSelectThreads / 32;
static_assert(kSelectThreads == 1024, "radix_hist merges with four threads per bin");

// Per-warp histograms (dynamic shared memory, select_smem_bytes()): a warp's lanes add to their own
// warp's bins, so the passes where nearly every score falls in one bin contend 32-way, not 1024-way.
struct RadixWarpHist {
    unsigned cnt[kSelectWarps][256];
    unsigned long long mass[kSelectWarps][256];
};
// Scores up to this many per group are also kept in shared memory (after the histograms) while they
// are ranked: the passes then read shared memory instead of L2.
inline constexpr int kSelectCacheMax = 32000;
constexpr std::size_t select_smem_bytes(int cached) {
    return sizeof(RadixWarpHist) + static_cast<std::size_t>(cached) * sizeof(float);
}

struct RadixShared {
    RadixWarpHist* wh;     // the per-warp histograms
    int pass;              // histogram passes so far in this kernel (both rankings): pass p writes buffer
                           // p & 1; set to 0 with `wh` before the first (every block of a team alike)
    unsigned cnt[2][256];  // this block's histogram (merged over its warps), by pass parity: a team's
    unsigned long long mass[2][256];  // other blocks read it until the next pass's barrier
    unsigned tcnt[256];    // summed over the team: what the bins are picked from
    unsigned long long tmass[256];
    int xchg[4];           // values a block publishes to its team (team_exclusive_sum, one slot each)
    int xres[2];
    unsigned prefix, mask;
    unsigned above_cnt;
    unsigned long long above_mass;
    int found;  // 1 while the crossing bin has been found in every pass so far
    int bin;    // the bin chosen by the last pass
    int scan_total;
    int warp_tot[kSelectThreads / 32];
};

// Score j of the vector as an order-preserving 32-bit key (scores are finite and >= 0; -0 -> 0).
__device__ __forceinline__ unsigned score_key(float x) { return x > 0.0f ? __float_as_uint(x) : 0u; }

// Fixed-point mass of a score.
__device__ __forceinline__ unsigned long long fixed_mass(float x, double F) {
    return x > 0.0f ? static_cast<unsigned long long>(static_cast<double>(x) * F + 0.5) : 0ull;
}

// Histogram pass: digit (key >> shift) & 255 of every key in [lo, hi) matching sh.prefix under
// sh.mask, into sh.cnt[P] / sh.mass[P] (this block's, merged from the per-warp histograms), then the
// team's sums into sh.tcnt / sh.tmass (integers: exact in any order). P = sh.pass & 1, the pass's
// parity over the kernel's passes (pick_bin counts them): a team's blocks read each other's buffer P
// until the barrier of the next pass, which writes the other one -- also when that pass is the next
// ranking's first, so a ranking that ends early needs no barrier of its own.
//
// Two ways to fill the block's histogram. Counts of a slice of at most kDirectSlice positions (at most
// 8 per thread: every slice of a team of 8 ranking up to 64K positions) go straight into sh.cnt[P]: the lanes of a warp that
// share a digit are found with __match_any_sync and one of them adds their count. Longer slices, and
// every mass histogram, fold runs of equal digits per thread into per-warp histograms first, which are
// then merged (their clearing and merging, 32-96 KiB of shared memory per pass, is what the direct way
// saves). Masses stay on the per-warp way: a 64-bit shared-memory addition is a compare-and-swap loop,
// and lanes of one warp adding to one bin retry against each other (with its mass passes on the
// direct way too, ZipVL's selection at 16K measured 272 us against 256 us without this change and the
// probe passes' K-tile change, which alone saves about 20 us: one call on an H200).
inline constexpr int kDirectSlice = 8 * kSelectThreads;
template <bool Mass, class Score>
__device__ void radix_hist(RadixShared& sh, const RadixTeam& team, const Score& score, int lo, int hi, int shift,
                           double F) {
    const int warp = threadIdx.x >> 5;
    const int P = sh.pass & 1;
    if (!Mass && hi - lo <= kDirectSlice) {  // (uniform over the block)
        for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.cnt[P][b] = 0;
        __syncthreads();
        const int lane = static_cast<int>(threadIdx.x) & 31;
        const unsigned prefix = sh.prefix, mask = sh.mask;
        constexpr int U = 4;
        const int step = static_cast<int>(blockDim.x);
        // Warp-uniform trip count (the match below needs every lane).
        for (int j0 = lo + static_cast<int>(threadIdx.x) - lane; j0 < hi; j0 += U * step) {
            float xs[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = j0 + lane + u * step;
                xs[u] = j < hi ? score(j) : -1.0f;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                int dg = 256;  // (no digit: past the end, or outside the prefix)
                if (xs[u] >= 0.0f) {
                    const unsigned key = score_key(xs[u]);
                    if ((key & mask) == prefix) dg = static_cast<int>((key >> shift) & 255u);
                }
                const unsigned peers = __match_any_sync(0xffffffffu, dg);
                if (dg != 256 && lane == __ffs(peers) - 1) atomicAdd(&sh.cnt[P][dg], static_cast<unsigned>(__popc(peers)));
            }
        }
    } else {
        for (int i = threadIdx.x; i < kSelectWarps * 256; i += blockDim.x) {
            (&sh.wh->cnt[0][0])[i] = 0;
            if (Mass) (&sh.wh->mass[0][0])[i] = 0;
        }
        for (int b = threadIdx.x; b < 256; b += blockDim.x) {
            sh.cnt[P][b] = 0;
            sh.mass[P][b] = 0;
        }
        __syncthreads();
        unsigned* wc = sh.wh->cnt[warp];
        unsigned long long* wm = sh.wh->mass[warp];
        const unsigned prefix = sh.prefix, mask = sh.mask;
        int cur = -1;
        unsigned c = 0;
        unsigned long long m = 0;
        // Four loads in flight per thread before any of them is used (the loop is latency-bound otherwise);
        // runs of equal digits are folded in registers before they touch shared memory.
        constexpr int U = 4;
        const int step = static_cast<int>(blockDim.x);
        for (int j0 = lo + static_cast<int>(threadIdx.x); j0 < hi; j0 += U * step) {
            float xs[U];
#pragma unroll
            for (int u = 0; u < U; ++u) xs[u] = j0 + u * step < hi ? score(j0 + u * step) : -1.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (xs[u] < 0.0f) continue;  // past the end (scores are >= 0)
                const unsigned key = score_key(xs[u]);
                if ((key & mask) != prefix) continue;
                const int dg = static_cast<int>((key >> shift) & 255u);
                if (dg != cur) {
                    if (cur >= 0) {
                        atomicAdd(&wc[cur], c);
                        if (Mass) atomicAdd(&wm[cur], m);
                    }
                    cur = dg;
                    c = 0;
                    m = 0;
                }
                ++c;
                if (Mass) m += fixed_mass(xs[u], F);
            }
        }
        if (cur >= 0) {
            atomicAdd(&wc[cur], c);
            if (Mass) atomicAdd(&wm[cur], m);
        }
        __syncthreads();
        // Merge: four threads per bin, eight warps each (integer sums: the order does not matter).
        {
            constexpr int per = kSelectWarps / 4;
            const int b = threadIdx.x & 255, part = threadIdx.x >> 8;
            unsigned tc = 0;
            unsigned long long tm = 0;
            for (int w = part * per; w < part * per + per; ++w) {
                tc += sh.wh->cnt[w][b];
                if (Mass) tm += sh.wh->mass[w][b];
            }
            if (tc) atomicAdd(&sh.cnt[P][b], tc);
            if (Mass && tm) atomicAdd(&sh.mass[P][b], tm);
        }
    }
    team.sync();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        // Every block's counter loaded before any is added (remote loads in flight together).
        unsigned c8[kMaxTeam];
        unsigned long long m8[kMaxTeam];
#pragma unroll
        for (int r = 0; r < kMaxTeam; ++r) {
            c8[r] = r < team.size ? *team.peer(&sh.cnt[P][b], r) : 0u;
            m8[r] = Mass && r < team.size ? *team.peer(&sh.mass[P][b], r) : 0ull;
        }
        unsigned tc = 0;
        unsigned long long tm = 0;
#pragma unroll
        for (int r = 0; r < kMaxTeam; ++r) {
            tc += c8[r];
            tm += m8[r];
        }
        sh.tcnt[b] = tc;
        sh.tmass[b] = tm;
    }
    __syncthreads();
}

// The team's exclusive prefix of one int per block (slot: a distinct one per use in a kernel, so that
// no block overwrites what another may still read); `total` the team's sum. Every thread gets both.
__device__ __forceinline__ int team_exclusive_sum(RadixShared& sh, const RadixTeam& team, int slot, int x, int& total) {
    if (team.size == 1) {
        total = x;
        return 0;
    }
    if (threadIdx.x == 0) sh.xchg[slot] = x;
    team.sync();
    if (threadIdx.x == 0) {
        int before = 0, all = 0;
        for (int r = 0; r < team.size; ++r) {
            const int v = *team.peer(&sh.xchg[slot], r);
            if (r < team.rank) before += v;
            all += v;
        }
        sh.xres[0] = before;
        sh.xres[1] = all;
    }
    __syncthreads();
    total = sh.xres[1];
    const int before = sh.xres[0];
    __syncthreads();  // (xres is rewritten by the next exchange)
    return before;
}

// The team's sums of two ints per block in one exchange (slots `slot` and `slot + 1`); every thread
// gets both.
__device__ __forceinline__ void team_sum2(RadixShared& sh, const RadixTeam& team, int slot, int x, int y, int& tx, int& ty) {
    if (team.size == 1) {
        tx = x;
        ty = y;
        return;
    }
    if (threadIdx.x == 0) {
        sh.xchg[slot] = x;
        sh.xchg[slot + 1] = y;
    }
    team.sync();
    if (threadIdx.x == 0) {
        int a = 0, b = 0;
        for (int r = 0; r < team.size; ++r) {
            a += *team.peer(&sh.xchg[slot], r);
            b += *team.peer(&sh.xchg[slot + 1], r);
        }
        sh.xres[0] = a;
        sh.xres[1] = b;
    }
    __syncthreads();
    tx = sh.xres[0];
    ty = sh.xres[1];
    __syncthreads();  // (xres is rewritten by the next exchange)
}

// One warp picks the bin where the running total (from the highest bin down, starting at what lies
// above the current prefix) first reaches the target: mass >= target (Mass) or count >= k. Lane L owns
// bins 255 - 8 L .. 248 - 8 L; a warp scan finds the lane, that lane its bin. Updates prefix, mask, the
// totals above the chosen bin and `bin`; clears `found` when no bin reaches the target (mass only).
template <bool Mass>
__device__ void pick_bin(RadixShared& sh, double target, unsigned k, int shift) {
    const int lane = threadIdx.x & 31;
    // (every thread has read this pass's parity: radix_hist ended with a block barrier)
    if (lane == 0) ++sh.pass;
    unsigned c = 0;
    unsigned long long m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int b = 255 - 8 * lane - i;
        c += sh.tcnt[b];
        if (Mass) m += sh.tmass[b];
    }
    unsigned ci = c;
    unsigned long long mi = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned cy = __shfl_up_sync(0xffffffffu, ci, o);
        const unsigned long long my = __shfl_up_sync(0xffffffffu, mi, o);
        if (lane >= o) {
            ci += cy;
            mi += my;
        }
    }
    const unsigned above_c = sh.above_cnt;
    const unsigned long long above_m = sh.above_mass;
    const bool reach = Mass ? static_cast<double>(above_m + mi) >= target : above_c + ci >= k;
    const unsigned hit = __ballot_sync(0xffffffffu, reach);
    if (hit == 0) {
        if (lane == 0) sh.found = 0;  // (count: cannot happen for 1 <= k <= matching count)
        return;
    }
    // Every lane read above_cnt / above_mass before one lane rewrites them below: the ballot orders
    // the lanes but, unlike __syncwarp, is not a memory barrier (compute-sanitizer's racecheck reported
    // the pair as a hazard).
    __syncwarp();
    if (lane == __ffs(hit) - 1) {
        unsigned cum_c = above_c + ci - c;
        unsigned long long cum_m = above_m + mi - m;
        int chosen = 255 - 8 * lane - 7;
        for (int i = 0; i < 8; ++i) {
            const int b = 255 - 8 * lane - i;
            const bool here = Mass ? static_cast<double>(cum_m + sh.tmass[b]) >= target : cum_c + sh.tcnt[b] >= k;
            if (here) {
                chosen = b;
                break;
            }
            cum_c += sh.tcnt[b];
            if (Mass) cum_m += sh.tmass[b];
        }
        sh.prefix |= static_cast<unsigned>(chosen) << shift;
        sh.mask |= 255u << shift;
        sh.above_cnt = cum_c;
        sh.above_mass = cum_m;
        sh.bin = chosen;
    }
}

// ZipVL Eq. 7: p = min { p : sum of the p largest scores >= target_mass } over score(0 .. n-1), with
// F the fixed-point scale (target_mass in the same units: tau * total * F). n when never reached.
// This block reads score(j) for j in its slice of the team.
template <class Score>
__device__ int block_count_for_mass(RadixShared& sh, const RadixTeam& team, const Score& score, int n, double target,
                                    double F) {
    const int lo = team.slice_lo(n), hi = team.slice_hi(n);
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.mask = 0;
        sh.above_cnt = 0;
        sh.above_mass = 0;
        sh.found = 1;
    }
    __syncthreads();
    int last_bin = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        radix_hist<true>(sh, team, score, lo, hi, shift, F);
        if (threadIdx.x < 32) pick_bin<true>(sh, target, 0, shift);
        __syncthreads();
        if (!sh.found) return n;
        last_bin = sh.bin;
        // One score in the chosen bin: the scores above it fall short of the target and it reaches it,
        // so p is known without the remaining digits (uniform over the team: every block merged the
        // same totals).
        if (shift > 0 && sh.tcnt[last_bin] == 1) {
            const int p = static_cast<int>(sh.above_cnt) + 1;
            __syncthreads();  // (sh is rewritten by the next ranking; the next pass writes the other buffer)
            return p;
        }
    }
    // Every score equal to v = prefix adds the same mass m; take as many as the target needs.
    const unsigned eq = sh.tcnt[last_bin];
    const double m = static_cast<double>(fixed_mass(__uint_as_float(sh.prefix), F));
    const double rem = target - static_cast<double>(sh.above_mass);
    double t = m > 0.0 ? ceil(rem / m) : 1.0;
    t = fmin(fmax(t, 1.0), static_cast<double>(eq));
    // (ceil of a rounded quotient: check the neighbours exactly)
    long long ti = static_cast<long long>(t);
    while (ti > 1 && static_cast<double>(sh.above_mass + static_cast<unsigned long long>(ti - 1) * static_cast<unsigned long long>(m)) >= target) --ti;
    while (ti < static_cast<long long>(eq) && static_cast<double>(sh.above_mass + static_cast<unsigned long long>(ti) * static_cast<unsigned long long>(m)) < target) ++ti;
    const int p = static_cast<int>(sh.above_cnt + static_cast<unsigned>(ti));
    __syncthreads();
    return p;
}

// The k-th largest key (1 <= k <= n) under `vmask`, `need`, the number of scores equal to it that the
// top-k takes, `eq_count`, how many scores equal it, and `eq_before`, how many of those lie in the
// slices of the team's blocks before this one (the rank of this slice's first tie). Compare keys as
// (score_key(x) & vmask) against vkey: vmask covers the digits ranked, all 32 bits unless the top-k
// takes every score of a bin before the last digit (then the rest are not needed: need == eq_count,
// nothing ranked among equals). This block reads score(j) for j in its slice.
template <class Score>
__device__ void block_topk_threshold(RadixShared& sh, const RadixTeam& team, const Score& score, int n, int k,
                                     unsigned& vkey, unsigned& vmask, int& need, int& eq_count, int& eq_before) {
    const int lo = team.slice_lo(n), hi = team.slice_hi(n);
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.mask = 0;
        sh.above_cnt = 0;
    }
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        radix_hist<false>(sh, team, score, lo, hi, shift, 1.0);
        if (threadIdx.x < 32) pick_bin<false>(sh, 0.0, static_cast<unsigned>(k), shift);
        __syncthreads();
        if (shift > 0 && static_cast<int>(sh.tcnt[sh.bin]) == k - static_cast<int>(sh.above_cnt)) {
            // The whole bin is taken: the threshold is its prefix (uniform over the team).
            vkey = sh.prefix;
            vmask = sh.mask;
            need = k - static_cast<int>(sh.above_cnt);
            eq_count = need;
            eq_before = 0;  // (unused: nothing is ranked among equals)
            __syncthreads();
            return;
        }
    }
    vkey = sh.prefix;
    vmask = 0xffffffffu;
    need = k - static_cast<int>(sh.above_cnt);
    eq_count = static_cast<int>(sh.tcnt[sh.bin]);  // the last pass's bin holds exactly the keys equal to vkey
    // (the last pass wrote buffer (pass - 1) & 1; no pass rewrites it before the kernel's end)
    int before = 0;
    const int P = (sh.pass - 1) & 1;
    for (int r = 0; r < team.rank; ++r) before += static_cast<int>(*team.peer(&sh.cnt[P][sh.bin], r));
    eq_before = before;
    __syncthreads();
}

// Exclusive block-wide prefix sum of x (blockDim.x a multiple of 32, at most kSelectThreads); total
// over the block in `total`. Warps scan with shuffles, warp 0 scans the warp totals.
__device__ __forceinline__ int block_exclusive_scan(RadixShared& sh, int x, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int v = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    if (lane == 31) sh.warp_tot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int t = lane < nw ? sh.warp_tot[lane] : 0;
        int u = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, u, o);
            if (lane >= o) u += y;
        }
        sh.warp_tot[lane] = u - t;                                   // exclusive prefix of warp `lane`
        if (lane == 31) sh.scan_total = u;
    }
    __syncthreads();
    const int before = sh.warp_tot[warp];
    total = sh.scan_total;
    __syncthreads();  // (warp_tot is rewritten by the next scan)
    return before + v - x;
}

// Kept positions of [lo, hi) in ascending order, handed to emit(at, j) with at = 0, 1, ... (Write
// false: only counted): position j is kept when keep(j, tie, rank) is true, where tie(j) marks the
// scores equal to the threshold and rank is tie_base plus the number of positions in [lo, j) with tie
// true. `ranked`: whether keep uses rank at all (one scan per tile instead of two when it does not).
// Each thread takes kItems consecutive positions of a tile. Returns the count.
inline constexpr int kCompactItems = 4;
template <bool Write, class Tie, class Keep, class Emit>
__device__ int block_compact_emit(RadixShared& sh, int lo, int hi, bool ranked, const Tie& tie, const Keep& keep,
                                  const Emit& emit, int tie_base = 0) {
    constexpr int I = kCompactItems;
    const int n = hi;
    int carry_tie = tie_base, carry_out = 0;
    const int span = static_cast<int>(blockDim.x) * I;
    for (int base = lo; base < n; base += span) {
        const int j0 = base + static_cast<int>(threadIdx.x) * I;
        bool t[I];
        int nt = 0;
#pragma unroll
        for (int i = 0; i < I; ++i) {
            t[i] = ranked && j0 + i < n && tie(j0 + i);
            nt += t[i] ? 1 : 0;
        }
        int tot_tie = 0;
        int rank = carry_tie;
        if (ranked) rank += block_exclusive_scan(sh, nt, tot_tie);
        bool k[I];
        int nk = 0;
#pragma unroll
        for (int i = 0; i < I; ++i) {
            k[i] = j0 + i < n && keep(j0 + i, t[i], rank);
            rank += t[i] ? 1 : 0;
            nk += k[i] ? 1 : 0;
        }
        int tot_out = 0;
        int at = carry_out + block_exclusive_scan(sh, nk, tot_out);
        if constexpr (Write) {
#pragma unroll
            for (int i = 0; i < I; ++i)
                if (k[i]) emit(at++, j0 + i);
        }
        carry_tie += tot_tie;
        carry_out += tot_out;
    }
    return carry_out;
}

// The same, kept positions written to out[0 .. count) (out null: only counted).
template <class Tie, class Keep>
__device__ int block_compact(RadixShared& sh, int lo, int hi, bool ranked, const Tie& tie, const Keep& keep,
                             std::int32_t* out, int tie_base = 0) {
    const auto write = [out](int at, int j) { out[at] = j; };
    return out ? block_compact_emit<true>(sh, lo, hi, ranked, tie, keep, write, tie_base)
               : block_compact_emit<false>(sh, lo, hi, ranked, tie, keep, write, tie_base);
}

// A team's compaction of one vector: each block compacts its slice [lo, hi) after the earlier
// slices' counts (a counting pass and one exchange first when the team has several blocks), handing
// emit(at, j) the position's place in the team's list. Returns the team's count (every thread).
template <class Tie, class Keep, class Emit>
__device__ int team_compact(RadixShared& sh, const RadixTeam& team, int lo, int hi, bool ranked, const Tie& tie,
                            const Keep& keep, const Emit& emit, int tie_base = 0) {
    int before = 0, total = 0;
    if (team.size > 1)
        before = team_exclusive_sum(sh, team, 0, block_compact_emit<false>(sh, lo, hi, ranked, tie, keep, emit, tie_base), total);
    const auto shifted = [&](int at, int j) { emit(before + at, j); };
    const int mine = block_compact_emit<true>(sh, lo, hi, ranked, tie, keep, shifted, tie_base);
    return team.size > 1 ? total : mine;
}

// ---- ZipVL: scores, p, top-k and forced keeps for one group per block ------------------------------------

struct ZipVLFinishArgs {
    const float* col = nullptr;          // [H_kv][n] probe column sums per KV head
    int n = 0, Hkv = 1, G = 1;           // G = 1 (layer) or H_kv (per KV head)
    int heads_per_group = 1;
    bool probe_rows_nnz = false;         // nnz_j = heads_per_group * #{p >= j} (else n - j)
    const std::int32_t* probes = nullptr;  // [n_probes] ascending
    int n_probes = 0;
    double tau = 1.0, total = 1.0;       // Eq. 7: target tau * total, total = heads_per_group * n_probes
    int keep_last = 0;
    const std::uint8_t* text = nullptr;  // [n] 1 = text token (keep_text), or null
    int rsplit = 1;                      // col holds [rsplit][H_kv][n] partial sums (summed here, in order)
    int cached = 0;                      // n when the scores fit kSelectCacheMax (dynamic shared memory), else 0
    int fixed_p = 0;                     // > 0: p is this (the fixed-ratio ablation), not Eq. 7's count
    bool rank_accumulated = false;       // rank by a_j (the accumulated-score ablation), not a~_j
    std::int32_t* indptr = nullptr;      // G == 1: lists is the final list, indptr {0, count} written here
    float* accumulated = nullptr;        // [G][n]
    float* normalized = nullptr;         // [G][n]
    std::int32_t* lists = nullptr;       // [G][n] scratch: group g's kept list at g * n
    int* p = nullptr;                    // [G]
    int* count = nullptr;                // [G]
    int* status = nullptr;               // bit 0: a non-finite score
    int* status_copy = nullptr;          // where the first block copies *status (beside p and the
                                         // counts, so that the host reads all back in one copy)
};

// Accumulated and normalized scores of every group (grid-stride over G x n): the KV heads' and the
// splits' column sums added in a fixed order, then a~_j = a_j / nnz_j.
template <int Unused = 0>
__global__ void zipvl_scores_kernel(const __grid_constant__ ZipVLFinishArgs f) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const int n = f.n;
    const std::int64_t total = static_cast<std::int64_t>(f.G) * n;
    bool bad = false;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int g = static_cast<int>(i / n), j = static_cast<int>(i % n);
        float a = 0.0f;
        for (int z = 0; z < f.rsplit; ++z) {
            const float* cz = f.col + static_cast<std::int64_t>(z) * f.Hkv * n + j;
            if (f.G == 1) {
                for (int h = 0; h < f.Hkv; ++h) a += cz[static_cast<std::int64_t>(h) * n];
            } else {
                a += cz[static_cast<std::int64_t>(g) * n];
            }
        }
        bad |= !isfinite(a) || a < 0.0f;
        float nnz;
        if (f.probe_rows_nnz) {
            int lo = 0, hi = f.n_probes;  // first probe >= j
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (f.probes[mid] >= j) hi = mid;
                else lo = mid + 1;
            }
            nnz = static_cast<float>(f.heads_per_group) * static_cast<float>(f.n_probes - lo);
        } else {
            nnz = static_cast<float>(n - j);
        }
        f.accumulated[i] = a;
        f.normalized[i] = nnz > 0.0f ? a / nnz : 0.0f;
    }
    if (bad) atomicOr(f.status, 1);
}

// p, top-k and the kept list of one group per team (after zipvl_scores_kernel): grid G x team size,
// the team a cluster of that many blocks (launch_select_kernel) or one block.
template <int Unused = 0>
__global__ void __launch_bounds__(kSelectThreads) zipvl_finish_kernel(const __grid_constant__ ZipVLFinishArgs f) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    __shared__ RadixShared sh;
    extern __shared__ __align__(16) unsigned char select_dyn[];
    const RadixTeam team = RadixTeam::current();
    if (threadIdx.x == 0) {
        sh.wh = reinterpret_cast<RadixWarpHist*>(select_dyn);
        sh.pass = 0;
    }
    const int g = static_cast<int>(blockIdx.x) / team.size, n = f.n;
    const int lo = team.slice_lo(n), hi = team.slice_hi(n);
    const float* acc = f.accumulated + static_cast<std::int64_t>(g) * n;
    const float* nrm = f.normalized + static_cast<std::int64_t>(g) * n;
    const int status = *f.status;
    if (f.status_copy && threadIdx.x == 0 && blockIdx.x == 0) *f.status_copy = status;
    const bool bad = (status & 1) != 0;
    if (bad) {  // a non-finite score: nothing to rank (the host reports it); uniform over the team
        if (threadIdx.x == 0 && team.rank == 0) {
            f.p[g] = 0;
            f.count[g] = 0;
        }
        return;
    }
    // This block's slice of the scores in shared memory (cache[j - lo]) when it fits.
    float* cache = reinterpret_cast<float*>(select_dyn + sizeof(RadixWarpHist));
    const bool cached = f.cached >= hi - lo;
    if (cached)
        for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += blockDim.x) cache[j - lo] = acc[j];
    __syncthreads();
    // Fixed point: the sum of all scores (about `total`) stays below 2^61.
    const double F = ldexp(1.0, 60 - ilogb(f.total) - 1);
    const int p = f.fixed_p > 0 ? f.fixed_p
                  : cached ? block_count_for_mass(sh, team, [&](int j) { return cache[j - lo]; }, n, f.tau * f.total * F, F)
                           : block_count_for_mass(sh, team, [&](int j) { return acc[j]; }, n, f.tau * f.total * F, F);
    // The ranked scores: a~ (Eq. 9), or a (the ablation; already in the cache).
    const float* rk = f.rank_accumulated ? acc : nrm;
    if (cached && !f.rank_accumulated)
        for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += blockDim.x) cache[j - lo] = nrm[j];
    __syncthreads();
    const auto ns = [&](int j) { return cached ? cache[j - lo] : rk[j]; };
    unsigned vkey = 0, vmask = 0xffffffffu;
    int need = n;
    const bool all = p >= n;
    int eq_count = 0, eq_before = 0;
    if (!all) block_topk_threshold(sh, team, ns, n, p, vkey, vmask, need, eq_count, eq_before);
    const int keep_from = n - f.keep_last;
    std::int32_t* out = f.indptr ? f.lists : f.lists + static_cast<std::int64_t>(g) * n;
    // Ranks among the scores equal to the threshold matter only when some of them are left out.
    const bool ranked = !all && need < eq_count;
    const auto tie = [&](int j) { return (score_key(ns(j)) & vmask) == vkey; };
    const auto keep = [&](int j, bool t, int rank) {
        const unsigned key = score_key(ns(j)) & vmask;
        const bool top = all || key > vkey || (key == vkey && (!ranked || (t && rank < need)));
        return top || j >= keep_from || (f.text && f.text[j]);
    };
    const int cnt = team_compact(sh, team, lo, hi, ranked, tie, keep, [out](int at, int j) { out[at] = j; }, eq_before);
    if (threadIdx.x == 0 && team.rank == 0) {
        f.p[g] = p;
        f.count[g] = cnt;
        if (f.indptr) {
            f.indptr[0] = 0;
            f.indptr[1] = cnt;
        }
    }
    team.sync();  // no block leaves while another may still read its shared memory
}

// ---- host: team size, shared-memory cache and launch of a ranking kernel ---------------------------------

// How a ranking kernel is launched over vectors of up to `longest` positions: `team` blocks per
// vector (a cluster, where the device and the kernel's binary support clusters; more blocks once
// a vector is long enough to keep each busy), each caching up to `cached` scores of its slice in
// dynamic shared memory (0: the slices are read from global memory), `smem` dynamic bytes per block.
struct SelectLaunch {
    int team = 1;
    int cached = 0;
    std::size_t smem = 0;
};

inline constexpr int kTeamMinSlice = 2048;  // positions per block below which a team gets smaller
// The team a vector of `longest` positions asks for: a block per `min_slice` positions, at most kMaxTeam.
inline int team_wanted(std::int64_t longest, int min_slice = kTeamMinSlice) {
    return static_cast<int>(std::clamp<std::int64_t>((longest + min_slice - 1) / min_slice, 1, kMaxTeam));
}

// A launch of `grid` blocks of `threads` threads in thread-block clusters of `team` blocks along x
// (team 1: no cluster attribute, a plain launch). Not copyable: cfg.attrs points into the object.
struct ClusterLaunchConfig {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[2]{};
    ClusterLaunchConfig(dim3 grid, int threads, std::size_t smem, int team, cudaStream_t stream = nullptr,
                        bool dependent = false) {
        cfg.gridDim = grid;
        cfg.blockDim = dim3(static_cast<unsigned>(threads));
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        unsigned k = 0;
        if (team > 1) {
            attr[k].id = cudaLaunchAttributeClusterDimension;
            attr[k].val.clusterDim.x = static_cast<unsigned>(team);
            attr[k].val.clusterDim.y = 1;
            attr[k].val.clusterDim.z = 1;
            ++k;
        }
        if (dependent) {  // a programmatic dependent launch (the kernel begins with dependent_entry())
            attr[k].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[k].val.programmaticStreamSerializationAllowed = 1;
            ++k;
        }
        cfg.attrs = attr;
        cfg.numAttrs = k;
    }
    ClusterLaunchConfig(const ClusterLaunchConfig&) = delete;
    ClusterLaunchConfig& operator=(const ClusterLaunchConfig&) = delete;
};

// `team` where the device launches clusters, the kernel's binary is an sm_90+ one (which reads its
// team from the cluster: RadixTeam::current) and a cluster of `team` blocks of kSelectThreads threads
// with `smem` bytes of dynamic shared memory each fits the GPU; else 1 (the kernel then runs one block per
// team, which every kernel built on RadixTeam also supports).
template <class Kernel>
int cluster_team_or_one(Kernel* kernel, int team, std::size_t smem, const char* fn) {
    if (team <= 1) return 1;
    int dev = 0, cluster_ok = 0;
    check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&cluster_ok, cudaDevAttrClusterLaunch, dev), fn, "cudaDeviceGetAttribute");
    cudaFuncAttributes fa{};
    check_cuda(cudaFuncGetAttributes(&fa, kernel), fn, "cudaFuncGetAttributes");
    if (!cluster_ok || fa.binaryVersion < 90) return 1;
    const ClusterLaunchConfig c(dim3(static_cast<unsigned>(team)), kSelectThreads, smem, team);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &c.cfg) != cudaSuccess || clusters < 1) {
        (void)cudaGetLastError();  // a GPU (or a partition of one) that cannot place the cluster
        return 1;
    }
    return team;
}

// How many blocks rank one vector of up to `longest` positions: a cluster of one block per
// `min_slice` positions (at most kMaxTeam) where cluster_team_or_one allows it; else 1.
template <class Kernel>
int select_team_size(Kernel* kernel, std::int64_t longest, std::size_t smem, const char* fn, int min_slice = kTeamMinSlice) {
    return cluster_team_or_one(kernel, team_wanted(longest, min_slice), smem, fn);
}

// A ranking kernel's launch over vectors of up to `longest` positions, with the scores of each
// block's slice cached in dynamic shared memory where they fit beside the histograms.
template <class Kernel>
SelectLaunch plan_select_launch(Kernel* kernel, std::int64_t longest, const char* fn, int min_slice = kTeamMinSlice) {
    SelectLaunch L;
    int dev = 0, optin = 0;
    check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), fn, "cudaDeviceGetAttribute");
    cudaFuncAttributes fa{};
    check_cuda(cudaFuncGetAttributes(&fa, kernel), fn, "cudaFuncGetAttributes");
    // What fits beside the histograms and the kernel's static shared memory on this device.
    const std::int64_t room = (static_cast<std::int64_t>(optin) - static_cast<std::int64_t>(fa.sharedSizeBytes) -
                               static_cast<std::int64_t>(sizeof(RadixWarpHist))) / static_cast<std::int64_t>(sizeof(float));
    require(room >= 0, fn, "the ranking kernel needs ", sizeof(RadixWarpHist) + fa.sharedSizeBytes,
            " bytes of shared memory per block; this GPU allows ", optin);
    const std::int64_t cap = std::min<std::int64_t>(room, kSelectCacheMax);
    auto size = [&](int team) {
        const int slice = team_slice(static_cast<int>(longest), team);
        L.team = team;
        L.cached = slice <= cap ? slice : 0;
        L.smem = select_smem_bytes(L.cached);
    };
    size(team_wanted(longest, min_slice));  // the shared memory the cluster check asks for
    // Set on every launch, never cached in a function-local static: this function is inline, so one
    // static would serve every translation unit of a program while each has its own copy of the kernel
    // (and the attribute is per device).
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(select_smem_bytes(static_cast<int>(cap)))),
               fn, "cudaFuncSetAttribute");
    if (select_team_size(kernel, longest, L.smem, fn, min_slice) == 1) size(1);
    return L;
}

// Launches kernel<<<vectors x team, kSelectThreads, smem>>>(args) with clusters of `team` blocks and
// args.cached set from L; `dependent`: as a programmatic dependent launch (the kernel then begins with
// dependent_entry(), common.cuh).
template <class Kernel, class Args>
void launch_select_kernel(Kernel* kernel, int vectors, const SelectLaunch& L, cudaStream_t stream, Args& args,
                          const char* fn, const char* name, bool dependent = true) {
    args.cached = L.cached;
    const ClusterLaunchConfig c(dim3(static_cast<unsigned>(vectors * L.team)), kSelectThreads, L.smem, L.team, stream,
                                dependent && dependent_launch_supported(kernel, fn));
    check_cuda(cudaLaunchKernelEx(&c.cfg, kernel, args), fn, name);
    check_launch(fn, name);
}

// Group g's list moved from lists + g * n to its CSR place; indptr [G + 1] written. Grid (G, any):
// block (g, b) copies entries b * 1024 .. of group g.
inline constexpr int kPackSpan = 1024;
template <int Unused = 0>
__global__ void pack_lists_kernel(const std::int32_t* lists, const int* count, int n, int G, std::int32_t* indices,
                                  std::int32_t* indptr) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const int g = blockIdx.x;
    int off = 0;
    for (int h = 0; h < g; ++h) off += count[h];
    const int c = count[g];
    const int lo = blockIdx.y * kPackSpan, hi = min(c, lo + kPackSpan);
    for (int i = lo + static_cast<int>(threadIdx.x); i < hi; i += blockDim.x)
        indices[off + i] = lists[static_cast<std::int64_t>(g) * n + i];
    if (blockIdx.y == 0 && threadIdx.x == 0) {
        if (g == 0) indptr[0] = 0;
        indptr[g + 1] = off + c;
    }
}

// indices[i] = i (a dense layer's list).
template <int Unused = 0>
__global__ void iota_kernel(std::int32_t* out, int n) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = i;
}

}  // namespace vlsparse::cuda::detail
