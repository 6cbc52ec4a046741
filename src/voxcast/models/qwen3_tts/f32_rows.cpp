// One row of a float32 Linear (a decode step), bitwise the result of the BLAS PyTorch calls for it on
// CPUs where that BLAS takes its 4-lane path, and at memory speed. Built into the int8 kernel's
// library (int8_kernel.py); f32_rows.py checks at load that this CPU's BLAS gives the same bits.
//
// The order reproduced (measured on an AMD Zen 5 with PyTorch 2.13's MKL 2024.2: sgemm of one
// column, weight rows 16-byte aligned): for each output, s = ((w0 x0 + w1 x1) + w2 x2) + w3 x3 in
// scalar arithmetic; four lane sums start as [s, 0, 0, 0] and lane l adds w[k] x[k] for every later
// k = l mod 4, in order; the result is (lane0 + lane2) + (lane1 + lane3). Each product and each sum
// is rounded on its own (no FMA; CFLAGS has -ffp-contract=off), and a bias is added last. A weight
// that is not 16-byte aligned makes that BLAS start differently, so such calls go to at::linear.
//
// The BLAS runs one dependent chain of 4-wide adds per output on one thread (~22 GB/s a core here,
// where the memory delivers ~38). These kernels run several outputs' chains side by side on every
// intra-op thread:
// - f32_rows_linear(x, w, bias): the row-major weight, 8 rows at a time (8 read streams a thread).
// - f32_rows_pack(w) -> [N / 8, K / 4, 8, 4]: 8 outputs' lanes interleaved, so that a block is one
//   sequential stream (row-major rows read side by side stay below a plain read's speed, the packed
//   layout reaches it); f32_rows_packed_linear(x, packed, bias) computes from it, the same bits.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t RB = 8;          // outputs per block
constexpr int64_t LANES = 4;       // the BLAS's lanes
constexpr int64_t PREFETCH = 256;  // floats ahead on each row (row-major kernel)
constexpr int64_t MIN_BYTES = 32768;  // weight bytes a thread takes at least

inline float head(const float* w, const float* x) {
  float s = w[0] * x[0];
  s = s + w[1] * x[1];
  s = s + w[2] * x[2];
  return s + w[3] * x[3];
}

inline float combine(__m128 a) {
  alignas(16) float v[4];
  _mm_store_ps(v, a);
  return (v[0] + v[2]) + (v[1] + v[3]);
}

// Outputs [0, R) of row-major rows w (stride K).
template <int R>
inline void rows_block(const float* x, const float* w, int64_t K, const float* bias, float* y) {
  __m128 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm_set_ss(head(w + i * K, x));
  for (int64_t k = LANES; k < K; k += LANES) {
    if ((k & 15) == 0)
      for (int i = 0; i < R; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(w + i * K + k + PREFETCH), _MM_HINT_T0);
    const __m128 xv = _mm_loadu_ps(x + k);
    for (int i = 0; i < R; ++i) acc[i] = _mm_add_ps(acc[i], _mm_mul_ps(_mm_load_ps(w + i * K + k), xv));
  }
  for (int i = 0; i < R; ++i) y[i] = bias == nullptr ? combine(acc[i]) : combine(acc[i]) + bias[i];
}

// One packed block of RB outputs, SSE.
inline void packed_block(const float* x, const float* p, int64_t K, const float* bias, float* y) {
  __m128 acc[RB];
  for (int i = 0; i < RB; ++i) {
    const float w[4] = {p[i * LANES], p[i * LANES + 1], p[i * LANES + 2], p[i * LANES + 3]};
    acc[i] = _mm_set_ss(head(w, x));
  }
  for (int64_t k = LANES; k < K; k += LANES) {
    const float* q = p + k * RB;
    const __m128 xv = _mm_loadu_ps(x + k);
    for (int i = 0; i < RB; ++i) acc[i] = _mm_add_ps(acc[i], _mm_mul_ps(_mm_load_ps(q + i * LANES), xv));
  }
  for (int i = 0; i < RB; ++i) y[i] = bias == nullptr ? combine(acc[i]) : combine(acc[i]) + bias[i];
}

// The same block with AVX-512: one vector holds four outputs' lanes, the same per-lane operations.
__attribute__((target("avx512f"))) void packed_block_avx512(const float* x, const float* p, int64_t K,
                                                            const float* bias, float* y) {
  float heads[RB];
  for (int i = 0; i < RB; ++i) {
    const float w[4] = {p[i * LANES], p[i * LANES + 1], p[i * LANES + 2], p[i * LANES + 3]};
    heads[i] = head(w, x);
  }
  // element 4 i + l is output i's lane l (output 4 + i in a1)
  __m512 a0 = _mm512_set_ps(0, 0, 0, heads[3], 0, 0, 0, heads[2], 0, 0, 0, heads[1], 0, 0, 0, heads[0]);
  __m512 a1 = _mm512_set_ps(0, 0, 0, heads[7], 0, 0, 0, heads[6], 0, 0, 0, heads[5], 0, 0, 0, heads[4]);
  for (int64_t k = LANES; k < K; k += LANES) {
    const float* q = p + k * RB;
    const __m512 xv = _mm512_broadcast_f32x4(_mm_loadu_ps(x + k));
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_load_ps(q), xv));
    a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_load_ps(q + 16), xv));
  }
  alignas(64) float v[2 * 16];
  _mm512_store_ps(v, a0);
  _mm512_store_ps(v + 16, a1);
  for (int i = 0; i < RB; ++i) {
    const float* l = v + i * LANES;
    const float r = (l[0] + l[2]) + (l[1] + l[3]);
    y[i] = bias == nullptr ? r : r + bias[i];
  }
}

