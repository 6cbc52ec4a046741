"""Whole frames in slots (``batch_graphs``, :mod:`voxcast.models.qwen3_tts.accel.batch_frames`) and
its graph-safe sampler (:mod:`voxcast.models.qwen3_tts.accel.row_sampling`), run eagerly on the CPU.

Greedy codes of a batch equal each stream alone (new path) and today's eager path; prompts of
different lengths share a batch; a stream's end (compaction) and growth of the slots keep the other
rows' codes; seeded sampled codes of a row do not depend on which rows share its batch; padding
rows do not change real rows. CUDA graph capture (replay = eager) is marked ``gpu``.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.models import eos_prone_copy
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.accel.batch_frames import BatchedFrames
from voxcast.models.qwen3_tts.accel.row_sampling import exponential_noise, pick
from voxcast.models.qwen3_tts.generator import FrameGenerator
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A second, longer sentence so that the prompts have different lengths and positions.",
    "Third.",
    "A fourth stream, to fill a bucket of four rows.",
    "Fifth and last.",
]
SPEAKERS = ["ryan", "vivian", "ryan", "vivian", "ryan"]


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir: Any) -> str:
    return str(tiny_model_dir("custom_voice"))


@pytest.fixture(scope="module")
def eager(checkpoint: str) -> Qwen3TTS:
    return Qwen3TTS.from_pretrained(checkpoint)


@pytest.fixture()
def slots(checkpoint: str) -> Qwen3TTS:
    """A fresh model with ``batch_graphs`` (one slot at first: the tests grow it)."""
    model = Qwen3TTS.from_pretrained(checkpoint, batch_graphs=True)
    assert model.batched is not None and model.batched.rows == 1
    return model


def _gen(model: Qwen3TTS, i: int, limit: int, greedy: bool = True, seed: int | None = None) -> FrameGenerator:
    prompt = model.build_prompt(TEXTS[i], speaker=SPEAKERS[i])
    return model.new_generator(
        prompt, SamplingParams(seed=30 + i if seed is None else seed, greedy=greedy), limit
    )


def _run(model: Qwen3TTS, gens: list[FrameGenerator]) -> list[list[list[int]]]:
    out: list[list[list[int]]] = [[] for _ in gens]
    while True:
        frames = model.step_many(gens)
        if all(f is None for f in frames):
            return out
        for i, f in enumerate(frames):
            if f is not None:
                out[i].append(f.tolist())


def test_greedy_batch_equals_each_row_alone_and_the_eager_path(slots: Qwen3TTS, eager: Qwen3TTS) -> None:
    rows = [0, 1, 2]  # prompts of different lengths, in one bucket of four
    batched = _run(slots, [_gen(slots, i, 9) for i in rows])
    alone = [_run(slots, [_gen(slots, i, 9)])[0] for i in rows]
    today = _run(eager, [_gen(eager, i, 9) for i in rows])
    assert batched == alone == today
    assert all(len(c) == 9 for c in batched)
    assert slots.batched is not None and slots.batched.rows == 4 and slots.batched.active == 0


def test_stream_end_compacts_and_keeps_the_other_rows(slots: Qwen3TTS, eager: Qwen3TTS) -> None:
    limits = [3, 8, 5, 10]  # row 0 ends first: the last slot's stream moves into its slot
    want = [_run(eager, [_gen(eager, i, n)])[0] for i, n in enumerate(limits)]
    gens = [_gen(slots, i, n) for i, n in enumerate(limits)]
    batched = slots.batched
    assert batched is not None
    out: list[list[list[int]]] = [[] for _ in gens]
    actives = []
    while True:
        frames = slots.step_many(gens)
        actives.append(batched.active)
        if all(f is None for f in frames):
            break
        for i, f in enumerate(frames):
            if f is not None:
                out[i].append(f.tolist())
    assert out == want
    assert actives[:4] == [4, 4, 4, 3] and actives[-1] == 0  # swept once its limit is met


def test_a_dropped_stream_gives_its_slot_back(slots: Qwen3TTS, eager: Qwen3TTS) -> None:
    """A cancelled stream's generator is simply dropped by its caller: its slot is swept."""
    keep, drop = _gen(slots, 1, 6), _gen(slots, 0, 6)
    first = slots.step_many([drop, keep])
    assert slots.batched is not None and slots.batched.active == 2
    del drop
    gc.collect()
    rest = _run(slots, [keep])[0]
    assert slots.batched.active == 0
    assert [first[1].tolist(), *rest] == _run(eager, [_gen(eager, 1, 6)])[0]  # type: ignore[union-attr]


