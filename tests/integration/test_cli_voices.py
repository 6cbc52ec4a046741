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


def _voices(model: Path, store: Path, *flags: str, **env: str) -> subprocess.Popen[str]:
    """``voxcast voices`` started (not waited for: a test starts its runs together, see :func:`_done`)."""
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VOXCAST_STORAGE_DIR": str(store)}
    full |= {"VOXCAST_THREADS": "1", "OMP_NUM_THREADS": "1", **env}  # as the server and worker fixtures
    return subprocess.Popen(
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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )


def _done(*procs: subprocess.Popen[str]) -> list[subprocess.CompletedProcess[str]]:
    """Each run's result, once it exited (the runs only read the store, so they may overlap)."""
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def test_voices_lists_speakers_aliases_and_the_default(tiny_model_dir: Factory, tmp_path: Path) -> None:
    done, table = _done(
        _voices(tiny_model_dir("custom_voice"), tmp_path, "--json", VOXCAST_VOICE_ALIASES="support=vivian"),
        _voices(tiny_model_dir("custom_voice"), tmp_path),
    )
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert "ryan" in listing["speakers"] and listing["default_voice"] == "alloy"
    assert listing["aliases"]["alloy"] == "ryan" and listing["aliases"]["support"] == "vivian"
    assert table.returncode == 0 and "alloy" in table.stdout and "-> ryan" in table.stdout


def test_voices_names_turbos_built_in_voice_as_its_default(turbo_model_dir: Path, tmp_path: Path) -> None:
    """Before: "default voice: none" while Turbo's voice-less requests speak its built-in voice."""
    done, table = _done(_voices(turbo_model_dir, tmp_path, "--json"), _voices(turbo_model_dir, tmp_path))
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["default_voice"] is None and listing["builtin_voice"] is True
    assert table.returncode == 0, table.stderr
    assert "default voice: the checkpoint's built-in voice" in table.stdout


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
    done, table = _done(_voices(model, tmp_path, "--json"), _voices(model, tmp_path))
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["speakers"] == [] and listing["aliases"] == {} and listing["default_voice"] is None
    assert listing["registered"] == [
        {"voice_id": voice_id, "name": "Front desk", "ref_text": "A test voice."}
    ]
    assert table.returncode == 0, table.stderr
    assert "none (a Base model: register voices)" in table.stdout and voice_id in table.stdout
