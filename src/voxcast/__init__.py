"""voxcast: streaming neural text-to-speech serving.

The public surface::

    from voxcast import Engine, EngineConfig

    engine = Engine.load(EngineConfig(model="path/or/hub-id"))
    stream = engine.synthesize({"text": "Hello", "voice": "ryan"})   # lazy: nothing runs yet
    for chunk in stream:                                             # AudioChunk
        ...
    stream.timing.to_dict()

:class:`Service` adds storage, the voice registry and the rendered-audio cache around an engine (what
the RunPod handler, the RQ worker and the CLI use). Names are imported on first use, so ``import
voxcast`` stays light (no PyTorch until an engine is needed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from voxcast.errors import InvalidRequest, VoxcastError

if TYPE_CHECKING:
    from voxcast.engine.chunks import AudioChunk
    from voxcast.engine.config import EngineConfig
    from voxcast.engine.engine import Engine
    from voxcast.engine.request import SamplingParams, SynthesisRequest
    from voxcast.engine.stream import SynthesisStream
    from voxcast.engine.timing import Timing
    from voxcast.service import Service, ServiceConfig

__all__ = [
    "AudioChunk",
    "Engine",
    "EngineConfig",
    "InvalidRequest",
    "SamplingParams",
    "Service",
    "ServiceConfig",
    "SynthesisRequest",
    "SynthesisStream",
    "Timing",
    "VoxcastError",
]
__version__ = "0.1.0"

_LAZY = {
    "AudioChunk": "voxcast.engine.chunks",
    "Engine": "voxcast.engine.engine",
    "EngineConfig": "voxcast.engine.config",
    "SamplingParams": "voxcast.engine.request",
    "Service": "voxcast.service",
    "ServiceConfig": "voxcast.service",
    "SynthesisRequest": "voxcast.engine.request",
    "SynthesisStream": "voxcast.engine.stream",
    "Timing": "voxcast.engine.timing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'voxcast' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
