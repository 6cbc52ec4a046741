"""Per-voice prefix KV cache on tiny checkpoints: a hit skips the constant prompt prefix and changes
nothing but the last float bits (codes equal, hidden/logits within 1e-5); the first request of a
prefix is bitwise the uncached path; keys separate every input; the store is byte-bounded LRU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.fixtures.models import random_voice
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.generator import FrameGenerator, step_many
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.prefix_cache import PrefixKVCache
from voxcast.models.qwen3_tts.prompt import Prompt
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt

TEXT_A = "The quick brown fox jumps over the lazy dog."
TEXT_B = "A second sentence, a little longer, so the prompts differ in length."
REF_TEXT = "A reference sentence."

# case -> (model kind, build_prompt kwargs; "voice" names a voice of the `voices` fixture)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "custom_voice": ("custom_voice", {"speaker": "ryan", "language": "english"}),
    "custom_voice_streaming_text": ("custom_voice", {"speaker": "vivian", "non_streaming_text": False}),
    "xvector": ("base", {"voice": "xvec", "language": "english"}),
    "icl_streaming": ("base", {"voice": "icl", "language": "english"}),
    "icl_non_streaming": ("base", {"voice": "icl", "non_streaming_text": True}),
    "instruct": ("voice_design", {"instruct": "A calm, low voice.", "language": "english"}),
}


@pytest.fixture(scope="module")
def models(tiny_model_dir: Any) -> dict[str, Qwen3TTS]:
    return {
        kind: Qwen3TTS.from_pretrained(str(tiny_model_dir(kind)), prefix_cache=True)
        for kind in ("custom_voice", "base", "voice_design")
    }


def _voice(model: Qwen3TTS, seed: int, frames: int | None) -> VoicePrompt:
    return random_voice(model, seed, frames, REF_TEXT)


@pytest.fixture(scope="module")
def voices(models: dict[str, Qwen3TTS]) -> dict[str, VoicePrompt]:
    base = models["base"]
    return {"xvec": _voice(base, 1, None), "icl": _voice(base, 2, 40), "short": _voice(base, 3, 2)}


@pytest.fixture(autouse=True)
def fresh_stores(models: dict[str, Qwen3TTS]) -> None:
    for m in models.values():
        m.prefix_kv = PrefixKVCache()
        m.prefix_cache_enabled = True


def _prompt(models: dict[str, Qwen3TTS], voices: dict[str, VoicePrompt], case: str, text: str) -> Prompt:
    kind, kwargs = CASES[case]
    kw = dict(kwargs)
    if "voice" in kw:
        kw["voice"] = voices[kw["voice"]]
    return models[kind].build_prompt(text, **kw)


def _run(
    model: Qwen3TTS, prompt: Prompt, greedy: bool = True, frames: int = 10
) -> tuple[list[Any], FrameGenerator]:
    gen = model.new_generator(prompt, SamplingParams(seed=11, greedy=greedy), frames)
    out = []
    while (f := gen.step()) is not None:
        out.append(f.tolist())
    return out, gen


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", list(CASES))
def test_hit_codes_equal_uncached(
    models: dict[str, Qwen3TTS], voices: dict[str, VoicePrompt], case: str, greedy: bool
) -> None:
    m = models[CASES[case][0]]
    m.prefix_cache_enabled = False
    want, off = _run(m, _prompt(models, voices, case, TEXT_B), greedy)
    assert not off.prefix_hit and len(m.prefix_kv) == 0
    m.prefix_cache_enabled = True
    _, first = _run(m, _prompt(models, voices, case, TEXT_A), greedy)
    prompt = _prompt(models, voices, case, TEXT_B)
    got, hit = _run(m, prompt, greedy)
    assert (first.prefix_hit, first.prefix_positions) == (False, 0)
    assert hit.prefix_hit and hit.prefix_positions == prompt.prefix_len > 0
    assert (m.prefix_kv.hits, m.prefix_kv.misses) == (1, 1)
    assert got == want and len(want) > 3


@pytest.mark.parametrize("case", list(CASES))
def test_first_request_is_bitwise_uncached_and_hit_is_close(
    models: dict[str, Qwen3TTS], voices: dict[str, VoicePrompt], case: str
) -> None:
    m = models[CASES[case][0]]
    prompt = _prompt(models, voices, case, TEXT_A)
    m.prefix_cache_enabled = False
    off = m.new_generator(prompt, SamplingParams(seed=3), 5)
    off.prefill()
    m.prefix_cache_enabled = True
    miss = m.new_generator(prompt, SamplingParams(seed=3), 5)
    miss.prefill()
    assert not miss.prefix_hit and prompt.prefix_key in m.prefix_kv
    assert torch.equal(miss._hidden, off._hidden) and torch.equal(miss._code0, off._code0)
    for a, b in zip(miss._cache, off._cache, strict=True):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    hit = m.new_generator(prompt, SamplingParams(seed=3), 5)
    hit.prefill()
    assert hit.prefix_hit
    h_full, h_part = off._hidden, hit._hidden
    assert h_full is not None and h_part is not None
    torch.testing.assert_close(h_part, h_full, atol=1e-5, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(
            m.talker.codec_head(h_part), m.talker.codec_head(h_full), atol=1e-5, rtol=0
        )
    n = prompt.length
    for a, b in zip(hit._cache, off._cache, strict=True):
        torch.testing.assert_close(a.k[:, :, :n], b.k[:, :, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(a.v[:, :, :n], b.v[:, :, :n], atol=1e-5, rtol=0)


def test_prefix_lengths_per_mode(models: dict[str, Qwen3TTS], voices: dict[str, VoicePrompt]) -> None:
    base = models["base"]
    prefix = 3 + 4 + 1 + 1  # role, tags with a language, speaker slot, T(tts_bos)+C(pad)
    # reference-text tokens as the prompt takes them: from the reference template, without its
    # role (3) and end (2) tokens (byte-level merges at the edges depend on the tokenizer)
    n_ref = len(base.tokenizer.encode(f"<|im_start|>assistant\n{REF_TEXT}<|im_end|>\n")) - 5
    assert _prompt(models, voices, "custom_voice", TEXT_A).prefix_len == prefix
    assert _prompt(models, voices, "xvector", TEXT_A).prefix_len == prefix
    assert _prompt(models, voices, "icl_streaming", TEXT_A).prefix_len == prefix + n_ref
    assert _prompt(models, voices, "icl_non_streaming", TEXT_A).prefix_len == prefix - 1 + n_ref  # auto
    k = len(base.tokenizer.encode("<|im_start|>user\nA calm, low voice.<|im_end|>\n"))
    assert _prompt(models, voices, "instruct", TEXT_A).prefix_len == k + prefix - 1  # no speaker slot
    # A reference text longer than the reference codes (+ C(bos)) makes the whole prompt constant:
    # all but the last position are cached, and a hit prefills that one position.
    short = base.build_prompt(TEXT_A, voice=voices["short"], language="english")
    assert short.prefix_len == short.length - 1 == prefix + 2
    want, _ = _run(base, short)
    got, hit = _run(base, short)
    assert hit.prefix_hit and got == want


@pytest.mark.parametrize("case", ["icl_streaming", "icl_non_streaming", "instruct", "custom_voice"])
def test_cached_positions_do_not_depend_on_text(
    models: dict[str, Qwen3TTS], voices: dict[str, VoicePrompt], case: str
) -> None:
    a, b = _prompt(models, voices, case, TEXT_A), _prompt(models, voices, case, TEXT_B)
    n = a.prefix_len
    assert a.prefix_key == b.prefix_key and b.prefix_len == n
    torch.testing.assert_close(a.embeds[:, :n], b.embeds[:, :n], atol=1e-6, rtol=0)
    assert not torch.allclose(a.embeds[:, n], b.embeds[:, n])  # the first position of the text


def test_keys_separate_every_input(models: dict[str, Qwen3TTS], voices: dict[str, VoicePrompt]) -> None:
    cv, base, vd = models["custom_voice"], models["base"], models["voice_design"]
    icl = voices["icl"]
    prompts = [
        cv.build_prompt(TEXT_A, speaker="ryan", language="english"),
        cv.build_prompt(TEXT_A, speaker="ryan", language="german"),
        cv.build_prompt(TEXT_A, speaker="ryan"),
        cv.build_prompt(TEXT_A, speaker="vivian", language="english"),
        base.build_prompt(TEXT_A, voice=voices["xvec"], language="english"),
        base.build_prompt(TEXT_A, voice=_voice(base, 9, None), language="english"),
        base.build_prompt(TEXT_A, voice=icl, language="english"),
        base.build_prompt(TEXT_A, voice=icl, language="english", non_streaming_text=True),
        base.build_prompt(TEXT_A, voice=_voice(base, 2, 41), language="english"),  # other codes
        vd.build_prompt(TEXT_A, instruct="A calm, low voice."),
        vd.build_prompt(TEXT_A, instruct="A bright, high voice."),
    ]
    keys = [p.prefix_key for p in prompts]
    assert None not in keys and len(set(keys)) == len(keys)
    for p in prompts:  # each one misses
        model = {"custom_voice": cv, "voice_design": vd}.get(p.mode, base)
        gen = model.new_generator(p, SamplingParams(greedy=True), 1)
        gen.prefill()
        assert not gen.prefix_hit
    # An equal voice in a new object (e.g. reloaded from storage) has the same key and hits.
    same = VoicePrompt(icl.x_vector.clone(), icl.ref_codes, REF_TEXT, None, False, base.identity)
    again = base.build_prompt(TEXT_B, voice=same, language="english")
    assert again.prefix_key == prompts[6].prefix_key
    gen = base.new_generator(again, SamplingParams(greedy=True), 1)
    gen.prefill()
    assert gen.prefix_hit


def test_keys_name_the_model_dtype(tiny_model_dir: Any, models: dict[str, Qwen3TTS]) -> None:
    bf16 = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), dtype=torch.bfloat16)
    a = models["custom_voice"].build_prompt(TEXT_A, speaker="ryan")
    b = bf16.build_prompt(TEXT_A, speaker="ryan")
    assert a.prefix_len == b.prefix_len and a.prefix_key != b.prefix_key


def test_lru_bound_evicts(models: dict[str, Qwen3TTS]) -> None:
    m = models["custom_voice"]
    prompts = [m.build_prompt(TEXT_A, speaker=s, language="english") for s in ("ryan", "vivian", "serena")]
    c = m.talker.cfg
    per_entry = 2 * c.num_hidden_layers * c.num_key_value_heads * prompts[0].prefix_len * c.head_dim * 4
    m.prefix_kv = PrefixKVCache(max_bytes=2 * per_entry)
    for p in prompts:
        m.new_generator(p, SamplingParams(greedy=True), 1).prefill()
    store = m.prefix_kv
    assert len(store) == 2 and store.nbytes == 2 * per_entry <= store.max_bytes
    assert prompts[0].prefix_key not in store and prompts[2].prefix_key in store
    gen = m.new_generator(prompts[0], SamplingParams(greedy=True), 1)
    gen.prefill()
    assert not gen.prefix_hit and prompts[1].prefix_key not in store  # evicted in turn
    m.prefix_kv = PrefixKVCache(max_bytes=per_entry - 1)  # too small for any entry: nothing kept
    m.new_generator(prompts[0], SamplingParams(greedy=True), 1).prefill()
    assert len(m.prefix_kv) == 0


def batched_codes(
    model: Qwen3TTS, prompts: list[Prompt], limits: list[int]
) -> tuple[list[Any], list[FrameGenerator]]:
    gens = [
        model.new_generator(p, SamplingParams(seed=20 + i, greedy=True), n)
        for i, (p, n) in enumerate(zip(prompts, limits, strict=True))
    ]
    out: list[list[list[int]]] = [[] for _ in gens]
    while True:
        frames = step_many(gens)
        if all(f is None for f in frames):
            return out, gens
        for i, f in enumerate(frames):
            if f is not None:
                out[i].append(f.tolist())


def test_step_many_mixes_hits_and_misses(models: dict[str, Qwen3TTS]) -> None:
    m = models["custom_voice"]
    texts = [TEXT_A, TEXT_B, "Third.", "Fourth one here."]
    speakers = ["ryan", "vivian", "ryan", "serena"]
    limits = [12, 6, 9, 10]

    def prompts() -> list[Prompt]:
        return [m.build_prompt(t, speaker=s) for t, s in zip(texts, speakers, strict=True)]

    m.prefix_cache_enabled = False
    want, _ = batched_codes(m, prompts(), limits)
    m.prefix_cache_enabled = True
    m.new_generator(m.build_prompt("Priming.", speaker="ryan"), SamplingParams(greedy=True), 1).prefill()
    got, gens = batched_codes(m, prompts(), limits)
    assert [g.prefix_hit for g in gens] == [True, False, True, False]
    assert got == want and len(want) > 3
