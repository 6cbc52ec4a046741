"""T3's static decode step (:mod:`voxcast.models.chatterbox_turbo.t3_static`) on the tiny random
checkpoint (built without a stop bias, so utterances run long): its tokens equal the eager path's,
greedy and seeded sampling, alone and batched; slots are reused; the engine's model routes steady
streams through it. The CUDA graph replay is checked against the eager static step on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from voxcast.models.base import LoadOptions, SamplingParams
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo
from voxcast.models.chatterbox_turbo.sampling import TurboSampling
from voxcast.models.chatterbox_turbo.t3 import TokenStream
from voxcast.models.chatterbox_turbo.t3_static import StaticT3, buckets

TEXTS = ("Hello there, this is a test.", "A second, longer sentence [laugh] with tags.", "Third.")


@pytest.fixture(scope="module")
def model(turbo_nostop_dir: Path) -> ChatterboxTurbo:
    return ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions())


def _stream(model: ChatterboxTurbo, text: str, sampling: TurboSampling, seed: int, n: int) -> TokenStream:
    p = model.build_prompt(text)
    return model.t3.stream(p.text_ids, prefix=p.prefix, sampling=sampling, seed=seed, max_tokens=n)


def _eager(model: ChatterboxTurbo, text: str, sampling: TurboSampling, seed: int, n: int = 40) -> list[int]:
    return _stream(model, text, sampling, seed, n).all()


SAMPLINGS = [
    TurboSampling(greedy=True),
    TurboSampling(),
    TurboSampling(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0),
    TurboSampling(temperature=0.6, top_k=50, top_p=0.8, repetition_penalty=1.5),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "default", "plain", "tight"])
def test_static_tokens_equal_the_eager_path(model: ChatterboxTurbo, sampling: TurboSampling) -> None:
    static = StaticT3(model.t3, slots=2, length=1024)
    for seed, text in enumerate(TEXTS[:2]):
        s = _stream(model, text, sampling, seed, 40)
        tokens = [s.next()]
        assert static.admit(s) is not None
        while (t := s.next()) is not None:
            tokens.append(t)
        assert tokens == _eager(model, text, sampling, seed)
        assert s.slot is None  # released when done
    assert static._free == [0, 1]


@pytest.mark.parametrize("sampling", [SAMPLINGS[0], SAMPLINGS[1]], ids=["greedy", "sampled"])
def test_batched_rows_equal_rows_alone(model: ChatterboxTurbo, sampling: TurboSampling) -> None:
    static = StaticT3(model.t3, slots=4, length=1024)
    streams = [_stream(model, t, sampling, 10 + i, 30 + 5 * i) for i, t in enumerate(TEXTS)]
    got: list[list[int]] = [[s.next() or -1] for s in streams]
    for s in streams:
        assert static.admit(s) is not None
    while live := [i for i, s in enumerate(streams) if not s.done]:
        for i, t in zip(live, static.step([streams[i] for i in live]), strict=True):
            if t is not None:
                got[i].append(t)
    for i, text in enumerate(TEXTS):
        assert got[i] == _eager(model, text, sampling, 10 + i, 30 + 5 * i), i


def test_slots_run_out_and_come_back(model: ChatterboxTurbo) -> None:
    static = StaticT3(model.t3, slots=1, length=1024)
    a, b = (_stream(model, TEXTS[2], TurboSampling(greedy=True), 0, 8) for _ in range(2))
    a.next(), b.next()
    assert static.admit(a) == 0 and static.admit(b) is None
    short = StaticT3(model.t3, slots=1, length=a.cache.length + 2)
    assert not short.fits(b)  # a stream that could outgrow a slot stays eager
    a.all()
    assert static.admit(b) == 0
    del a  # a dropped stream's slot comes back too
    c = _stream(model, TEXTS[2], TurboSampling(greedy=True), 0, 8)
    c.next()
    del b
    assert static.admit(c) == 0
    assert buckets(6) == (1, 2, 4, 6) and buckets(1) == (1,)


def test_the_model_routes_steady_streams_through_it(turbo_nostop_dir: Path) -> None:
    opts = LoadOptions(settings=(("turbo_static_decode", True),))
    model = ChatterboxTurbo.from_pretrained(turbo_nostop_dir, opts)
    model.prepare_batches(3)
    assert model.static is not None and model.runtime_report()["t3_static_decode"]
    params = SamplingParams(seed=4)
    gens = [model.new_generator(model.build_prompt(t), params, 25) for t in TEXTS]
    out: list[list[int]] = [[] for _ in gens]
    while any(g.finish_reason is None for g in gens):
        for i, tok in enumerate(model.step_many(gens)):
            if tok is not None:
                out[i].append(int(tok))
    for i, text in enumerate(TEXTS):
        assert out[i] == _eager(model, text, TurboSampling(), gens[i].seed, 1000)[:25], i


@pytest.mark.gpu
def test_cuda_graph_replay_equals_the_eager_static_step(turbo_nostop_dir: Path) -> None:
    model = ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(device="cuda"))
    eager = StaticT3(model.t3, slots=3, length=512)
    graphs = StaticT3(model.t3, slots=3, length=512, graphs=True)
    graphs.capture()
    streams = {}
    for name, static in (("eager", eager), ("graphs", graphs)):
        ss = [_stream(model, t, TurboSampling(greedy=True), 0, 20) for t in TEXTS]
        for s in ss:
            s.next()
            static.admit(s)
        streams[name] = ss
        for _ in range(10):
            static.step(ss)
    for a, b in zip(streams["eager"], streams["graphs"], strict=True):
        assert [int(t) for t in a.tokens] == [int(t) for t in b.tokens]
    assert torch.equal(eager.keys, graphs.keys) and torch.equal(eager.pos, graphs.pos)
