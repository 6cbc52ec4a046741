// Fused element-wise steps of a decoder layer for float32 rows, built into the same library as the
// int8 kernel (int8_kernel.py). A decode step's vectors are a few KB: PyTorch spends ~2-3 us
// dispatching each of the ~7 operations of an RMSNorm and the ~7 of a rotary embedding, far more than
// the arithmetic. One call does each here.
//
// voxcast::rms_norm(x, w, eps): w * (x * 1 / sqrt(mean(x^2) + eps)) over the last dimension.
// voxcast::norm_rope(x, w, cos, sin, eps, head_dim): x [B, L, H * D] (a view of the fused q/k/v
// projection) -> per-head RMSNorm, then the rotary embedding q * cos + rotate_half(q) * sin, as a
// contiguous [B, H, L, D] tensor (the layout attention takes).
// voxcast::decode_attention(q, k, v, scale): attention of a few query positions (a decode step) over
// a cache, grouped-query, causal with the queries at the cache's last L positions, straight to the
// [B, L, H * D] layout the output projection takes. PyTorch's scaled_dot_product_attention costs
// 18 us a call at 16 cached positions (AMD Zen 3), most of it set-up; this 11.
//
// Not bitwise PyTorch's results: the norms' sum of squares is accumulated in double (more exact than
// PyTorch's float32 mean), the attention's dot products in FMA partial sums; the norms' and the
// rotary embedding's element-wise arithmetic is the same float32 operations in the same order (no
// contraction to FMA: CFLAGS has -ffp-contract=off). Rows are independent of each other.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// 1 / sqrt(mean(x^2) + eps) for n floats; eight partial sums keep the adds from waiting on each other.
inline float inv_rms(const float* x, int64_t n, double eps) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * x[i];
  const double sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  return static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
}

inline void check_weight(const char* name, const at::Tensor& w, int64_t d) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 1 && w.size(0) == d &&
                  w.is_contiguous(),
              name, ": weight must be a contiguous float32 vector of ", d, " on the CPU");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1,
              "rms_norm: x must be float32 on the CPU");
  const int64_t d = x.size(-1);
  TORCH_CHECK(d > 0, "rms_norm: empty last dimension");
  check_weight("rms_norm", w, d);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t rows = xc.numel() / d;
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * d;
      float* yr = yp + r * d;
      const float inv = inv_rms(xr, d, eps);
      for (int64_t i = 0; i < d; ++i) yr[i] = wp[i] * (xr[i] * inv);
    }
  });
  return y;
}

at::Tensor norm_rope(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cos, const at::Tensor& sin,
                     double eps, int64_t head_dim) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 3 && x.stride(2) == 1,
              "norm_rope: x must be float32 [B, L, H * D] on the CPU, contiguous in its last dimension");
  const int64_t B = x.size(0), L = x.size(1), D = head_dim;
  TORCH_CHECK(D > 0 && D % 2 == 0 && x.size(2) % D == 0, "norm_rope: ", x.size(2),
              " features are not whole heads of an even head_dim ", D);
  const int64_t H = x.size(2) / D;
  check_weight("norm_rope", w, D);
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4 && (t->size(0) == 1 || t->size(0) == B) &&
                    t->size(1) == 1 && t->size(2) == L && t->size(3) == D,
                "norm_rope: cos/sin must be float32 [1 or B, 1, L, D] on the CPU");
  const at::Tensor cc = cos.contiguous(), sc = sin.contiguous();
  const int64_t table_b = cc.size(0) == 1 ? 0 : L * D;  // the tables' stride per batch row
  at::Tensor y = at::empty({B, H, L, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* cp = cc.data_ptr<float>();
  const float* sp = sc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t sx0 = x.stride(0), sx1 = x.stride(1), half = D / 2;
  at::parallel_for(0, B * L * H, std::max<int64_t>(1, 65536 / D), [&](int64_t i0, int64_t i1) {
    std::vector<float> n(static_cast<size_t>(D));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / (L * H), l = i / H % L, h = i % H;
      const float* src = xp + b * sx0 + l * sx1 + h * D;
      const float inv = inv_rms(src, D, eps);
      for (int64_t j = 0; j < D; ++j) n[j] = wp[j] * (src[j] * inv);
      const float* c = cp + b * table_b + l * D;
      const float* s = sp + b * table_b + l * D;
      float* out = yp + ((b * H + h) * L + l) * D;
      for (int64_t j = 0; j < half; ++j) out[j] = n[j] * c[j] + (-n[j + half]) * s[j];
      for (int64_t j = half; j < D; ++j) out[j] = n[j] * c[j] + n[j - half] * s[j];
    }
  });
  return y;
}


// Dot product of n floats (AVX2, eight lanes times four accumulators).
__attribute__((target("avx2,fma"))) inline float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// y += a * x over n floats.
__attribute__((target("avx2,fma"))) inline void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4 && t->stride(3) == 1,
                "decode_attention: q, k and v must be float32 [B, heads, positions, D] on the CPU, contiguous "
                "in D");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  const int64_t HKV = k.size(1), T = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == HKV && v.size(2) == T && k.size(3) == D &&
                  v.size(3) == D,
              "decode_attention: k and v must be [B, kv_heads, T, D] like q's B and D");
  TORCH_CHECK(HKV > 0 && H % HKV == 0, "decode_attention: ", H, " query heads are not a multiple of ", HKV,
              " kv heads");
  TORCH_CHECK(L >= 1 && L <= T, "decode_attention: ", L, " queries need at least as many cached positions (", T,
              ")");
  at::Tensor out = at::empty({B, L, H * D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / HKV;
  const float sc = static_cast<float>(scale);
  // One task per (b, h, query); split over threads only where a task's keys make it worth a wake-up.
  at::parallel_for(0, B * H * L, std::max<int64_t>(1, 32768 / (T * D)), [&](int64_t t0, int64_t t1) {
    std::vector<float> w(static_cast<size_t>(T));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (H * L), h = t / L % H, i = t % L;
      const int64_t kvh = h / group, last = T - L + i;  // the query sees keys 0 .. last
      const float* qv = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const float* kb = kp + b * k.stride(0) + kvh * k.stride(1);
      const float* vb = vp + b * v.stride(0) + kvh * v.stride(1);
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= last; ++j) {
        w[j] = dot(qv, kb + j * k.stride(2), D) * sc;
        top = std::max(top, w[j]);
      }
      double total = 0.0;
      for (int64_t j = 0; j <= last; ++j) total += (w[j] = std::exp(w[j] - top));
      const float inv = static_cast<float>(1.0 / total);
      float* o = op + (b * L + i) * H * D + h * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j <= last; ++j) axpy(w[j] * inv, vb + j * v.stride(2), o, D);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(voxcast, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("norm_rope(Tensor x, Tensor w, Tensor cos, Tensor sin, float eps, int head_dim) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxcast, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("norm_rope", norm_rope);
  m.impl("decode_attention", decode_attention);
}
