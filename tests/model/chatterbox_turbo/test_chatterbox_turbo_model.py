"""Chatterbox Turbo as a voxcast model, on the tiny random checkpoint in the official layout: loading
and its errors, voices (build, store, conds.pt), prompts and the request fields Turbo refuses, the
token generator, and the streamed audio against the one-pass decode of the same tokens and noise."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from voxcast.errors import CheckpointError, InvalidRequest, InvalidVoicePrompt
from voxcast.models.base import LoadOptions, SamplingParams
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo, turbo_sampling
from voxcast.models.chatterbox_turbo.s3gen_stream import TAIL, StreamSettings, TurboAudioStream, one_pass
from voxcast.models.chatterbox_turbo.voice import TurboVoice
from voxcast.models.registry import family_of, load_model
from voxcast.testing.signals import speech_like


@pytest.fixture(scope="module")
def model(turbo_model_dir: Path) -> ChatterboxTurbo:
    m = load_model(str(turbo_model_dir), LoadOptions())
    assert isinstance(m, ChatterboxTurbo)
    return m


@pytest.fixture(scope="module")
def voice(model: ChatterboxTurbo) -> TurboVoice:
    return model.make_voice(speech_like(6.5, 24000, seed=3), 24000, None, False)


def test_family_is_read_from_the_layout(turbo_model_dir: Path) -> None:
    assert not (turbo_model_dir / "config.json").exists()  # the official layout ships none
    assert family_of(turbo_model_dir) == "chatterbox_turbo"


@pytest.mark.parametrize("missing", ["s3gen_meanflow.safetensors", "ve.safetensors", "vocab.json"])
def test_an_incomplete_checkpoint_names_the_file(turbo_model_dir: Path, tmp_path: Path, missing: str) -> None:
    copy = shutil.copytree(turbo_model_dir, tmp_path / "m")
    (copy / missing).unlink()
    with pytest.raises(CheckpointError, match=missing.split(".")[0]):
        load_model(str(copy), LoadOptions())


def test_identity_is_stable_across_copies(
    model: ChatterboxTurbo, turbo_model_dir: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(turbo_model_dir, tmp_path / "m")
    assert ChatterboxTurbo.from_pretrained(copy).identity == model.identity
    assert model.identity.startswith("chatterbox-turbo:")


def test_builtin_voice_is_the_converted_conds(model: ChatterboxTurbo, turbo_model_dir: Path) -> None:
    raw = torch.load(str(turbo_model_dir / "conds.pt"), weights_only=True)
    v = model.builtin
    assert v is not None and model.speakers == ("default",)
    assert torch.equal(v.speaker, raw["t3"]["speaker_emb"])
    assert torch.equal(v.t3_tokens, raw["t3"]["cond_prompt_speech_tokens"])
    assert torch.equal(v.prompt_tokens, raw["gen"]["prompt_token"])
    assert torch.equal(v.prompt_mel, raw["gen"]["prompt_feat"])
    assert torch.equal(v.xvector, raw["gen"]["embedding"])


class _Payload:  # not a tensor: weights_only loading must refuse it
    pass


def test_a_conds_file_with_code_objects_is_refused(tmp_path: Path) -> None:
    torch.save({"t3": _Payload(), "gen": {}}, str(tmp_path / "conds.pt"))
    with pytest.raises(CheckpointError, match=r"conds\.pt"):
        TurboVoice.from_conds(tmp_path / "conds.pt")


def test_voice_from_reference(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    assert voice.speaker.shape == (1, 256) and voice.xvector.shape == (1, 192)
    assert 0 < voice.t3_tokens.shape[1] <= 375
    q = voice.prompt_tokens.shape[1]
    # the whole 7.1 s clip (0.3 s of silence each side) is under S3Gen's 10 s: 25 tokens a second
    assert voice.prompt_mel.shape == (1, 2 * q, 80) and q == 177
    assert voice.model_identity == model.identity


def test_voice_bytes_round_trip(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    data = voice.to_bytes()
    assert data == voice.to_bytes()  # deterministic (content-addressed storage)
    back = model.voice_from_bytes(data)
    for name in ("speaker", "t3_tokens", "prompt_tokens", "prompt_mel", "xvector"):
        assert torch.equal(getattr(back, name), getattr(voice, name)), name
    with pytest.raises(InvalidVoicePrompt) as e:
        TurboVoice.from_bytes(data, expected_identity="another-model")
    assert e.value.field == "voice"
    with pytest.raises(InvalidVoicePrompt):
        model.voice_from_bytes(b"\x00" * 40)


def test_short_reference_is_refused(model: ChatterboxTurbo) -> None:
    with pytest.raises(InvalidRequest) as e:
        model.make_voice(speech_like(4.0, 24000, seed=1), 24000, None, False)
    assert e.value.field == "ref_audio"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"speaker": "ryan"}, "voice"),
        ({"instruct": "whisper"}, "instruct"),
        ({"language": "chinese"}, "language"),
    ],
)
def test_fields_turbo_cannot_honour(model: ChatterboxTurbo, fields: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        model.build_prompt("Hello.", **fields)  # type: ignore[arg-type]
    assert e.value.field == field


def test_paralinguistic_tags_are_single_tokens(model: ChatterboxTurbo) -> None:
    ids = model.tokenizer.encode("Well [laugh] fine.")
    laugh = model.tokenizer.encode("[laugh]")
    assert len(laugh) == 1 and laugh[0] in ids


def test_unset_sampling_fields_take_turbo_defaults() -> None:
    s = turbo_sampling(SamplingParams(temperature=0.5))
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty) == (0.5, 1000, 0.95, 1.2)


def _tokens(
    model: ChatterboxTurbo, voice: TurboVoice | None, seed: int, text: str = "Hello there, friend."
) -> list[int]:
    prompt = model.build_prompt(text, voice=voice)
    gen = model.new_generator(prompt, SamplingParams(seed=seed), 400)
    gen.prefill()
    out = []
    while (t := model.step_many([gen])[0]) is not None:
        out.append(int(t))
    assert gen.finish_reason == "eos"
    return out


def test_the_prefix_cache_gives_the_same_tokens(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    with_cache = _tokens(model, voice, seed=5)
    model.prefix_cache_enabled = False
    try:
        without = _tokens(model, voice, seed=5)
    finally:
        model.prefix_cache_enabled = True
    assert with_cache == without and len(with_cache) > 3


def _stream(
    model: ChatterboxTurbo, voice: TurboVoice, seed: int, settings: StreamSettings | None = None
) -> TurboAudioStream:
    return TurboAudioStream(
        model.flow,
        model.hift,
        voice.prompt_tokens,
        voice.prompt_mel.transpose(1, 2),
        voice.xvector,
        seed,
        settings,
    )


@pytest.mark.parametrize("step", [1, 7])
@pytest.mark.parametrize("prompt_cache", [0, 1])
def test_stream_equals_one_pass(
    model: ChatterboxTurbo, voice: TurboVoice, step: int, prompt_cache: int
) -> None:
    tokens = torch.randint(0, 6561, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    s = _stream(model, voice, seed=11, settings=StreamSettings(prompt_cache=prompt_cache))
    assert (s.cache is not None) == bool(prompt_cache)
    parts = [s.push(tokens[i : i + step]) for i in range(0, len(tokens), step)]
    parts.append(s.finish())
    streamed = np.concatenate(parts)
    ref = one_pass(
        model.flow, model.hift, s.prompt_tokens, s.prompt_mel, s.xvector,
        torch.tensor([tokens + list(TAIL)]), s.noise, s.hift_stream,
    ).numpy()  # fmt: skip
    assert streamed.shape == ref.shape == ((len(tokens) + len(TAIL)) * 960,)
    # windowed flow and HiFT: equal up to the windows' (and the prompt cache's) measured, documented error
    assert np.abs(streamed - ref).max() < 1e-4
    assert len([p for p in parts if len(p)]) >= 3  # it did stream


def test_the_chunking_of_pushes_does_not_change_the_audio(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    tokens = torch.randint(0, 6561, (50,), generator=torch.Generator().manual_seed(4)).tolist()
    outs = []
    for step in (1, 5, 50):
        s = _stream(model, voice, seed=3)
        outs.append(np.concatenate([*(s.push(tokens[i : i + step]) for i in range(0, 50, step)), s.finish()]))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_first_audio_comes_after_the_first_chunk_and_its_look_ahead(
    model: ChatterboxTurbo, voice: TurboVoice
) -> None:
    st = StreamSettings()
    s = _stream(model, voice, seed=1, settings=st)
    tokens = list(range(100, 100 + st.first + st.right))
    assert len(s.push(tokens[:-1])) == 0
    first = s.push(tokens[-1:])
    held_frames = st.hift_right  # HiFT keeps its look-ahead of mel frames
    assert len(first) == (2 * st.first - held_frames) * 480


def test_a_voices_s3gen_prompt_cache_is_made_once_and_kept(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    model.prime_voice(voice)
    cache = model.s3gen_cache(voice)
    assert cache is not None and not cache.recording and cache.nbytes > 0
    assert model.s3gen_cache(voice) is cache  # the LRU's, not a new one
    assert model.new_decoder(voice, seed=1).stream.cache is cache
    other = model.make_voice(speech_like(6.0, 24000, seed=8), 24000, None, False)
    assert model.s3gen_cache(other) is not cache


def test_render_is_seeded(model: ChatterboxTurbo) -> None:
    a, b = model.render("Hi there.", seed=3), model.render("Hi there.", seed=3)
    assert np.array_equal(a, b) and len(a) % 960 == 0
    assert not np.array_equal(a, model.render("Hi there.", seed=4))


def test_stream_settings_from_the_environment() -> None:
    from voxcast.config import EngineConfig
    from voxcast.models.registry import family

    env = {"VOXCAST_TURBO_FIRST_TOKENS": "4", "VOXCAST_TURBO_PROMPT_TOKENS": "50"}
    own = family("chatterbox_turbo").resolve(EngineConfig.from_env(env).settings)  # what its loader gets
    s = StreamSettings.from_options(LoadOptions(settings=tuple(own.items())))
    assert (s.first, s.chunk, s.prompt_tokens, s.left, s.right, s.prompt_cache) == (4, 32, 50, 16, 4, 1)
    assert StreamSettings.from_options(LoadOptions()) == StreamSettings()
    off = family("chatterbox_turbo").resolve(
        EngineConfig.from_env({"VOXCAST_TURBO_PROMPT_CACHE": "off"}).settings
    )
    assert StreamSettings.from_options(LoadOptions(settings=tuple(off.items()))).prompt_cache == 0
    bads = (
        {"VOXCAST_TURBO_FIRST_TOKENS": "0"},
        {"VOXCAST_TURBO_CHUNK_TOKENS": "x"},
        {"VOXCAST_TURBO_PROMPT_CACHE": "maybe"},
    )
    for bad in bads:
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineConfig.from_env(bad)


def test_a_short_s3gen_prompt_streams(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    s = _stream(model, voice, seed=2, settings=StreamSettings(prompt_tokens=20))
    assert s.prompt_tokens.shape[1] == 20 and s.prompt_mel.shape[-1] == 40
    tokens = list(range(200, 240))
    audio = np.concatenate([s.push(tokens), s.finish()])
    assert len(audio) == (len(tokens) + len(TAIL)) * 960 and np.isfinite(audio).all()


def test_bfloat16(turbo_model_dir: Path) -> None:
    m = ChatterboxTurbo.from_pretrained(
        turbo_model_dir, LoadOptions(dtype=torch.bfloat16, codec_dtype=torch.bfloat16)
    )
    assert m.t3.speech_head.weight.dtype == torch.bfloat16 and m.hift.conv_pre.weight.dtype == torch.float32
    audio = m.render("Hello there.", seed=1)
    assert np.isfinite(audio).all() and len(audio) % 960 == 0


def test_stored_voice_contents_are_checked(model: ChatterboxTurbo, voice: TurboVoice) -> None:
    from safetensors.torch import save

    bad_meta = save({"x": torch.zeros(1)}, metadata={"voxcast-chatterbox-turbo-voice": "[1, 2]"})
    with pytest.raises(InvalidVoicePrompt):
        model.voice_from_bytes(bad_meta)
    with pytest.raises(InvalidVoicePrompt, match="t3_tokens"):
        TurboVoice(
            voice.speaker, voice.t3_tokens + 7000, voice.prompt_tokens, voice.prompt_mel, voice.xvector
        )
    with pytest.raises(InvalidVoicePrompt, match="speaker"):
        TurboVoice(
            voice.speaker[:, :10], voice.t3_tokens, voice.prompt_tokens, voice.prompt_mel, voice.xvector
        )


def test_text_longer_than_t3_positions_is_refused(model: ChatterboxTurbo) -> None:
    with pytest.raises(InvalidRequest) as e:
        model.build_prompt("word " * 9000)
    assert e.value.field == "text"


@pytest.mark.parametrize("part", [1, 5, 64])
def test_prefill_in_parts_gives_the_same_tokens(model: ChatterboxTurbo, voice: TurboVoice, part: int) -> None:
    whole = _tokens(model, voice, seed=5)
    prompt = model.build_prompt("Hello there, friend.", voice=voice)
    gen = model.new_generator(prompt, SamplingParams(seed=5), 400)
    parts = 1
    while not gen.prefill_part(part):
        parts += 1
    assert parts > 1 or part == 64
    got = []
    while (t := model.step_many([gen])[0]) is not None:
        got.append(int(t))
    assert got == whole  # equal up to float rounding: the same tokens here


def test_a_tuned_copy_with_the_same_sizes_has_its_own_identity(turbo_model_dir: Path, tmp_path: Path) -> None:
    """A fine-tuned T3 keeps the tokenizer and the byte counts: the identity (audio cache keys, the
    int8 store) must still tell it from the model it was tuned from."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from voxcast.models.chatterbox_turbo.model import _identity

    tuned = Path(shutil.copytree(turbo_model_dir, tmp_path / "tuned"))
    t3 = tuned / "t3_turbo_v1.safetensors"
    state = load_file(str(t3))
    with safe_open(str(t3), framework="pt") as f:
        metadata = f.metadata()
    for name in [k for k in state if k.startswith("tfmr.h.") and k.endswith("weight")]:
        state[name] = state[name] * 1.01  # what a fine-tune changes: every block's matrices
    size = t3.stat().st_size
    save_file(state, str(t3), metadata=metadata)
    assert t3.stat().st_size == size
    assert _identity(tuned) != _identity(turbo_model_dir)
