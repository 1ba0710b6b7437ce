// BlindSight's calibration on the GPU (vlsparse/cuda/blindsight.cuh, Algorithm 1) against
// reference::characterize_prompt: every head's NMSE per template and the chosen template, on random
// inputs (several layouts with images and text, bidirectional images and custom sinks, GQA 1 / 2 / 3 /
// 4, d 40 / 64 / 128, bf16 / fp16 / fp32, both kernels) and the golden/blindsight cases with inputs.
//
// Bars. The NMSE is a statistic of two attention outputs; each output carries the error of the kernel
// that computed it, the NMSE of an output against the reference at most e2 (the manifests' output bars:
// bf16 1e-4, fp16 1e-6; fp32 arithmetic 1e-10), so a template's NMSE moves by at most
// 2 sqrt(NMSE) sqrt(e2) + e2 for each output, both outputs: the test allows twice that (4 sqrt(NMSE e2) +
// 2 e2). The chosen template must equal the reference's unless a candidate's NMSE lies within that bar
// of alpha (a decision inside the kernel's error; counted and printed). alpha is set per case between
// two reference NMSEs so that the heads' decisions differ.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/blindsight.cuh>
#include <vlsparse/reference/blindsight.hpp>
#include <vlsparse/reference/blindsight_golden.hpp>

#include "../test_core.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

int g_near_alpha = 0;

template <class T>
double output_bar(cuda::PrefillKernel kernel, std::int64_t d) {
    const bool tensor_cores = !std::is_same_v<T, float> && (d == 64 || d == 128) && kernel != cuda::PrefillKernel::simt;
    if (!tensor_cores) return vt::tolerance(vt::TestBackend::cuda, DType::f32, vt::Metric::prefill_nmse);  // fp32 arithmetic
    return vt::tolerance<T>(vt::TestBackend::cuda, vt::Metric::prefill_nmse);
}

// Compares the GPU's characterization with the reference's under the bar above.
void check_against(const std::vector<HeadCharacterization>& got, const std::vector<HeadCharacterization>& ref,
                   double alpha, double e2, const std::string& what) {
    INFO(what);
    REQUIRE(got.size() == ref.size());
    for (std::size_t h = 0; h < got.size(); ++h) {
        bool near = false;
        for (MaskTemplate t : kCandidateTemplates) {
            const auto ti = static_cast<std::size_t>(t);
            const double r = ref[h].nmse[ti], g = got[h].nmse[ti];
            const double bar = 4.0 * std::sqrt(r * e2) + 2.0 * e2;
            INFO("head " << h << " " << to_string(t) << ": GPU " << g << ", reference " << r << ", bar " << bar);
            CHECK(std::abs(g - r) <= bar);
            near |= std::abs(r - alpha) <= bar;
        }
        CHECK(got[h].nmse[0] == 0.0);
        if (near) {
            ++g_near_alpha;
            continue;
        }
        INFO("head " << h);
        CHECK(got[h].chosen == ref[h].chosen);
    }
}

// alpha between two of the reference's candidate NMSEs (the middle of the widest gap in the middle
// half), so that some heads choose a template and some stay dense.
double split_alpha(const std::vector<HeadCharacterization>& ref) {
    std::vector<double> v;
    for (const auto& c : ref)
        for (MaskTemplate t : kCandidateTemplates) v.push_back(c.nmse[static_cast<std::size_t>(t)]);
    std::sort(v.begin(), v.end());
    const std::size_t lo = v.size() / 4, hi = std::max(lo + 1, 3 * v.size() / 4);
    std::size_t best = lo;
    for (std::size_t i = lo; i + 1 < hi && i + 1 < v.size(); ++i)
        if (v[i + 1] - v[i] > v[best + 1] - v[best]) best = i;
    return best + 1 < v.size() ? 0.5 * (v[best] + v[best + 1]) : 0.1;
}

