// Weight-only int8 Linear for a few rows (a decode step), AVX2 + FMA: y = x W^T * scale + bias.
//
// x stays float32; each int8 weight is widened to float32 in registers and multiplied in float32, so
// the only rounding beyond float32 is the weight's own (per-output-channel int8). A row's outputs do
// not depend on the other rows: each dot product runs in the same order whatever the row count.
//
// Weights are stored in blocks of R outputs, interleaved in steps of KS inputs
// ([N / R][K / KS][R][KS], int8_pack): one block is one sequential stream of R * K bytes, which the
// hardware prefetcher follows across pages (row-major rows read side by side did not: measured 10.8
// against 19.5 GB/s from DRAM on an AMD Zen 3, 2 threads). Blocks are spread over the intra-op threads.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

namespace {

constexpr int64_t R = 4;   // outputs per block
constexpr int64_t KS = 8;  // inputs per step (one 256-bit float32 vector)
constexpr int64_t PREFETCH_BYTES = 1024;

bool cpu_supported() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehdup_ps(s));
  s = _mm_add_ss(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(s);
}

// Rows x[0..MB) against outputs J0..J0+NJ of one block; MB * NJ accumulators stay in registers.
template <int MB, int NJ, int J0>
__attribute__((target("avx2,fma"))) inline void tile(const float* x, int64_t K, const int8_t* wb,
                                                     const float* scale, const float* bias, float* y,
                                                     int64_t ldy, int64_t valid) {
  __m256 acc[MB][NJ];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NJ; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += KS) {
    const int8_t* p = wb + k * R + J0 * KS;
    _mm_prefetch(reinterpret_cast<const char*>(p + PREFETCH_BYTES), _MM_HINT_T0);
    __m256 w[NJ];
    for (int j = 0; j < NJ; ++j)
      w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j * KS))));
    for (int i = 0; i < MB; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * K + k);
      for (int j = 0; j < NJ; ++j) acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NJ; ++j) {
      if (J0 + j >= valid) continue;
      float v = hsum(acc[i][j]) * scale[J0 + j];
      if (bias != nullptr) v += bias[J0 + j];
      y[i * ldy + J0 + j] = v;
    }
}

// Every row against one block of outputs n0..n0+R (fewer in a last, padded block). Rows go four,
// then two, then one at a time; the block is read from memory once and from the cache after that.
__attribute__((target("avx2,fma"))) void block(const float* x, int64_t M, int64_t K, const int8_t* wb,
                                               const float* scale, const float* bias, float* y, int64_t N,
                                               int64_t n0) {
  const int64_t valid = std::min<int64_t>(R, N - n0);
  scale += n0;
  if (bias != nullptr) bias += n0;
  y += n0;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    tile<4, 2, 0>(x + m * K, K, wb, scale, bias, y + m * N, N, valid);
    tile<4, 2, 2>(x + m * K, K, wb, scale, bias, y + m * N, N, valid);
  }
  for (; m + 2 <= M; m += 2) tile<2, 4, 0>(x + m * K, K, wb, scale, bias, y + m * N, N, valid);
  for (; m < M; ++m) tile<1, 4, 0>(x + m * K, K, wb, scale, bias, y + m * N, N, valid);
}

at::Tensor int8_pack(const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2, "int8_pack: expected an int8 [N, K] weight");
  TORCH_CHECK(w.size(1) % KS == 0, "int8_pack: inputs (", w.size(1), ") must be a multiple of ", KS);
  const int64_t N = w.size(0), K = w.size(1), NP = (N + R - 1) / R * R;
  auto padded = at::zeros({NP, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  // [NP / R, R, K / KS, KS] -> [NP / R, K / KS, R, KS]
  return padded.view({NP / R, R, K / KS, KS}).permute({0, 2, 1, 3}).contiguous().view({NP / R, R * K});
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(cpu_supported(), "int8_linear: this CPU lacks AVX2/FMA");
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "int8_linear: x must be float32 on the CPU");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 2 && packed.is_contiguous(),
              "int8_linear: packed must come from int8_pack");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.is_contiguous(),
              "int8_linear: scale must be a contiguous float32 vector");
  const int64_t K = x.size(-1), N = scale.size(0);
  TORCH_CHECK(packed.size(1) == R * K && packed.size(0) == (N + R - 1) / R,
              "int8_linear: packed weight does not match x's inputs and scale's outputs");
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value()) {
    bias_c = bias->contiguous();
    TORCH_CHECK(bias_c.scalar_type() == at::kFloat && bias_c.numel() == N, "int8_linear: bad bias");
    b = bias_c.data_ptr<float>();
  }
  const auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  auto y = at::empty({M, N}, x.options());
  const float* xp = x2.data_ptr<float>();
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // A grain of 8 blocks (32 outputs x K inputs, >= 32 KB) keeps small matrices on one thread.
  at::parallel_for(0, packed.size(0), 8, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) block(xp, M, K, wp + i * R * K, sp, b, yp, N, i * R);
  });
  return y.view(sizes);
}

bool int8_supported() { return cpu_supported(); }

}  // namespace

TORCH_LIBRARY(voxcast, m) {
  m.def("int8_supported() -> bool", &int8_supported);
  m.def("int8_pack(Tensor w) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxcast, CPU, m) {
  m.impl("int8_pack", int8_pack);
  m.impl("int8_linear", int8_linear);
}
