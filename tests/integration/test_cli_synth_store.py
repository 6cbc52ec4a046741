"""``voxcast synth`` stores nothing of its own (it writes ``--out``): a seeded request is cacheable,
but one that runs to its derived frame limit (a runaway) is never cached, and then must not land
under ``renders/`` either, as it did (``persist = s._store or key is not None``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.models import TinyModelFactory
from voxcast.serving.cli.main import main


def test_a_seeded_synth_that_runs_to_its_frame_limit_stores_nothing(
    capsys: pytest.CaptureFixture[str],
    tiny_model_dir: TinyModelFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv("VOXCAST_STORAGE_DIR", str(store))
    model = str(tiny_model_dir("custom_voice"))
    out = tmp_path / "x.wav"
    assert main(["synth", "Hi.", "--model", model, "--voice", "ryan", "--seed", "3", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["timing"]["runaway"], "the tiny random model should run to its derived limit"
    assert result["audio_key"] is None and out.stat().st_size > 44
    # neither a render nor a cache entry (seeded: a cached runaway would be under audio/)
    assert not [p for p in store.rglob("*") if p.is_file() and {"renders", "audio"} & set(p.parts)]
