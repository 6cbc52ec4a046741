"""Qwen3-TTS-12Hz, written for streaming (no dependency on the official ``qwen-tts`` package).

Public surface (used by :mod:`voxcast.engine`):

- :class:`Qwen3TTS` (``model.py``): ``Qwen3TTS.from_pretrained(dir_or_hub_id, device=, dtype=)``;
  attributes ``model_type`` ("base" | "custom_voice" | "voice_design"), ``identity`` (stable string
  naming the checkpoint, for cache keys), ``speakers``, ``languages``, ``sample_rate`` (24000),
  ``samples_per_frame`` (1920); methods ``make_voice_prompt``, ``build_prompt``, ``new_generator``,
  ``new_decoder``.
- :class:`VoicePrompt` (``voice_prompt.py``): per-voice constant data, safetensors + JSON.
- ``FrameGenerator`` (``generator.py``): ``prefill()``, then ``step()`` -> codes of one frame
  (LongTensor [16]) or ``None`` at the end; ``finish_reason`` is "eos" or "max_frames".
- ``StreamingDecoder`` (``codec_decoder.py``): ``decode(codes [T, 16]) -> float32 [T * 1920]``,
  exact against a one-pass decode for any chunk schedule.
"""
