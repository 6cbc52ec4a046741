// Weight-only int8 Linear for a few rows (a decode step): y = x W^T * scale + bias, in two variants.
//
// AVX2 + FMA (int8_pack / int8_linear): x stays float32; each int8 weight is widened to float32 in
// registers and multiplied in float32, so the only rounding beyond float32 is the weight's own
// (per-output-channel int8). A row's outputs do not depend on the other rows: each dot product runs
// in the same order whatever the row count.
//
// Weights are stored in blocks of R outputs, interleaved in steps of KS inputs
// ([N / R][K / KS][R][KS], int8_pack): one block is one sequential stream of R * K bytes, which the
// hardware prefetcher follows across pages (row-major rows read side by side did not: measured 10.8
// against 19.5 GB/s from DRAM on an AMD Zen 3, 2 threads). Blocks are spread over the intra-op threads.
//
// AVX-512 VNNI (int8_vnni_pack / int8_vnni_linear): widening every weight to float32 costs two
// instructions per 8 weights besides the FMA, which caps one core below its memory bandwidth (AMD
// Zen 4: 22 against 31 GB/s). Here each row of x is rounded once per call to 16-bit fixed point
// (x ~= s * q, s = max|x| / 32767), q + 32768 is split into a high and a low byte, and VPDPBUSD
// multiplies both byte planes with the int8 weights in exact int32 arithmetic: two instructions per
// 64 weights. y = s * scale * (256 * sum(w * hi) + sum(w * lo) - 32768 * sum(w)) + bias, combined in
// 64-bit integers and double. The only roundings are the weight's and that of x to 16 bits of its
// row's largest magnitude (fbgemm's dynamic quantization rounds x to 8 bits); rows stay independent.
// Layout: blocks of V = 64 outputs, [N / V][K / 4][V][4] int8, each block followed by its V column
// sums as int32 (the `- 32768 * sum(w)` term).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "linear_rows.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

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

// An int8 [N, K] weight, zero-padded to whole blocks of `outputs` rows, as [N / outputs, K / step,
// outputs, step] (one row per block); the rows it padded in stay in `padded`. Checks name the op.
at::Tensor blocked(const char* name, const at::Tensor& w, int64_t outputs, int64_t step, at::Tensor& padded) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2, name, ": expected an int8 [N, K] weight");
  TORCH_CHECK(w.size(1) % step == 0, name, ": inputs (", w.size(1), ") must be a multiple of ", step);
  const int64_t N = w.size(0), K = w.size(1), NP = (N + outputs - 1) / outputs * outputs;
  padded = at::zeros({NP, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  // [NP / o, o, K / s, s] -> [NP / o, K / s, o, s]
  return padded.view({NP / outputs, outputs, K / step, step})
      .permute({0, 2, 1, 3})
      .contiguous()
      .view({NP / outputs, outputs * K});
}

at::Tensor int8_pack(const at::Tensor& w) {
  at::Tensor padded;
  return blocked("int8_pack", w, R, KS, padded);
}

// A call's checked arguments: those of every Linear (linear_rows.h), and a packed weight and scale
// that match them.
struct Call : voxcast::LinearRows {
  // name: the op (for messages); block_outputs / block_bytes: the layout's outputs per block and
  // bytes per block for K inputs; inputs_step: K must be a multiple of it.
  Call(const char* name, const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
       const std::optional<at::Tensor>& b, int64_t block_outputs, int64_t (*block_bytes)(int64_t),
       int64_t inputs_step)
      : LinearRows(name, x, checked_scale(name, scale).size(0), b) {
    TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 2 && packed.is_contiguous(), name,
                ": packed must come from the same variant's pack");
    TORCH_CHECK(K % inputs_step == 0 && packed.size(1) == block_bytes(K) &&
                    packed.size(0) == (N + block_outputs - 1) / block_outputs,
                name, ": packed weight does not match x's inputs and scale's outputs");
  }

  static const at::Tensor& checked_scale(const char* name, const at::Tensor& scale) {
    TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.is_contiguous(), name,
                ": scale must be a contiguous float32 vector");
    return scale;
  }
};

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(cpu_supported(), "int8_linear: this CPU lacks AVX2/FMA");
  Call c("int8_linear", x, packed, scale, bias, R, [](int64_t K) { return R * K; }, KS);
  const int64_t M = c.M, K = c.K, N = c.N;
  const float* b = c.bias;
  const float* xp = c.x2.data_ptr<float>();
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = c.y.data_ptr<float>();
  // A grain of 8 blocks (32 outputs x K inputs, >= 32 KB) keeps small matrices on one thread.
  at::parallel_for(0, packed.size(0), 8, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) block(xp, M, K, wp + i * R * K, sp, b, yp, N, i * R);
  });
  return c.out();
}


