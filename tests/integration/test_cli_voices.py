"""``voxcast voices`` as a user runs it (a subprocess on tiny checkpoints and a local store): the
model's speakers, OpenAI's names mapped to them, the default voice, and registered voices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.fixtures.engines import reference_wav
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.service import Service, ServiceConfig
from voxcast.storage.local import LocalBlobStore

Factory = Callable[[str], Path]
REPO = Path(__file__).resolve().parents[2]


def _voices(model: Path, store: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VOXCAST_STORAGE_DIR": str(store)}
    full |= {"VOXCAST_THREADS": "1", "OMP_NUM_THREADS": "1", **env}  # as the server and worker fixtures
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "voxcast.serving.cli.main",
            "voices",
            "--model",
            str(model),
            "--device",
            "cpu",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
    )


def test_voices_lists_speakers_aliases_and_the_default(tiny_model_dir: Factory, tmp_path: Path) -> None:
    done = _voices(tiny_model_dir("custom_voice"), tmp_path, "--json", VOXCAST_VOICE_ALIASES="support=vivian")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert "ryan" in listing["speakers"] and listing["default_voice"] == "alloy"
    assert listing["aliases"]["alloy"] == "ryan" and listing["aliases"]["support"] == "vivian"
    table = _voices(tiny_model_dir("custom_voice"), tmp_path)
    assert table.returncode == 0 and "alloy" in table.stdout and "-> ryan" in table.stdout


def test_voices_lists_a_base_models_registered_voices(tiny_model_dir: Factory, tmp_path: Path) -> None:
    model = tiny_model_dir("base")
    engine = Engine.load(EngineConfig(model=str(model), device="cpu", warmup=False))
    service = Service.assemble(ServiceConfig(), engine, LocalBlobStore(tmp_path, fsync=False))
    try:
        voice_id = service.register_voice(
            reference_wav(24000, 2.0), "A test voice.", label=("Front desk", None)
        )
    finally:
        service.close()
    done = _voices(model, tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["speakers"] == [] and listing["aliases"] == {} and listing["default_voice"] is None
    assert listing["registered"] == [
        {"voice_id": voice_id, "name": "Front desk", "ref_text": "A test voice."}
    ]
    table = _voices(model, tmp_path)
    assert "none (a Base model: register voices)" in table.stdout and voice_id in table.stdout
