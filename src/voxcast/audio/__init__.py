"""Audio post-processing: sample conversion, resampling, WAV/G.711, file encoders, loudness, trimming.

Public entry points: :class:`~voxcast.audio.encode.StreamEncoder` (one response, streamed),
:func:`~voxcast.audio.encode.encode_file` (a complete stored object),
:func:`~voxcast.audio.encode.stream_to_file`, :func:`~voxcast.audio.loudness.normalize_loudness` and
:func:`~voxcast.audio.trim.trim_silence`. Submodules are imported directly; this package imports
nothing heavy by itself.
"""