// ---- AVX-512 VNNI variant ----

constexpr int64_t V = 64;  // outputs per block: four 512-bit vectors of int32 sums
constexpr int64_t VK = 4;  // inputs per VPDPBUSD lane
// |w * byte| <= 128 * 255, so K <= 65536 keeps every int32 sum of products exact.
constexpr int64_t VNNI_MAX_K = 65536;

bool vnni_supported() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return ok;
}

// One row of x to 16-bit fixed point: q = round(x / s), s = max|x| / 32767; q + 32768 as a high and a
// low byte plane. Returns s (0 for a zero row: every q is 0; NaN where x is not finite).
__attribute__((target("avx512f,avx512bw,avx512vl"))) double round_row(const float* x, int64_t K, uint8_t* hi,
                                                                        uint8_t* lo) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    bad |= _mm512_mask_cmp_ps_mask(m, _mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_NEQ_UQ);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  }
  const float top = _mm512_reduce_max_ps(amax);
  const bool finite = bad == 0;
  const __m512 inv = _mm512_set1_ps(finite && top > 0.0f ? 32767.0f / top : 0.0f);
  const __m512i offset = _mm512_set1_epi32(32768), byte = _mm512_set1_epi32(255);
  const __m512i lowest = _mm512_set1_epi32(-32767), highest = _mm512_set1_epi32(32767);
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), inv));  // nearest even
    q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lowest), highest), offset);
    _mm_mask_storeu_epi8(hi + k, m, _mm512_cvtepi32_epi8(_mm512_srli_epi32(q, 8)));
    _mm_mask_storeu_epi8(lo + k, m, _mm512_cvtepi32_epi8(_mm512_and_si512(q, byte)));
  }
  if (!finite) return std::numeric_limits<double>::quiet_NaN();
  return top > 0.0f ? static_cast<double>(top) / 32767.0 : 0.0;
}

// Rows [0, MB) against the vectors Z0 .. Z0 + NZ (16 outputs each) of one block.
template <int MB, int NZ, int Z0>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void vnni_tile(
    const uint8_t* hi, const uint8_t* lo, int64_t K, const int8_t* wb, const int32_t* colsum, const double* step,
    const float* scale, const float* bias, float* y, int64_t ldy, int64_t valid) {
  __m512i ah[MB][NZ], al[MB][NZ];
  #pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
    #pragma GCC unroll 8
    for (int z = 0; z < NZ; ++z) ah[i][z] = al[i][z] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += VK) {
    const int8_t* p = wb + k * V + Z0 * 64;
    // The first pass over a block prefetches all of it (four lines a step), a later pass finds it cached.
    if constexpr (Z0 == 0) {
      #pragma GCC unroll 4
      for (int c = 0; c < 4; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(p + c * 64 + PREFETCH_BYTES), _MM_HINT_T0);
    }
    __m512i w[NZ];
    #pragma GCC unroll 8
    for (int z = 0; z < NZ; ++z) w[z] = _mm512_loadu_si512(p + z * 64);
    #pragma GCC unroll 8
    for (int i = 0; i < MB; ++i) {
      int32_t h4, l4;
      std::memcpy(&h4, hi + i * K + k, 4);
      std::memcpy(&l4, lo + i * K + k, 4);
      const __m512i xh = _mm512_set1_epi32(h4), xl = _mm512_set1_epi32(l4);
      #pragma GCC unroll 8
      for (int z = 0; z < NZ; ++z) {
        ah[i][z] = _mm512_dpbusd_epi32(ah[i][z], xh, w[z]);
        al[i][z] = _mm512_dpbusd_epi32(al[i][z], xl, w[z]);
      }
    }
  }
  alignas(64) int32_t sh[16], sl[16];
  #pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
    #pragma GCC unroll 8
    for (int z = 0; z < NZ; ++z) {
      _mm512_store_si512(sh, ah[i][z]);
      _mm512_store_si512(sl, al[i][z]);
      for (int l = 0; l < 16; ++l) {
        const int64_t j = (Z0 + z) * 16 + l;
        if (j >= valid) continue;
        const int64_t dot = 256 * int64_t(sh[l]) + int64_t(sl[l]) - 32768 * int64_t(colsum[j]);
        float v = static_cast<float>(static_cast<double>(dot) * (step[i] * static_cast<double>(scale[j])));
        if (bias != nullptr) v += bias[j];
        y[i * ldy + j] = v;
      }
    }
}

