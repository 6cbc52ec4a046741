// One row of a float32 Linear (a decode step), bitwise the result of the BLAS PyTorch calls for it on
// CPUs where that BLAS takes its 4-lane path, and at memory speed. Built into the int8 kernel's
// library (int8_kernel.py); f32_rows.py checks at load that this CPU's BLAS gives the same bits.
//
// The order reproduced (measured on an AMD Zen 5 with PyTorch 2.13's MKL 2024.2, sgemm of one
// column; K a multiple of 4): for each output, the first P products are summed in order in scalar
// arithmetic, P = 4 where the weight row starts 16-byte aligned, else the inputs before its first
// aligned weight (1-3); four lane sums start as [s, 0, 0, 0] and lane l adds the products of the
// following 4-input vectors' element l, in order; the result is (lane0 + lane2) + (lane1 + lane3),
// plus the last (4 - P) % 4 products in order, plus the bias. Each product and each sum is rounded
// on its own (no FMA; CFLAGS has -ffp-contract=off). Other K or strides go to at::linear.
// Its product of two columns (a prefill of two positions) sums each output alike but without the
// scalar start: for rows that start 16-byte aligned the first four products start the lanes (order 2;
// the order of other rows there was not probed, and such calls go to at::linear).
//
// The BLAS runs one dependent chain of 4-wide adds per output on one thread (~22 GB/s a core here,
// where the memory delivers ~38). These kernels run several outputs' chains side by side on every
// intra-op thread. x may hold up to 8 rows (a batched step's streams): each weight vector is loaded
// once for all of them, and each row's outputs are the bits that row alone would get.
// - f32_rows_linear(x, w, bias): the row-major weight, 8 outputs at a time (8 read streams a thread).
// - f32_rows_pack(w) -> [N / 8, chunks, 8, 4]: 8 outputs' lanes interleaved, so that a block is one
//   sequential stream (row-major rows read side by side stay below a plain read's speed, the packed
//   layout reaches it); f32_rows_packed_linear(x, packed, bias, peel) computes from it the same
//   bits, given the P of the weight it was packed from (f32_rows_peel(w)).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "linear_rows.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t RB = 8;             // outputs per block
constexpr int64_t LANES = 4;          // the BLAS's lanes
constexpr int64_t PREFETCH = 256;     // floats ahead on each row (row-major kernel)
constexpr int64_t MIN_BYTES = 32768;  // weight bytes a thread takes at least
constexpr int64_t MAX_ROWS = 8;       // rows of x a call takes (a batched decode step's streams)

// Inputs the BLAS sums in scalar before its lanes: up to its first 16-byte aligned weight, or the
// whole first aligned vector where the row starts aligned (1..4; rows of K % 4 == 0 inputs all alike).
int64_t peel_of(const void* w) { return LANES - static_cast<int64_t>((reinterpret_cast<std::uintptr_t>(w) >> 2) & 3); }

inline float dot_seq(const float* w, const float* x, int64_t n) {
  float s = w[0] * x[0];
  for (int64_t j = 1; j < n; ++j) s = s + w[j] * x[j];
  return s;
}

// The BLAS's combination of the four lane sums.
inline float combine(const float* l) { return (l[0] + l[2]) + (l[1] + l[3]); }

inline float combine(__m128 a) {
  alignas(16) float v[4];
  _mm_store_ps(v, a);
  return combine(v);
}

// An output from its combined lanes: plus the T tail products in order (weights wt, inputs xt),
// plus the bias (b: this output's, or null).
inline float finish(float r, const float* wt, const float* xt, int64_t T, const float* b) {
  for (int64_t t = 0; t < T; ++t) r = r + wt[t] * xt[t];
  return b == nullptr ? r : r + *b;
}

// The shape of one row's sum: P scalar inputs, C vectors of 4, then T scalar inputs added last.
// `lanes_head`: the BLAS's two-column order instead, where the first four products start the lanes
// (no scalar sum; known for rows that start 16-byte aligned, P = 4, only).
struct Split {
  int64_t P, C, T;
  bool lanes_head;
  Split(int64_t K, int64_t peel, bool two_columns = false)
      : P(peel), C((K - peel) / LANES), T((K - peel) % LANES), lanes_head(two_columns) {}
};

