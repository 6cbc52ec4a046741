"""``voxcast make-test-model``: writes a loadable checkpoint; refuses bad arguments with exit code 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.serving.cli import testmodel as cli_testmodel


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_testmodel.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_writes_a_loadable_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vd"
    args = _parse(["make-test-model", "--kind", "voice_design", "--out", str(out), "--seed", "2"])
    assert args.func(args) == 0
    assert str(out) in capsys.readouterr().out
    model = Qwen3TTS.from_pretrained(str(out))
    assert model.model_type == "voice_design"


def test_refuses_non_empty_folder_and_unreleased_shapes(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x")
    args = _parse(["make-test-model", "--kind", "custom_voice", "--out", str(tmp_path)])
    assert args.func(args) == 2
    args = _parse(
        ["make-test-model", "--kind", "voice_design", "--size", "0.6b", "--out", str(tmp_path / "n")]
    )
    assert args.func(args) == 2


def test_environment_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VOXCAST_TESTMODEL_KIND", "base")
    monkeypatch.setenv("VOXCAST_TESTMODEL_OUT", str(tmp_path / "b"))
    monkeypatch.setenv("VOXCAST_TESTMODEL_SEED", "7")
    args = _parse(["make-test-model"])
    assert (args.kind, args.out, args.seed, args.size) == ("base", str(tmp_path / "b"), 7, "tiny")


def test_cli_choices_match_the_builder() -> None:
    from voxcast.serving.cli import testmodel as cli_testmodel
    from voxcast.testing import qwen3_tts as testing

    # the family's registered test checkpoints (what the CLI offers) are what its builder builds
    qwen = {kind: tc for kind, (f, tc) in cli_testmodel.builders().items() if f.name == "qwen3_tts"}
    assert tuple(qwen) == tuple(testing.KINDS)
    assert all(tuple(tc.sizes) == tuple(testing.SIZES) for tc in qwen.values())


def test_cli_parser_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys; from voxcast.serving.cli.main import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_writes_a_chatterbox_turbo_checkpoint(tmp_path: Path) -> None:
    from voxcast.models.base import LoadOptions
    from voxcast.models.registry import load_model
    from voxcast.testing.chatterbox_turbo import SIZES

    assert set(cli_testmodel.builders()["chatterbox_turbo"][1].sizes) == set(SIZES)
    out = tmp_path / "turbo"
    args = _parse(["make-test-model", "--kind", "chatterbox_turbo", "--out", str(out)])
    assert args.func(args) == 0
    model = load_model(str(out), LoadOptions())
    assert model.model_type == "turbo" and model.speakers == ("default",)
    args = _parse(
        ["make-test-model", "--kind", "chatterbox_turbo", "--size", "0.6b", "--out", str(tmp_path / "x")]
    )
    assert args.func(args) == 2
