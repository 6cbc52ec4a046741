"""Identity of a library's renders: key layout, render hash and manifest schema (pure functions).

Shared by the planner (:mod:`~voxcast.prerender.plan`), the renderer and the library job
(:mod:`~voxcast.prerender.library`, which re-exports these names).
"""

from __future__ import annotations

from typing import Any

from voxcast.audio.stretch import METHOD as STRETCH_METHOD
from voxcast.errors import InvalidRequest
from voxcast.prerender.gate import GateSettings
from voxcast.prerender.manifest import NAME_RE, Prompt
from voxcast.prerender.presets import PostProcess, Preset
from voxcast.storage.keys import canonical_json, sha256_hex, validate_key

__all__ = ["MANIFEST_SCHEMA", "library_prefix", "object_key", "render_hash"]

MANIFEST_SCHEMA = 2
"""Version of the output manifest layout and of the render-hash recipe (2: loudness set and measured
per preset file, quality gate; libraries of schema 1 are rendered again)."""


def library_prefix(library: str) -> str:
    """``libraries/<library>/`` (validated)."""
    if not isinstance(library, str) or not NAME_RE.match(library):
        raise InvalidRequest(f"library name must match {NAME_RE.pattern}", field="library")
    return f"libraries/{library}/"


def render_hash(
    model_identity: str, prompt: Prompt, post: PostProcess, gate: GateSettings, watermark: str | None = None
) -> str:
    """Identity of one prompt's rendering (see the module docstring); ``watermark``: the one put
    on the files, if any."""
    recipe: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "model": model_identity,
        "prompt": prompt.fields,
        "post": post.to_dict(),
        "gate": gate.to_dict(),
    }
    if watermark is not None:
        recipe["watermark"] = watermark
    if prompt.request.speed != 1.0:
        recipe["stretch"] = STRETCH_METHOD
    return sha256_hex(canonical_json(recipe))


def object_key(prefix: str, preset: Preset, prompt_id: str) -> str:
    return validate_key(f"{prefix}{preset.name}/{prompt_id}.{preset.extension}")