// The lanes before the vectors: [s, 0, 0, 0], s the scalar sum of the first P products, or with
// `lanes_head` 0 + each of the first four products in its lane.
inline __m128 head_lanes(const float* w, const float* x, const Split& sp) {
  if (sp.lanes_head) return _mm_add_ps(_mm_setzero_ps(), _mm_mul_ps(_mm_loadu_ps(w), _mm_loadu_ps(x)));
  return _mm_set_ss(dot_seq(w, x, sp.P));
}

// Outputs [0, R) of row-major rows w (stride K) for the M rows of x (stride K), y rows of stride N.
template <int R, int M>
inline void rows_block(const float* x, const float* w, int64_t K, int64_t N, Split sp, const float* bias,
                       float* y) {
  __m128 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < R; ++i) acc[m][i] = head_lanes(w + i * K, x + m * K, sp);
  const int64_t end = sp.P + sp.C * LANES;
  for (int64_t k = sp.P; k < end; k += LANES) {
    if (((k - sp.P) & 15) == 0)
      for (int i = 0; i < R; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(w + i * K + k + PREFETCH), _MM_HINT_T0);
    __m128 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = _mm_load_ps(w + i * K + k);
    for (int m = 0; m < M; ++m) {
      const __m128 xv = _mm_loadu_ps(x + m * K + k);
      for (int i = 0; i < R; ++i) acc[m][i] = _mm_add_ps(acc[m][i], _mm_mul_ps(wv[i], xv));
    }
  }
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < R; ++i)
      y[m * N + i] = finish(combine(acc[m][i]), w + i * K + end, x + m * K + end, K - end,
                            bias == nullptr ? nullptr : bias + i);
}

// Packed block: chunk 0 holds each output's P head weights, chunks 1..C its vectors, chunk C + 1
// its T tail weights ([C + 2][RB][LANES], unused slots zero).
inline void packed_ends(const float* x, const float* p, int64_t K, Split sp, const float* lanes,
                        const float* bias, float* y) {
  const float* tail = p + (sp.C + 1) * RB * LANES;
  for (int i = 0; i < RB; ++i)
    y[i] = finish(combine(lanes + i * LANES), tail + i * LANES, x + K - sp.T, sp.T, bias == nullptr ? nullptr : bias + i);
}

// One packed block for one row of x, SSE.
inline void packed_block(const float* x, const float* p, int64_t K, Split sp, const float* bias, float* y) {
  __m128 acc[RB];
  for (int i = 0; i < RB; ++i) acc[i] = head_lanes(p + i * LANES, x, sp);
  for (int64_t c = 0; c < sp.C; ++c) {
    const float* q = p + (c + 1) * RB * LANES;
    const __m128 xv = _mm_loadu_ps(x + sp.P + c * LANES);
    for (int i = 0; i < RB; ++i) acc[i] = _mm_add_ps(acc[i], _mm_mul_ps(_mm_load_ps(q + i * LANES), xv));
  }
  alignas(16) float lanes[RB * LANES];
  for (int i = 0; i < RB; ++i) _mm_store_ps(lanes + i * LANES, acc[i]);
  packed_ends(x, p, K, sp, lanes, bias, y);
}

// The same block for M rows of x with AVX-512: one vector holds four outputs' lanes (the same
// per-lane operations), each weight vector is loaded once for all rows.
template <int M>
__attribute__((target("avx512f"))) void packed_block_avx512(const float* x, const float* p, int64_t K, int64_t N,
                                                            Split sp, const float* bias, float* y) {
  __m512 a[M][2];
  for (int m = 0; m < M; ++m) {
    // element 4 i + l: lane l of output i (of output 4 + i in a[m][1])
    for (int h = 0; h < 2; ++h) {
      const float* ph = p + 4 * h * LANES;
      __m512 v = _mm512_castps128_ps512(head_lanes(ph, x + m * K, sp));
      v = _mm512_insertf32x4(v, head_lanes(ph + LANES, x + m * K, sp), 1);
      v = _mm512_insertf32x4(v, head_lanes(ph + 2 * LANES, x + m * K, sp), 2);
      a[m][h] = _mm512_insertf32x4(v, head_lanes(ph + 3 * LANES, x + m * K, sp), 3);
    }
  }
  for (int64_t c = 0; c < sp.C; ++c) {
    const float* q = p + (c + 1) * RB * LANES;
    const __m512 w0 = _mm512_load_ps(q), w1 = _mm512_load_ps(q + 16);
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_broadcast_f32x4(_mm_loadu_ps(x + m * K + sp.P + c * LANES));
      a[m][0] = _mm512_add_ps(a[m][0], _mm512_mul_ps(w0, xv));
      a[m][1] = _mm512_add_ps(a[m][1], _mm512_mul_ps(w1, xv));
    }
  }
  for (int m = 0; m < M; ++m) {
    alignas(64) float lanes[RB * LANES];
    _mm512_store_ps(lanes, a[m][0]);
    _mm512_store_ps(lanes + 16, a[m][1]);
    packed_ends(x + m * K, p, K, sp, lanes, bias, y + m * N);
  }
}

