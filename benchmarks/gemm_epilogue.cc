// Probe for benchmarks/gemm_epilogue.py: is a GEMM's bias (+ GELU) epilogue cheaper inside
// oneDNN's matmul primitive (bias argument, gelu_erf post-op) than as disc does it today, a
// dnnl_sgemm call followed by a generated elementwise kernel? The disc prelude (disc_gelu...) is
// prepended to this file by the driver, so the kernel is the one compiled programs run.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// What a generated loop kernel does after the GEMM: out = gelu(c + bias) (or c + bias), rows in parallel.
void bias_epilogue(const float* c, const float* bias, float* out, int64_t m, int64_t n, bool gelu) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    if (gelu) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[r * n + j] = disc_gelu(c[r * n + j] + bias[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[r * n + j] = c[r * n + j] + bias[j];
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// Times, interleaved round by round, for A [m, k] @ W^T (W stored [n, k], as torch's Linear keeps
// it) + bias [n], then GELU if `gelu`:
//   ms[0] dnnl_sgemm + the generated kernel   ms[1] matmul primitive with bias and post-op
//   ms[2] matmul primitive + the kernel      ms[3] dnnl_sgemm alone (no epilogue: the floor)
// *max_rel: largest |fused - unfused| over the largest |unfused| (two GEMM routines round differently). Returns 0, or 1 on a oneDNN error.
extern "C" int disc_epilogue_probe(int64_t m, int64_t k, int64_t n, int32_t gelu, int32_t rounds, double* ms, double* max_rel,
                                   char* impl, int64_t impl_len) {
  using dnnl::memory;
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    std::vector<float> a(m * k), w(n * k), bias(n), c(m * n), unfused(m * n), fused(m * n);
    uint32_t state = 12345;
    auto next = [&state] { state = state * 1664525u + 1013904223u; return float(state >> 8) / float(1 << 24) - 0.5f; };
    for (float& x : a) x = next();
    for (float& x : w) x = 0.2f * next();
    for (float& x : bias) x = next();
    const memory::desc ad({m, k}, memory::data_type::f32, memory::dims{k, 1});
    const memory::desc wd({k, n}, memory::data_type::f32, memory::dims{1, k});
    const memory::desc bd({1, n}, memory::data_type::f32, memory::dims{n, 1});
    const memory::desc cd({m, n}, memory::data_type::f32, memory::dims{n, 1});
    dnnl::post_ops ops;
    if (gelu) ops.append_eltwise(dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const dnnl::matmul::primitive_desc with_epilogue(eng, ad, wd, bd, cd, attr);
    const dnnl::matmul::primitive_desc plain(eng, ad, wd, cd);
    const dnnl::matmul mm_epilogue(with_epilogue), mm_plain(plain);
    std::snprintf(impl, size_t(impl_len), "%s", with_epilogue.impl_info_str());
    memory am(ad, eng, a.data()), wm(wd, eng, w.data()), bm(bd, eng, bias.data()), cm(cd, eng, c.data()), fm(cd, eng, fused.data());
    auto sgemm = [&] { dnnl_sgemm('N', 'T', m, n, k, 1.0f, a.data(), k, w.data(), k, 0.0f, c.data(), n); };
    auto variants = std::vector<std::function<void()>>{
        [&] { sgemm(); bias_epilogue(c.data(), bias.data(), unfused.data(), m, n, gelu); },
        [&] { mm_epilogue.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, fm}}); s.wait(); },
        [&] {
          mm_plain.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
          s.wait();
          bias_epilogue(c.data(), bias.data(), unfused.data(), m, n, gelu);
        },
        [&] { sgemm(); },
    };
    std::vector<std::vector<double>> times(variants.size());
    for (auto& f : variants) f();  // warm-up: primitive JIT, page faults
    for (int32_t r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < variants.size(); ++i) {
        const size_t v = (i + size_t(r)) % variants.size();  // rotate the order each round
        const double t0 = now_s();
        variants[v]();
        times[v].push_back(now_s() - t0);
      }
    }
    for (size_t v = 0; v < variants.size(); ++v) ms[v] = 1e3 * median(times[v]);
    variants[0]();
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      diff = std::max(diff, double(std::fabs(fused[i] - unfused[i])));
      scale = std::max(scale, double(std::fabs(unfused[i])));
    }
    *max_rel = diff / std::max(scale, 1e-30);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(impl, size_t(impl_len), "error: %s", e.what());
    return 1;
  }
}
