// The checked arguments voxcast's Linear kernels share (int8_kernel.cpp, f32_rows.cpp): x as [M, K]
// float32 rows, an optional float32 bias of N values, and the output [M, N] to fill.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace voxcast {

struct LinearRows {
  at::Tensor x2, y, bias_c;
  const float* bias = nullptr;  // or null
  int64_t M = 0, K = 0, N = 0;
  std::vector<int64_t> sizes;  // x's leading dimensions, then N

  // name: the op (for messages); N: its outputs.
  LinearRows(const char* name, const at::Tensor& x, int64_t outputs, const std::optional<at::Tensor>& b)
      : N(outputs) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1, name,
                ": x must be float32 on the CPU");
    K = x.size(-1);
    if (b.has_value()) {
      bias_c = b->contiguous();
      TORCH_CHECK(bias_c.scalar_type() == at::kFloat && bias_c.numel() == N, name, ": bias must be ", N,
                  " float32 values");
      bias = bias_c.data_ptr<float>();
    }
    x2 = x.reshape({-1, K}).contiguous();
    M = x2.size(0);
    sizes = x.sizes().vec();
    sizes.back() = N;
    y = at::empty({M, N}, x.options());
  }

  // The output in x's leading dimensions.
  at::Tensor out() const { return y.view(sizes); }
};

}  // namespace voxcast