def test_growing_the_slots_keeps_the_codes(slots: Qwen3TTS, eager: Qwen3TTS) -> None:
    """Longer positions than the slots hold (S doubles) and more streams than slots (R doubles)."""
    want = [_run(eager, [_gen(eager, i, 7)])[0] for i in (0, 1)]
    gens = [_gen(slots, 0, 7)]
    batched = slots.batched
    assert batched is not None
    out = [[f.tolist() for f in slots.step_many(gens) if f is not None] for _ in range(3)]
    gens.append(_gen(slots, 1, 7))
    batched._allocate(batched.rows, 2 * batched.length)  # as when a stream reaches S
    rest = _run(slots, gens)
    assert [r[0] for r in out] + rest[0] == want[0] and rest[1] == want[1]
    assert batched.length == 512 and batched.rows == 2


def test_a_rows_sampled_codes_do_not_depend_on_its_batch(slots: Qwen3TTS) -> None:
    """Stream 0 (seed 5) first in one batch, last in another with other companions, and alone."""
    a = _run(
        slots, [_gen(slots, 0, 8, greedy=False, seed=5), _gen(slots, 1, 8, False), _gen(slots, 2, 8, False)]
    )
    b = _run(
        slots, [_gen(slots, 3, 8, False), _gen(slots, 4, 8, False), _gen(slots, 0, 8, greedy=False, seed=5)]
    )
    assert b[2] == a[0]
    assert a[1] != a[0]  # the draws are not shared between rows
    alone = _run(slots, [_gen(slots, 0, 8, greedy=False, seed=5)])[0]
    assert alone == a[0]  # (bucket 1 against bucket 4: equal here, up to rounding in general)
    other_seed = _run(slots, [_gen(slots, 0, 8, greedy=False, seed=6)])[0]
    assert other_seed != alone


def test_padding_rows_do_not_change_real_rows(slots: Qwen3TTS) -> None:
    """Three streams run in the four-row bucket; whatever the fourth slot holds does not matter."""
    clean = _run(slots, [_gen(slots, i, 6, greedy=False) for i in range(3)])
    batched = slots.batched
    assert batched is not None and batched.rows == 4
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():  # (the slots' tensors are allocated in inference mode)
        for t in [*batched._row_kv(), batched._state["hidden"], batched._state["pending"]]:
            t[3] = torch.randn(t[3].shape, generator=g) * 100
        batched._state["pos"][3] = batched.length - 1
    assert _run(slots, [_gen(slots, i, 6, greedy=False) for i in range(3)]) == clean


def test_end_of_speech_ends_a_row(tiny_model_dir: Any, tmp_path: Path) -> None:
    """A checkpoint that ends speech early: frames and finish reasons as the eager path."""
    dst = eos_prone_copy(tiny_model_dir("custom_voice"), tmp_path)
    fast, plain = Qwen3TTS.from_pretrained(str(dst), batch_graphs=True), Qwen3TTS.from_pretrained(str(dst))
    gens = [_gen(fast, i, 40) for i in range(3)]
    got = _run(fast, gens)
    want_gens = [_gen(plain, i, 40) for i in range(3)]
    assert got == _run(plain, want_gens)
    assert [g.finish_reason for g in gens] == [g.finish_reason for g in want_gens]
    assert "eos" in [g.finish_reason for g in gens]


# ---------------------------------------------------------------------- the sampler


