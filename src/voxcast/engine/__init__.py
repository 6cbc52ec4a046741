"""The engine: one loaded, warmed model and the scheduler that streams many requests through it.

:mod:`.engine` (``Engine``: lifecycle, idle unload, the public API), :mod:`.scheduler` (the frame
loop: admission, text feed, prefill in parts, step, emit, deliver), :mod:`.warmup` (warm-up and the
decode-thread calibration), :mod:`.config` (``EngineConfig``). Nothing is imported here, so that
importing a submodule stays light.
"""
