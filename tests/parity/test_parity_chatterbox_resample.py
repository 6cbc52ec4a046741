"""S3Gen's 24 -> 16 kHz resampling against torchaudio's own code: ``transforms.Resample(24000, 16000)``
(what ``S3Gen.embed_ref`` applies before CAMPPlus and the S3 tokenizer) is
``_get_sinc_resample_kernel`` (float64, cached as float32) then ``_apply_sinc_resample_kernel``.
torchaudio's binary does not load beside a CPU torch 2.13, so those two pure-Python functions are
taken from the installed ``torchaudio/functional/functional.py`` by their source and run as they are."""

from __future__ import annotations

import ast
import importlib.machinery
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from voxcast.models.chatterbox_turbo.s3gen_audio import resample_sinc

pytestmark = pytest.mark.parity


def _torchaudio_functions() -> dict[str, Any] | None:
    spec = importlib.machinery.PathFinder.find_spec("torchaudio")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "functional" / "functional.py"
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    wanted = {"_get_sinc_resample_kernel", "_apply_sinc_resample_kernel"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if {n.name for n in body} != wanted:
        return None
    namespace: dict[str, Any] = {
        "torch": torch,
        "math": math,
        "Optional": Any,
        "Tuple": tuple,
        "_CPU": torch.device("cpu"),
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


FUNCS = _torchaudio_functions()


@pytest.mark.skipif(FUNCS is None, reason="torchaudio (its functional.py) is not installed")
@pytest.mark.parametrize("samples", [240000, 123457, 960, 24001])
def test_resampler_is_torchaudios(samples: int) -> None:
    assert FUNCS is not None
    gcd = math.gcd(24000, 16000)
    kernel, width = FUNCS["_get_sinc_resample_kernel"](24000, 16000, gcd, 6, 0.99, "sinc_interp_hann", None)
    kernel = kernel.to(torch.float32)  # transforms.Resample caches it as float32
    x = torch.randn(1, samples, generator=torch.Generator().manual_seed(samples)) * 0.1
    want = FUNCS["_apply_sinc_resample_kernel"](x, 24000, 16000, gcd, kernel, width)
    got = resample_sinc(x, 24000, 16000)
    assert got.shape == want.shape
    assert torch.equal(got, want), float((got - want).abs().max())


@pytest.mark.parametrize("samples", [240000, 123457, 24001])
def test_t3_side_resampling_is_librosas(samples: int) -> None:
    librosa = pytest.importorskip("librosa")
    import numpy as np

    from voxcast.models.chatterbox_turbo.voice import resample_16k

    x = (np.random.default_rng(samples).standard_normal(samples) * 0.1).astype(np.float32)
    want = librosa.resample(x, orig_sr=24000, target_sr=16000)  # prepare_conditionals' call (soxr_hq)
    assert np.array_equal(resample_16k(x), want)
