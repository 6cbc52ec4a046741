"""Qwen3-TTS-12Hz, written for streaming (no dependency on the official ``qwen-tts`` package).

The engine reaches it only through :mod:`voxcast.models.base` (``family.load`` is registered in
:mod:`voxcast.models.registry`). The package reads like the reference model:

- ``config.py``, ``checkpoint.py``, ``tokenizer.py``: the checkpoint in the official layout;
- ``prompt.py``, ``sampling.py``: prompt layouts and the official sampling order;
- ``layers.py``, ``talker.py``, ``code_predictor.py``, ``kv_cache.py``, ``prefix_cache.py``,
  ``generator.py``: the frame loop (``FrameGenerator``: ``prefill()``, then ``step()`` -> codes [16]
  or None); ``decode_steps.py``: the protocols a faster decode step from ``accel/`` fills in;
- ``codec_*.py``: the speech tokenizer (encoder for references; a stateful streaming decoder whose
  chunks equal a one-pass decode for any chunk schedule);
- ``speaker_encoder.py``, ``mel.py``, ``voice_prompt.py``: cloned voices (safetensors + JSON);
- ``model.py`` (:class:`~voxcast.models.qwen3_tts.model.Qwen3TTS`): the facade the engine drives.

Speed-ups applied to a loaded model live apart in :mod:`voxcast.models.qwen3_tts.accel`.
"""
