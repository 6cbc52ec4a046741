"""The split residual vector quantizer's decode side of the 12 Hz codec (codes -> latent frames).

Parameter names follow the official ``decoder.quantizer.*`` keys. Lookups through a codebook and the
group's output projection are folded into one projected table per codebook (cached with
:func:`.codec_layers._fold`), so decoding a frame is one gather and one sum.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .codec_layers import CodecDecoderConfig, _fold

__all__ = ["SplitQuantizer"]


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> Tensor:  # [size, dim]
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _VQList(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(n)])


class _RVQ(nn.Module):
    """A group of residual codebooks whose summed lookups are projected dim -> out (Conv1d k1)."""

    def __init__(self, n: int, size: int, dim: int, out: int):
        super().__init__()
        self.input_proj = nn.Conv1d(out, dim, 1, bias=False)  # encoder side; unused here
        self.output_proj = nn.Conv1d(dim, out, 1, bias=False)
        self.vq = _VQList(n, size, dim)

    def projected_tables(self) -> list[Tensor]:
        """Each codebook's table through the (linear) output projection: n x [size, out]."""
        w = self.output_proj.weight[:, :, 0]  # [out, dim]
        return [cast(_Codebook, layer._codebook).table() @ w.T for layer in self.vq.layers]


class SplitQuantizer(nn.Module):
    """One semantic codebook + the acoustic rest, each group with its own output projection.

    The projection is linear, so the decode is a sum of lookups in per-codebook tables projected
    once (:meth:`_table`, [Q * size, codebook_dim]): one gather and one sum per call.
    """

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim, out, size = cfg.codebook_dim // 2, cfg.codebook_dim, cfg.codebook_size
        self.rvq_first = _RVQ(1, size, dim, out)
        self.rvq_rest = _RVQ(cfg.num_quantizers - 1, size, dim, out)
        self.size = size

    def _table(self) -> Tensor:
        return torch.cat(self.rvq_first.projected_tables() + self.rvq_rest.projected_tables())

    def decode(self, codes: Tensor) -> Tensor:  # codes: [B, Q, T] -> [B, codebook_dim, T]
        table = _fold(self, self._table)
        offsets = torch.arange(codes.shape[1], device=codes.device)[:, None] * self.size
        return F.embedding(codes + offsets, table).sum(1).transpose(1, 2)