template <class T>
void random_case(const std::string& spec, std::int64_t H, std::int64_t Hkv, std::int64_t d, MaskOptions mo,
                 cuda::PrefillKernel kernel, std::uint64_t seed) {
    const Layout layout = Layout::parse(spec);
    const std::int64_t n = layout.n();
    SplitMix64 rng(vt::seed_or(20261126u) * 1000003u + seed);
    auto values = [&](std::int64_t count, double spread) {
        std::vector<T> x(static_cast<std::size_t>(count));
        for (auto& e : x) e = from_float<T>(static_cast<float>(spread * (2.0 * rng.uniform() - 1.0)));
        return x;
    };
    const auto q = values(n * H * d, 3.0), k = values(n * Hkv * d, 1.0), v = values(n * Hkv * d, 1.0);
    const View3<const T> qh(q.data(), {n, H, d}), kh(k.data(), {n, Hkv, d}), vh(v.data(), {n, Hkv, d});
    BlindSightParams P;
    P.mask = mo;
    P.alpha = 0.1;
    const auto ref0 = reference::characterize_prompt(qh, kh, vh, layout, P);
    P.alpha = split_alpha(ref0);
    const auto ref = reference::characterize_prompt(qh, kh, vh, layout, P);
    cuda::DeviceArray<T> qd(q), kd(k), vd(v);
    cuda::BlindSightCalibrator cal(layout, P, H, Hkv);
    cuda::PrefillOptions opt;
    opt.kernel = kernel;
    const auto got = cal.characterize(View3<const T>(qd.data(), {n, H, d}), View3<const T>(kd.data(), {n, Hkv, d}),
                                      View3<const T>(vd.data(), {n, Hkv, d}), opt);
    int chosen_other = 0;
    for (const auto& c : ref) chosen_other += c.chosen != MaskTemplate::dense;
    const std::string what = spec + ", H " + std::to_string(H) + "/" + std::to_string(Hkv) + ", d " + std::to_string(d) +
                             (std::is_same_v<T, float> ? ", fp32" : std::is_same_v<T, bfloat16> ? ", bf16" : ", fp16") +
                             (kernel == cuda::PrefillKernel::simt ? ", simt" : ", automatic") +
                             (mo.bidirectional_images ? ", bidirectional" : "") + ", alpha " + std::to_string(P.alpha) +
                             ", " + std::to_string(chosen_other) + " heads not dense";
    check_against(got, ref, P.alpha, output_bar<T>(kernel, d), what);
}

}  // namespace

TEST_CASE("cuda blindsight: Algorithm 1 against the reference on random inputs", "[cuda][blindsight]") {
    g_near_alpha = 0;
    std::uint64_t seed = 0;
    const char* layouts[] = {"text:20,image:150,text:9,image:100,text:30", "image:64,text:3,image:130,text:64",
                             "text:64,image:96,text:64,image:96,text:64,image:96,text:64"};
    for (const char* spec : layouts)
        for (bool bidir : {false, true}) {
            MaskOptions mo;
            mo.bidirectional_images = bidir;
            if (bidir) mo.sink_offsets = {0, 5, 17};
            for (auto kernel : {cuda::PrefillKernel::automatic, cuda::PrefillKernel::simt}) {
                random_case<bfloat16>(spec, 8, 2, 128, mo, kernel, ++seed);
                random_case<vlsparse::half>(spec, 6, 3, 64, mo, kernel, ++seed);
            }
            random_case<float>(spec, 4, 4, 64, mo, cuda::PrefillKernel::automatic, ++seed);
            random_case<float>(spec, 7, 1, 40, mo, cuda::PrefillKernel::automatic, ++seed);
        }
    std::printf("cuda blindsight: %d heads had a candidate NMSE within the bar of alpha (decision not compared)\n",
                g_near_alpha);
}