bool avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// The checked arguments of a call (linear_rows.h), x holding 1..MAX_ROWS rows.
struct Rows : voxcast::LinearRows {
  Rows(const char* name, const at::Tensor& x, int64_t K_, int64_t N_, const std::optional<at::Tensor>& b)
      : LinearRows(name, x, N_, b) {
    TORCH_CHECK(K == K_ && M >= 1 && M <= MAX_ROWS, name, ": x must be 1 to ", MAX_ROWS, " rows of ", K_,
                " inputs, got shape ", x.sizes());
  }
};

// Blocks of `outputs` outputs a thread takes at least.
int64_t grain(int64_t K, int64_t outputs) { return std::max<int64_t>(1, MIN_BYTES / (outputs * K * 4)); }

// Row-major: outputs in blocks of R = 8 / M (M * R accumulators), each weight vector loaded once.
template <int M>
void rows_call(const float* x, const float* w, int64_t N, int64_t K, Split sp, const float* bias, float* y) {
  constexpr int R = M >= 8 ? 1 : 8 / M;
  at::parallel_for(0, N / R, grain(K, R), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i)
      rows_block<R, M>(x, w + i * R * K, K, N, sp, bias == nullptr ? nullptr : bias + i * R, y + i * R);
  });
  for (int64_t n = N / R * R; n < N; ++n)
    rows_block<1, M>(x, w + n * K, K, N, sp, bias == nullptr ? nullptr : bias + n, y + n);
}

at::Tensor f32_rows_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                           int64_t order) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2,
              "f32_rows_linear: w must be a float32 [N, K] matrix on the CPU");
  TORCH_CHECK(order == 1 || order == 2, "f32_rows_linear: order must be 1 or 2 (columns), got ", order);
  const int64_t N = w.size(0), K = w.size(1);
  if (!w.is_contiguous() || K % LANES != 0 || K < 2 * LANES || reinterpret_cast<std::uintptr_t>(w.data_ptr()) % 4 ||
      (order == 2 && peel_of(w.data_ptr()) != LANES))
    return at::linear(x, w, bias);  // the BLAS takes other paths there
  Rows r("f32_rows_linear", x, K, N, bias);
  const Split sp(K, peel_of(w.data_ptr()), order == 2);
  const float* xp = r.x2.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = r.y.data_ptr<float>();
  switch (r.M) {
    case 1: rows_call<1>(xp, wp, N, K, sp, r.bias, yp); break;
    case 2: rows_call<2>(xp, wp, N, K, sp, r.bias, yp); break;
    case 3: rows_call<3>(xp, wp, N, K, sp, r.bias, yp); break;
    case 4: rows_call<4>(xp, wp, N, K, sp, r.bias, yp); break;
    case 5: rows_call<5>(xp, wp, N, K, sp, r.bias, yp); break;
    case 6: rows_call<6>(xp, wp, N, K, sp, r.bias, yp); break;
    case 7: rows_call<7>(xp, wp, N, K, sp, r.bias, yp); break;
    default: rows_call<8>(xp, wp, N, K, sp, r.bias, yp); break;
  }
  return r.out();
}

