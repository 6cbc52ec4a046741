"""The layering rule: engine and model code never import the serving or cloud libraries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "voxcast"
FORBIDDEN = ("runpod", "rq", "boto3", "botocore", "redis")


def test_engine_and_models_import_no_serving_library() -> None:
    code = (
        "import sys, voxcast.engine.engine, voxcast.engine.warmup, voxcast.models.qwen3_tts.model\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_only_serving_imports_runpod_and_rq_only_storage_imports_boto3() -> None:
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        text = path.read_text()
        for lib in ("runpod", "rq"):
            if f"import {lib}" in text or f"from {lib} " in text or f"from {lib}." in text:
                assert rel.startswith("serving/"), f"{rel} imports {lib}"
        if (
            "import boto3" in text
            or "from boto3" in text
            or "import botocore" in text
            or "from botocore" in text
        ):
            assert rel.startswith("storage/"), f"{rel} imports boto3"