TEST_CASE("cuda blindsight: the golden/blindsight cases with attention inputs", "[cuda][blindsight][golden]") {
    namespace fs = std::filesystem;
    const char* env = std::getenv("VLSPARSE_GOLDEN_DIR");
    const fs::path root = fs::path(env ? env : "golden") / "blindsight";
    REQUIRE(fs::is_directory(root));
    int ran = 0;
    for (const auto& e : fs::directory_iterator(root)) {
        GoldenManifest m;
        const auto c = golden::read_blindsight_inputs(e.path(), &m);
        if (c.H == 0) continue;
        INFO("golden/blindsight/" << e.path().filename().string() << " (" << c.dtype << ")");
        const std::int64_t n = c.layout.n();
        const auto nmse = read_tensor(e.path(), m.output("nmse")).to_vector<double>();
        const auto chosen = read_tensor(e.path(), m.output("chosen")).to_vector<std::int64_t>();
        std::vector<HeadCharacterization> ref(static_cast<std::size_t>(c.H));
        for (std::int64_t h = 0; h < c.H; ++h) {
            for (std::size_t t = 0; t < 4; ++t) ref[static_cast<std::size_t>(h)].nmse[t] = nmse[static_cast<std::size_t>(h) * 4 + t];
            ref[static_cast<std::size_t>(h)].chosen = static_cast<MaskTemplate>(chosen[static_cast<std::size_t>(h)]);
        }
        auto run = [&](auto tag, cuda::PrefillKernel kernel) {
            using T = decltype(tag);
            std::vector<T> q(c.q.size()), k(c.k.size()), v(c.v.size());
            for (std::size_t i = 0; i < q.size(); ++i) q[i] = from_float<T>(c.q[i]);
            for (std::size_t i = 0; i < k.size(); ++i) k[i] = from_float<T>(c.k[i]);
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = from_float<T>(c.v[i]);
            cuda::DeviceArray<T> qd(q), kd(k), vd(v);
            cuda::BlindSightCalibrator cal(c.layout, c.params, c.H, c.Hkv);
            cuda::PrefillOptions opt;
            opt.kernel = kernel;
            const auto got = cal.characterize(View3<const T>(qd.data(), {n, c.H, c.d}), View3<const T>(kd.data(), {n, c.Hkv, c.d}),
                                              View3<const T>(vd.data(), {n, c.Hkv, c.d}), opt);
            check_against(got, ref, c.params.alpha, output_bar<T>(kernel, c.d), e.path().filename().string());
        };
        for (auto kernel : {cuda::PrefillKernel::automatic, cuda::PrefillKernel::simt}) {
            if (c.dtype == "bf16") run(bfloat16{}, kernel);
            else run(float{}, kernel);
        }
        ++ran;
    }
    CHECK(ran >= 2);
}

TEST_CASE("cuda blindsight: errors", "[cuda][blindsight]") {
    const Layout layout = Layout::parse("text:10,image:54");
    BlindSightParams P;
    REQUIRE_THROWS_WITH(cuda::BlindSightCalibrator(layout, P, 6, 4), Contains("expected H a positive multiple of H_kv"));
    BlindSightParams bad = P;
    bad.alpha = -1.0;
    REQUIRE_THROWS_WITH(cuda::BlindSightCalibrator(layout, bad, 4, 2), Contains("alpha"));
    cuda::BlindSightCalibrator cal(layout, P, 4, 2);
    const std::int64_t n = 64, d = 64;
    cuda::DeviceArray<bfloat16> q(static_cast<std::size_t>(n * 8 * d)), k(static_cast<std::size_t>(n * 2 * d));
    q.fill_bytes(0);
    k.fill_bytes(0);
    REQUIRE_THROWS_WITH(cal.characterize(View3<const bfloat16>(q.data(), {n, 8, d}), View3<const bfloat16>(k.data(), {n, 2, d}),
                                         View3<const bfloat16>(k.data(), {n, 2, d})),
                        Contains("made for n = 64 tokens and H = 4"));
    REQUIRE_THROWS_WITH(cal.characterize(View3<const bfloat16>(q.data(), {n - 1, 4, d}), View3<const bfloat16>(k.data(), {n - 1, 2, d}),
                                         View3<const bfloat16>(k.data(), {n - 1, 2, d})),
                        Contains("made for n = 64"));
    // Zero inputs: every output 0, every NMSE 0 (no error), every head takes the first candidate.
    const auto r = cal.characterize(View3<const bfloat16>(q.data(), {n, 4, d}), View3<const bfloat16>(k.data(), {n, 2, d}),
                                    View3<const bfloat16>(k.data(), {n, 2, d}));
    for (const auto& c : r) {
        CHECK(c.nmse == std::array<double, 4>{});
        CHECK(c.chosen == MaskTemplate::sink);
    }
}