at::Tensor f32_rows_pack(const at::Tensor& w) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous(),
              "f32_rows_pack: w must be a contiguous float32 [N, K] matrix on the CPU");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % RB == 0 && K % LANES == 0 && K >= 2 * LANES, "f32_rows_pack: N must be a multiple of ", RB,
              " and K of ", LANES, " (at least ", 2 * LANES, "), got ", N, " x ", K);
  const Split sp(K, peel_of(w.data_ptr()));
  auto out = at::zeros({N / RB, sp.C + 2, RB, LANES}, w.options());
  const auto rows = w.view({N / RB, RB, K});
  out.select(1, 0).narrow(2, 0, sp.P).copy_(rows.narrow(2, 0, sp.P));
  out.narrow(1, 1, sp.C).copy_(rows.narrow(2, sp.P, sp.C * LANES).view({N / RB, RB, sp.C, LANES}).permute({0, 2, 1, 3}));
  if (sp.T > 0) out.select(1, sp.C + 1).narrow(2, 0, sp.T).copy_(rows.narrow(2, K - sp.T, sp.T));
  return out;
}

template <int M>
void packed_call(const float* x, const float* p, int64_t blocks, int64_t N, int64_t K, Split sp, const float* bias,
                 float* y) {
  const int64_t stride = (sp.C + 2) * RB * LANES;
  const bool wide = avx512();
  at::parallel_for(0, blocks, grain(K, RB), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      const float* bi = bias == nullptr ? nullptr : bias + i * RB;
      if (wide) {
        packed_block_avx512<M>(x, p + i * stride, K, N, sp, bi, y + i * RB);
      } else {
        for (int m = 0; m < M; ++m) packed_block(x + m * K, p + i * stride, K, sp, bi, y + m * N + i * RB);
      }
    }
  });
}

at::Tensor f32_rows_packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                                  int64_t peel, int64_t order) {
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 4 && packed.size(2) == RB &&
                  packed.size(3) == LANES && packed.is_contiguous() &&
                  reinterpret_cast<std::uintptr_t>(packed.data_ptr()) % 64 == 0,
              "f32_rows_packed_linear: packed must come from f32_rows_pack");
  TORCH_CHECK(peel >= 1 && peel <= LANES, "f32_rows_packed_linear: peel must be 1-4, got ", peel);
  TORCH_CHECK(order == 1 || (order == 2 && peel == LANES), "f32_rows_packed_linear: order must be 1, or 2 "
              "(columns) for a weight whose rows start 16-byte aligned (peel 4), got order ", order, " peel ", peel);
  const int64_t N = packed.size(0) * RB, K = x.size(-1);
  const Split sp(K, peel, order == 2);
  TORCH_CHECK(K % LANES == 0 && sp.C + 2 == packed.size(1), "f32_rows_packed_linear: x must be rows of ",
              (packed.size(1) - 1) * LANES, " inputs, got shape ", x.sizes());
  Rows r("f32_rows_packed_linear", x, K, N, bias);
  const float* xp = r.x2.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = r.y.data_ptr<float>();
  const int64_t blocks = packed.size(0);
  switch (r.M) {
    case 1: packed_call<1>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    case 2: packed_call<2>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    case 3: packed_call<3>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    case 4: packed_call<4>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    case 5: packed_call<5>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    case 6: packed_call<6>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    case 7: packed_call<7>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
    default: packed_call<8>(xp, wp, blocks, N, K, sp, r.bias, yp); break;
  }
  return r.out();
}

int64_t f32_rows_peel(const at::Tensor& w) { return peel_of(w.data_ptr()); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(voxcast, m) {
  m.def("f32_rows_linear(Tensor x, Tensor w, Tensor? bias, int order=1) -> Tensor");
  m.def("f32_rows_pack(Tensor w) -> Tensor");
  m.def("f32_rows_packed_linear(Tensor x, Tensor packed, Tensor? bias, int peel, int order=1) -> Tensor");
  m.def("f32_rows_peel(Tensor w) -> int", &f32_rows_peel);
}

TORCH_LIBRARY_IMPL(voxcast, CPU, m) {
  m.impl("f32_rows_linear", f32_rows_linear);
  m.impl("f32_rows_pack", f32_rows_pack);
  m.impl("f32_rows_packed_linear", f32_rows_packed_linear);
}