bool avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

bool aligned(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

// The checked arguments of a call: x one row of K float32, bias N float32 or none.
struct Row {
  at::Tensor x1, bias_c, y;
  const float* bias = nullptr;
  std::vector<int64_t> sizes;

  Row(const char* name, const at::Tensor& x, int64_t K, int64_t N, const std::optional<at::Tensor>& b) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, name, ": x must be float32 on the CPU");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K && x.numel() == K, name, ": x must be one row of ", K,
                " inputs, got shape ", x.sizes());
    if (b.has_value()) {
      bias_c = b->contiguous();
      TORCH_CHECK(bias_c.scalar_type() == at::kFloat && bias_c.numel() == N, name, ": bias must be ", N,
                  " float32 values");
      bias = bias_c.data_ptr<float>();
    }
    x1 = x.contiguous();
    sizes = x.sizes().vec();
    sizes.back() = N;
    y = at::empty({N}, x.options());
  }
};

int64_t grain(int64_t K) { return std::max<int64_t>(1, MIN_BYTES / (RB * K * 4)); }

at::Tensor f32_rows_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2, "f32_rows_linear: w must be "
              "a float32 [N, K] matrix on the CPU");
  const int64_t N = w.size(0), K = w.size(1);
  if (!w.is_contiguous() || K % LANES != 0 || K < LANES || !aligned(w.data_ptr()))
    return at::linear(x, w, bias);  // the BLAS takes another order there
  Row r("f32_rows_linear", x, K, N, bias);
  const float* xp = r.x1.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = r.bias;
  float* yp = r.y.data_ptr<float>();
  at::parallel_for(0, N / RB, grain(K), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i)
      rows_block<RB>(xp, wp + i * RB * K, K, bp == nullptr ? nullptr : bp + i * RB, yp + i * RB);
  });
  for (int64_t n = N / RB * RB; n < N; ++n)
    rows_block<1>(xp, wp + n * K, K, bp == nullptr ? nullptr : bp + n, yp + n);
  return r.y.view(r.sizes);
}

at::Tensor f32_rows_pack(const at::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous(),
              "f32_rows_pack: w must be a contiguous float32 [N, K] matrix on the CPU");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % RB == 0 && K % LANES == 0 && K >= LANES, "f32_rows_pack: N must be a multiple of ", RB,
              " and K of ", LANES, ", got ", N, " x ", K);
  TORCH_CHECK(aligned(w.data_ptr()), "f32_rows_pack: w must be 16-byte aligned (the BLAS's order depends on it)");
  return w.view({N / RB, RB, K / LANES, LANES}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor f32_rows_packed_linear(const at::Tensor& x, const at::Tensor& packed,
                                  const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 4 && packed.size(2) == RB &&
                  packed.size(3) == LANES && packed.is_contiguous(),
              "f32_rows_packed_linear: packed must come from f32_rows_pack");
  TORCH_CHECK(reinterpret_cast<std::uintptr_t>(packed.data_ptr()) % 64 == 0,
              "f32_rows_packed_linear: packed must be 64-byte aligned");
  const int64_t N = packed.size(0) * RB, K = packed.size(1) * LANES;
  Row r("f32_rows_packed_linear", x, K, N, bias);
  const float* xp = r.x1.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  const float* bp = r.bias;
  float* yp = r.y.data_ptr<float>();
  const bool wide = avx512();
  at::parallel_for(0, packed.size(0), grain(K), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      const float* bi = bp == nullptr ? nullptr : bp + i * RB;
      if (wide)
        packed_block_avx512(xp, wp + i * RB * K, K, bi, yp + i * RB);
      else
        packed_block(xp, wp + i * RB * K, K, bi, yp + i * RB);
    }
  });
  return r.y.view(r.sizes);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(voxcast, m) {
  m.def("f32_rows_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("f32_rows_pack(Tensor w) -> Tensor");
  m.def("f32_rows_packed_linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxcast, CPU, m) {
  m.impl("f32_rows_linear", f32_rows_linear);
  m.impl("f32_rows_pack", f32_rows_pack);
  m.impl("f32_rows_packed_linear", f32_rows_packed_linear);
}