// Every row against one block of outputs n0 .. n0 + V: four rows at a time (two passes over the
// block, the second from the cache), then two, then one.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_block(const uint8_t* hi, const uint8_t* lo, int64_t M, int64_t K, const int8_t* wb, const double* step,
                const float* scale, const float* bias, float* y, int64_t N, int64_t n0) {
  const int64_t valid = std::min<int64_t>(V, N - n0);
  const auto* colsum = reinterpret_cast<const int32_t*>(wb + V * K);
  scale += n0;
  if (bias != nullptr) bias += n0;
  y += n0;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    vnni_tile<4, 2, 0>(hi + m * K, lo + m * K, K, wb, colsum, step + m, scale, bias, y + m * N, N, valid);
    vnni_tile<4, 2, 2>(hi + m * K, lo + m * K, K, wb, colsum, step + m, scale, bias, y + m * N, N, valid);
  }
  for (; m + 2 <= M; m += 2)
    vnni_tile<2, 4, 0>(hi + m * K, lo + m * K, K, wb, colsum, step + m, scale, bias, y + m * N, N, valid);
  for (; m < M; ++m)
    vnni_tile<1, 4, 0>(hi + m * K, lo + m * K, K, wb, colsum, step + m, scale, bias, y + m * N, N, valid);
}

at::Tensor int8_vnni_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() != 2 || w.size(1) <= VNNI_MAX_K, "int8_vnni_pack: at most ", VNNI_MAX_K, " inputs, not ",
              w.size(1));
  at::Tensor padded;
  auto weights = blocked("int8_vnni_pack", w, V, VK, padded);
  // then each block's column sums, as int32 bytes
  auto sums = padded.sum(1, /*keepdim=*/false, at::kInt).view({-1, V}).contiguous().view(at::kChar);
  return at::cat(std::vector<at::Tensor>{weights, sums}, 1).contiguous();
}

at::Tensor int8_vnni_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                            const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(vnni_supported(), "int8_vnni_linear: this CPU lacks AVX-512 VNNI");
  Call c("int8_vnni_linear", x, packed, scale, bias, V, [](int64_t K) { return V * K + V * 4; }, VK);
  const int64_t M = c.M, K = c.K, N = c.N;
  const float* b = c.bias;
  std::vector<uint8_t> planes(static_cast<size_t>(2 * M * K));
  std::vector<double> step(static_cast<size_t>(M));
  const float* xp = c.x2.data_ptr<float>();
  uint8_t* hi = planes.data();
  uint8_t* lo = hi + M * K;
  for (int64_t i = 0; i < M; ++i) step[i] = round_row(xp + i * K, K, hi + i * K, lo + i * K);
  const int8_t* wp = packed.data_ptr<int8_t>();
  const int64_t stride = packed.size(1);
  const float* sp = scale.data_ptr<float>();
  float* yp = c.y.data_ptr<float>();
  at::parallel_for(0, packed.size(0), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) vnni_block(hi, lo, M, K, wp + i * stride, step.data(), sp, b, yp, N, i * V);
  });
  return c.out();
}

bool int8_supported() { return cpu_supported(); }
bool int8_vnni_supported() { return vnni_supported(); }

}  // namespace

TORCH_LIBRARY(voxcast, m) {
  m.def("int8_supported() -> bool", &int8_supported);
  m.def("int8_pack(Tensor w) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias) -> Tensor");
  m.def("int8_vnni_supported() -> bool", &int8_vnni_supported);
  m.def("int8_vnni_pack(Tensor w) -> Tensor");
  m.def("int8_vnni_linear(Tensor x, Tensor packed, Tensor scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxcast, CPU, m) {
  m.impl("int8_pack", int8_pack);
  m.impl("int8_linear", int8_linear);
  m.impl("int8_vnni_pack", int8_vnni_pack);
  m.impl("int8_vnni_linear", int8_vnni_linear);
}
