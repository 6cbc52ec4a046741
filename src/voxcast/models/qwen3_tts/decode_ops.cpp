// Fused element-wise steps of a decoder layer for float32 rows, built into the same library as the
// int8 kernel (int8_kernel.py). A decode step's vectors are a few KB: PyTorch spends ~2-3 us
// dispatching each of the ~7 operations of an RMSNorm and the ~7 of a rotary embedding, far more than
// the arithmetic. One call does each here.
//
// voxcast::rms_norm(x, w, eps): w * (x * 1 / sqrt(mean(x^2) + eps)) over the last dimension.
// voxcast::norm_rope(x, w, cos, sin, eps, head_dim): x [B, L, H * D] (a view of the fused q/k/v
// projection) -> per-head RMSNorm, then the rotary embedding q * cos + rotate_half(q) * sin, as a
// contiguous [B, H, L, D] tensor (the layout attention takes).
//
// The sum of squares is accumulated in double (more exact than PyTorch's float32 mean, so not bitwise
// its result); the rest is the same float32 operations in the same order (no contraction to FMA:
// CFLAGS has -ffp-contract=off). Rows are independent of each other.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
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
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 4 && (t->size(0) == 1 || t->size(0) == B) &&
                    t->size(1) == 1 && t->size(2) == L && t->size(3) == D,
                "norm_rope: cos/sin must be float32 [1 or B, 1, L, D]");
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(voxcast, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("norm_rope(Tensor x, Tensor w, Tensor cos, Tensor sin, float eps, int head_dim) -> Tensor");
}

TORCH_LIBRARY_IMPL(voxcast, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("norm_rope", norm_rope);
}
