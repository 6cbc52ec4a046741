// Element-wise steps of the codec encoder's convolution stack (seanet_gemm.py), built into the int8
// kernel's library (int8_kernel.py).
//
// voxcast::elu_into(x, out): out = x > 0 ? x : expm1(x) (ELU with alpha 1), float32, contiguous, out
// may be x. PyTorch's ELU runs at ~14 cycles an element on AMD Zen 3 (SLEEF's expm1); the encoder of
// a 3 s reference applies it to ~15 M values. Here expm1 is the usual reduction x = n ln2 + r,
// |r| <= ln2 / 2, expm1(x) = 2^n expm1(r) + (2^n - 1), with expm1(r) a degree-7 Taylor polynomial
// (truncation below 2e-8 relative); within 2 ulp of std::expm1 (test), not bitwise PyTorch's.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>

namespace {

constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 12 bits
constexpr float kLn2Lo = 1.428606765330187e-06f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kFloor = -88.0f;  // expm1 is -1 in float below ~-17; keeps 2^n a normal number

inline float elu_one(float x) { return x >= 0.0f ? x : std::expm1(x); }

__attribute__((target("avx2,fma"))) inline __m256 elu8(__m256 x) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  // min/max return their second operand for a NaN, so a NaN stays one
  const __m256 neg = _mm256_max_ps(_mm256_set1_ps(kFloor), _mm256_min_ps(zero, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(neg, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), neg);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  // expm1(r) = r + r^2 (1/2 + r (1/6 + r (1/24 + r (1/120 + r (1/720 + r / 5040)))))
  __m256 p = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 5040), _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  const __m256 q = _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r);
  // 2^n from the exponent bits; n is in [-127, 0]
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 scale = _mm256_castsi256_ps(bits);
  const __m256 em1 = _mm256_fmadd_ps(scale, q, _mm256_sub_ps(scale, one));
  return _mm256_blendv_ps(em1, x, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
}

__attribute__((target("avx2,fma"))) void elu_range(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, elu8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = elu_one(x[i]);
}

void elu_into(const at::Tensor& x, const at::Tensor& out) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "elu_into: x must be a contiguous float32 CPU tensor");
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() &&
                  out.numel() == x.numel(),
              "elu_into: out must be a contiguous float32 CPU tensor of x's size");
  const float* xp = x.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, x.numel(), 1 << 15, [&](int64_t a, int64_t b) { elu_range(xp + a, yp + a, b - a); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(voxcast, m) { m.def("elu_into(Tensor x, Tensor(a!) out) -> ()"); }

TORCH_LIBRARY_IMPL(voxcast, CPU, m) { m.impl("elu_into", elu_into); }
