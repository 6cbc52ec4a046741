"""Mimi's SEANet encoder (the codec encoder's convolution stack) as matrix products, time-major.

transformers' :class:`~transformers.models.mimi.modeling_mimi.MimiEncoder` pads a channel-major
``[1, C, L]`` tensor before every convolution and hands it to oneDNN, which on a 2-core AVX2 CPU
ran the encoder's long convolutions (72,000 samples of 32-64 channels for a 3 s reference) at
18-50 GFLOP/s and re-packed the 32 MB weight of the last strided convolution on every call. This
module computes the same function on a time-major ``[L, C]`` layout:

* a causal convolution with kernel ``k = m * s`` and stride ``s`` (every layer here: ``k = 2s`` for
  the downsampling layers, ``s = 1`` for the others) is ``m`` matrix products. Viewed as
  ``[(T + m - 1), s * C]``, the padded input's row ``t`` holds samples ``t*s .. t*s + s - 1``
  (no copy), and output frame ``t`` is ``sum_j X[t + j] @ W_j`` with ``W_j`` the kernel's taps
  ``j*s .. j*s + s - 1`` packed once as ``[s * C, C_out]``;
* ELU writes straight into the next convolution's padded buffer (only the pad rows are zeroed);
* a residual block adds its last 1x1 convolution into its input in place;
* with ``fast_elu`` (the model turns it on with its fused operations, i.e. with int8 weights), ELU
  runs on voxcast's C++ operation (``encoder_ops.cpp``: 4x PyTorch's on AMD Zen 3, within 1 ulp of
  the exact value as PyTorch's is, not bitwise equal to it).

The arithmetic is the same up to float rounding (summation order): within 4e-6 relative of
transformers' output, and the codes equal the official encoder's (parity tests). Anything the
layout does not cover (a non-causal or dilated convolution, a convolution shortcut, other padding
modes, a stride that does not divide the kernel) makes :func:`supports` false and the caller keeps
transformers' module.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiEncoder, MimiResnetBlock

__all__ = ["GemmSeanet", "supports"]

#: Below this many input columns (s * C * m) one im2col product beats m thin ones (the first layer:
#: 1 channel, kernel 7).
_IM2COL_MAX_COLUMNS = 64


def _conv_ok(conv: MimiConv1d) -> bool:
    c = conv.conv
    k, s = c.kernel_size[0], c.stride[0]
    return (
        bool(conv.causal)
        and conv.pad_mode == "constant"
        and c.dilation[0] == 1
        and c.groups == 1
        and c.padding[0] == 0
        and c.bias is not None
        and k % s == 0
    )


def supports(encoder: nn.Module) -> bool:
    """Whether :class:`GemmSeanet` computes ``encoder`` (a Mimi SEANet encoder as Qwen3-TTS's)."""
    if not isinstance(encoder, MimiEncoder):
        return False
    if not encoder.layers or not isinstance(encoder.layers[0], MimiConv1d):
        return False  # a residual block adds into its input in place: never the caller's audio
    for layer, after in zip(encoder.layers, [*encoder.layers[1:], None], strict=True):
        if isinstance(layer, nn.ELU) and not isinstance(after, MimiConv1d):
            return False  # GemmSeanet applies an ELU while filling the next convolution's input
        if isinstance(layer, MimiConv1d):
            if not _conv_ok(layer):
                return False
        elif isinstance(layer, MimiResnetBlock):
            convs = [b for b in layer.block if isinstance(b, MimiConv1d)]
            acts = [b for b in layer.block if isinstance(b, nn.ELU)]
            if not isinstance(layer.shortcut, nn.Identity) or len(convs) != 2 or len(acts) != 2:
                return False
            if not all(_conv_ok(c) for c in convs) or any(a.alpha != 1.0 for a in acts):
                return False
            if convs[1].conv.kernel_size[0] != 1:
                return False
        elif isinstance(layer, nn.ELU):
            if layer.alpha != 1.0:
                return False
        else:
            return False
    return True


def _elu(x: Tensor, out: Tensor, fast: bool) -> None:
    """``out = elu(x)`` (``out`` may be ``x``), contiguous float tensors."""
    if fast:
        torch.ops.voxcast.elu_into(x, out)
    elif out is x:
        torch.nn.functional.elu_(x)
    else:
        torch.ops.aten.elu.out(x, 1.0, 1, 1, out=out)


def _bias(conv: MimiConv1d) -> nn.Parameter:
    bias = conv.conv.bias
    assert bias is not None  # supports() checked
    return nn.Parameter(bias.detach().clone(), requires_grad=False)


class _Conv(nn.Module):
    """One causal convolution, packed: taps ``[m, s * C_in, C_out]`` (or im2col ``[s*C_in*m, C_out]``)."""

    def __init__(self, conv: MimiConv1d):
        super().__init__()
        w = conv.conv.weight.detach()  # [C_out, C_in, k]
        c_out, c_in, k = w.shape
        s = conv.conv.stride[0]
        m = k // s
        self.c_in, self.stride, self.taps = c_in, s, m
        # taps[j][r * C_in + c, o] = w[o, c, j * s + r]
        taps = w.reshape(c_out, c_in, m, s).permute(2, 3, 1, 0).reshape(m, s * c_in, c_out)
        self.im2col = s * c_in * m <= _IM2COL_MAX_COLUMNS
        # im2col: column q * m + j of the unfolded input
        packed = taps.permute(1, 0, 2).reshape(s * c_in * m, c_out) if self.im2col else taps
        self.weight = nn.Parameter(packed.contiguous(), requires_grad=False)
        self.bias = _bias(conv)

    def frames(self, length: int) -> int:
        """Output frames for ``length`` input samples (transformers' causal extra padding)."""
        return -(-length // self.stride)

    def buffer(self, x: Tensor) -> tuple[Tensor, int]:
        """A padded input buffer for ``x`` ``[L, C_in]``: ``[(T + m - 1) * s, C_in]`` and the row of x."""
        length = x.shape[0]
        t = self.frames(length)
        left = (self.taps - 1) * self.stride
        buf = x.new_empty(((t + self.taps - 1) * self.stride, self.c_in))
        buf[:left].zero_()
        buf[left + length :].zero_()
        return buf, left

    def run(self, buf: Tensor, length: int) -> Tensor:
        """Convolve a padded buffer from :meth:`buffer` of an ``length``-row input: ``[T, C_out]``."""
        t, m, s = self.frames(length), self.taps, self.stride
        x = buf.view(t + m - 1, s * self.c_in)
        if self.im2col:
            cols = x.unfold(0, m, 1).reshape(t, -1)  # [T, s*C_in, m] -> [T, s*C_in*m]
            return torch.addmm(self.bias, cols, self.weight)
        out = torch.addmm(self.bias, x[0:t], self.weight[0])
        for j in range(1, m):
            out.addmm_(x[j : j + t], self.weight[j])
        return out

    def forward(self, x: Tensor, elu: bool, fast_elu: bool = False) -> Tensor:
        """``conv(elu(x))`` or ``conv(x)`` for time-major ``x`` ``[L, C_in]``."""
        buf, left = self.buffer(x)
        dst = buf[left : left + x.shape[0]]
        if elu:
            _elu(x, dst, fast_elu)
        else:
            dst.copy_(x)
        return self.run(buf, x.shape[0])


class _Residual(nn.Module):
    """``x + conv2(elu(conv1(elu(x))))`` with a 1x1 ``conv2``, added into ``x`` in place."""

    def __init__(self, block: MimiResnetBlock):
        super().__init__()
        first, second = (b for b in block.block if isinstance(b, MimiConv1d))
        self.first = _Conv(first)
        w = second.conv.weight.detach()[:, :, 0]  # [C_out, C_hidden]
        self.weight = nn.Parameter(w.t().contiguous(), requires_grad=False)
        self.bias = _bias(second)

    def forward(self, x: Tensor, fast_elu: bool = False) -> Tensor:
        hidden = self.first(x, True, fast_elu)  # [L, C_hidden]
        _elu(hidden, hidden, fast_elu)
        x.addmm_(hidden, self.weight)
        return x.add_(self.bias)


class GemmSeanet(nn.Module):
    """Drop-in for a :class:`MimiEncoder` (see :func:`supports`): ``[B, 1, L] -> [B, hidden, T]``.

    Holds its own packed weights (the Mimi module's are not kept). The output is a channel-major
    view of a time-major tensor, which is the layout Mimi's encoder transformer asks for next.
    """

    def __init__(self, encoder: MimiEncoder):
        super().__init__()
        #: ELU on voxcast's C++ operation (float32 on the CPU; needs :func:`voxcast.kernels.native.load`).
        self.fast_elu = False
        if not supports(encoder):
            raise ValueError("this Mimi encoder has layers GemmSeanet does not compute")
        self.steps = nn.ModuleList()
        self._elu_before: list[bool] = []
        elu = False
        for layer in encoder.layers:
            if isinstance(layer, nn.ELU):
                elu = True
                continue
            if isinstance(layer, MimiConv1d):
                self.steps.append(_Conv(layer))
            else:
                assert isinstance(layer, MimiResnetBlock)  # supports() checked
                self.steps.append(_Residual(layer))
            self._elu_before.append(elu)
            elu = False

    def forward(self, hidden_states: Tensor, padding_cache: object = None) -> Tensor:
        """Encode ``[B, C, L]`` audio (Mimi's signature; streaming padding caches are not supported)."""
        if padding_cache is not None:
            raise ValueError("GemmSeanet does not stream (padding_cache must be None)")
        outs = [self._one(x.t().contiguous()) for x in hidden_states]  # [T, hidden] each
        batch = outs[0][None] if len(outs) == 1 else torch.stack(outs)
        return batch.transpose(1, 2)

    def _one(self, x: Tensor) -> Tensor:
        # x: [L, C] time-major -> [T, hidden]
        fast = self.fast_elu and x.dtype == torch.float32 and x.device.type == "cpu"
        for step, elu in zip(self.steps, self._elu_before, strict=True):
            x = step(x, elu, fast) if isinstance(step, _Conv) else step(x, fast)
        return x
