"""The constants of a loaded checkpoint that the engine keeps while its weights are unloaded."""

from __future__ import annotations

from dataclasses import dataclass, field

from voxcast.models.base import Capabilities, TTSModel, capabilities

__all__ = ["ModelInfo"]


@dataclass(frozen=True)
class ModelInfo:
    """What the engine answers about its model without the model (idle unload keeps only this).

    Attributes:
        model_type: the checkpoint's variant (:attr:`TTSModel.model_type`).
        identity: stable name of the checkpoint's content.
        sample_rate: of the decoded audio (Hz).
        speakers: named speakers (lower case; empty where it has none).
        clones_voices: whether voices can be built from reference audio.
        samples_per_frame: audio samples per generated frame.
        capabilities: the optional parts of the model contract it implements, read once at load.
    """

    model_type: str
    identity: str
    sample_rate: int
    speakers: tuple[str, ...]
    clones_voices: bool
    samples_per_frame: int
    capabilities: Capabilities = field(default_factory=Capabilities)

    @classmethod
    def of(cls, model: TTSModel) -> ModelInfo:
        """The constants of ``model``."""
        return cls(
            model_type=str(model.model_type),
            identity=str(model.identity),
            sample_rate=int(model.sample_rate),
            speakers=tuple(model.speakers),
            clones_voices=bool(model.clones_voices),
            samples_per_frame=int(model.samples_per_frame),
            capabilities=capabilities(model),
        )
