"""The toy family's registration: ``FAMILY`` (loader, its settings, its test checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

from voxcast.models.base import LoadOptions, ModelFamily, Setting, TestCheckpoints, TTSModel, int_in

__all__ = [
    "FAMILY",
    "MODULE",
    "PITCHES",
    "SAMPLES_PER_FRAME",
    "SAMPLE_RATE",
    "held_env",
    "load",
    "make_checkpoint",
]

MODULE = __name__
"""What ``registry.register`` and ``VOXCAST_FAMILIES`` take."""

SAMPLE_RATE = 16000  # not the 24 kHz of both real families: the service resamples
SAMPLES_PER_FRAME = 1280  # 12.5 frames a second
PITCHES = {"low": 220.0, "high": 330.0}


def load(root: Path, options: LoadOptions) -> TTSModel:
    from tests.toy_family.model import SineModel

    return SineModel(root, options)


def held_env(hold: Path) -> dict[str, str]:
    """The environment of a process serving the toy family whose streams get no frame after their
    first while the file ``hold`` exists (``toy_hold``)."""
    return {"VOXCAST_FAMILIES": MODULE, "VOXCAST_TOY_HOLD": str(hold)}


def make_checkpoint(
    out: Path, kind: str, size: str = "tiny", seed: int = 0, *, ends_speech: bool = False
) -> Path:
    """Write a toy checkpoint (a ``config.json``) into ``out``; the same whatever ``seed``."""
    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} exists and is not an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "toy_sine", "sample_rate": SAMPLE_RATE, "samples_per_frame": SAMPLES_PER_FRAME}
    (folder / "config.json").write_text(json.dumps({**config, "speakers": PITCHES}))
    return folder


FAMILY = ModelFamily(
    name="toy_sine",
    load=load,
    settings=(
        Setting("toy_amplitude", "VOXCAST_TOY_AMPLITUDE", int_in(1, 100), default=30, doc="percent"),
        Setting(
            "toy_step_ms",
            "VOXCAST_TOY_STEP_MS",
            int_in(0, 1000),
            default=0,
            doc="ms a batched step sleeps per row: a slow model for admission-control tests",
        ),
        Setting(
            "toy_hold",
            "VOXCAST_TOY_HOLD",
            str,
            default="",
            doc="a file: while it exists, no stream gets a frame after its first (a test holds the model)",
        ),
    ),
    test_checkpoints=TestCheckpoints(
        kinds=("toy_sine",),
        sizes=("tiny",),
        builder="tests.toy_family.family:make_checkpoint",
        sources=("tests.toy_family.family", "tests.toy_family.model"),
    ),
)
