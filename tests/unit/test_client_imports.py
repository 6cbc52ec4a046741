"""The queue client and the ``voxcast`` command's parser import no torch (docs/architecture.md):
a client that only enqueues jobs starts fast and installs without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

_CHECK = """
import sys
import voxcast.serving.rq.client, voxcast.engine.request, voxcast.models.sampling
from voxcast.serving.cli.main import build_parser
build_parser()
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded
"""


def test_the_queue_client_and_the_command_parser_import_no_torch() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_sampling_params_is_one_class_wherever_it_is_imported_from() -> None:
    from voxcast.engine.request import SamplingParams as from_request
    from voxcast.models.base import SamplingParams as from_base
    from voxcast.models.sampling import SamplingParams

    assert from_base is SamplingParams and from_request is SamplingParams