def test_noise_is_a_pure_function_of_seed_and_counter() -> None:
    lanes = torch.arange(2048)
    seeds = torch.tensor([1, 2**62 + 7, 1, 123456789])
    counters = torch.tensor([0, 0, 1, 40])
    noise = exponential_noise(seeds, counters, 0, lanes)
    alone = exponential_noise(seeds[2:3], counters[2:3], 0, lanes)
    assert torch.equal(noise[2:3], alone)
    assert not torch.equal(noise[0], noise[2]) and not torch.equal(noise[0], noise[1])
    assert not torch.equal(noise, exponential_noise(seeds, counters, 1, lanes))  # domains differ
    assert torch.isfinite(noise).all() and (noise > 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.02  # Exp(1)


def test_pick_draws_from_the_warped_distribution() -> None:
    """Greedy and top_k=1 rows take the argmax; sampled draws follow softmax(scores / T)."""
    torch.manual_seed(0)
    v, n = 8, 20000
    scores = torch.randn(1, v).expand(n, v)
    noise = exponential_noise(torch.full((n,), 3), torch.arange(n), 0, torch.arange(v))
    ones = torch.ones(n)
    codes = pick(
        scores, noise, torch.zeros(n, dtype=torch.bool), ones, torch.zeros(n, dtype=torch.long), ones
    )
    freq = torch.bincount(codes, minlength=v).float() / n
    torch.testing.assert_close(freq, scores[0].softmax(-1), atol=0.015, rtol=0)
    top1 = pick(scores, noise, torch.zeros(n, dtype=torch.bool), ones, torch.ones(n, dtype=torch.long), ones)
    greedy = pick(
        scores, noise, torch.ones(n, dtype=torch.bool), ones, torch.zeros(n, dtype=torch.long), ones
    )
    assert (top1 == scores[0].argmax()).all() and (greedy == scores[0].argmax()).all()
    top_p = pick(
        scores, noise, torch.zeros(n, dtype=torch.bool), ones, torch.zeros(n, dtype=torch.long), ones * 0.3
    )
    kept = scores[0].softmax(-1).sort(descending=True)
    allowed = set(kept.indices[: int((kept.values.cumsum(0) < 0.3).sum()) + 1].tolist())
    assert set(top_p.unique().tolist()) <= allowed


# ---------------------------------------------------------------------- CUDA graphs


@pytest.mark.gpu
def test_captured_frames_equal_eager_frames_on_cuda(checkpoint: str) -> None:
    """The captured graphs (one per bucket) replay what the same function does eagerly, greedy and
    seeded sampling, with streams of different lengths ending at different frames."""
    graphs = Qwen3TTS.from_pretrained(checkpoint, device="cuda", batch_graphs=True)
    plain = Qwen3TTS.from_pretrained(checkpoint, device="cuda", batch_graphs=True)
    assert graphs.batched is not None and graphs.batched.cuda_graphs
    assert plain.batched is not None
    plain.batched.cuda_graphs = False
    graphs.prepare_batches(4)
    assert graphs.batched.captures == 3  # buckets 1, 2, 4
    for greedy in (True, False):
        limits = [4, 9, 6]
        got = _run(graphs, [_gen(graphs, i, n, greedy) for i, n in enumerate(limits)])
        want = _run(plain, [_gen(plain, i, n, greedy) for i, n in enumerate(limits)])
        assert got == want


@pytest.mark.gpu
def test_captured_frames_keep_greedy_codes_of_the_eager_path_on_cuda(checkpoint: str) -> None:
    graphs = Qwen3TTS.from_pretrained(checkpoint, device="cuda", batch_graphs=True)
    eager = Qwen3TTS.from_pretrained(checkpoint, device="cuda")
    got = _run(graphs, [_gen(graphs, i, 8) for i in range(3)])
    want = _run(eager, [_gen(eager, i, 8) for i in range(3)])
    agree = sum(
        a == b
        for x, y in zip(got, want, strict=True)
        for fa, fb in zip(x, y, strict=True)
        for a, b in zip(fa, fb, strict=True)
    )
    assert agree / (16 * 8 * 3) >= 0.9


def test_batched_frames_refuses_cuda_graphs_on_a_cpu(eager: Qwen3TTS) -> None:
    with pytest.raises(ValueError, match="CUDA"):
        BatchedFrames(eager.talker, cuda_graphs=True)
