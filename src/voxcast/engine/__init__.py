"""The engine: one loaded, warmed model and the scheduler that streams many requests through it.

:mod:`.engine` (``Engine``: lifecycle, idle unload, the public API), :mod:`.scheduler` (the frame
loop: admission, prefill in parts, pacing, step) with its collaborators :mod:`.text_intake` (text
fed in pieces), :mod:`.pieces` (long texts' pieces) and :mod:`.delivery` (emit, decode, deliver),
:mod:`.warmup` (warm-up and the decode-thread calibration), :mod:`.config` (``EngineConfig``).
Nothing is imported here, so that importing a submodule stays light.
"""
