"""Chatterbox Turbo (Resemble AI): T3, a GPT-2 that turns text into 25 Hz speech tokens, then S3Gen and
HiFT that turn tokens into 24 kHz audio. voxcast's own implementation of the official checkpoint layout
(``t3_turbo_v1.safetensors``, ``s3gen_meanflow.safetensors``, ``ve.safetensors``, tokenizer files).

So far: T3 (:mod:`.t3`: the GPT-2 backbone, the speaker conditioning, Turbo's sampling), token for token
the official ``T3.inference_turbo`` on the same weights (tests/parity). S3Gen, HiFT, the voice encoders
and the engine adapter come next (issue 32).
"""
