"""Chatterbox Turbo (Resemble AI): T3, a GPT-2 that turns text into 25 Hz speech tokens, then S3Gen and
HiFT that turn tokens into 24 kHz audio. voxcast's own implementation of the official checkpoint layout
(``t3_turbo_v1.safetensors``, ``s3gen_meanflow.safetensors``, ``ve.safetensors``, tokenizer files).

Each part equals the official chatterbox-tts 0.1.7 on the same weights (tests/parity): T3
(:mod:`.t3`: the GPT-2 backbone, the speaker conditioning, Turbo's sampling), S3Gen's token encoder
(:mod:`.s3gen_encoder`) and flow (:mod:`.s3gen_flow`), the HiFT vocoder (:mod:`.hift`) and its
seamless streaming (:mod:`.hift_stream`), the VoiceEncoder (:mod:`.voice_encoder`), CAMPPlus and the
S3 tokenizer. The engine drives it through :mod:`.model`; :mod:`.family` is registered in
:mod:`voxcast.models.registry` (docs/chatterbox-turbo.md).
"""
