"""The README's and docs' code blocks, run as printed (see ``blocks.py`` for which and how).

Every ``python`` / ``bash`` block runs unless a ``<!-- docs-test: skip (why) -->`` marker says why it
cannot (GPU, network, Docker, a process that runs until stopped). Tiny random-weight checkpoints stand
in for the hub ids; a doc's blocks share one working directory (holding ``me.wav`` and ``ref.wav``,
speech-shaped references) and, where they need one, one server: ``docs/http.md`` runs against a
``voxcast serve`` process, ``docs/queue.md`` against a real redis-server and an RQ worker. Python
blocks run in this process (one PyTorch import for all); shell blocks in ``bash -euo pipefail`` with
the stand-ins of :data:`PRELUDE`. docs/development.md ("How docs are tested") lists the blocks run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tests.docs.blocks import CHECKPOINT_NAMES, REPO, Block, checkpoint_kind, doc_files, read_blocks
from tests.fixtures.procs import free_port, stop_process

pytestmark = pytest.mark.slow

PRELUDE = """
python() { "$DOCS_PYTHON" "$@"; }
voxcast() { "$DOCS_PYTHON" -m voxcast.serving.cli.main "$@"; }
pip() { echo "docs-test: 'pip $*' not run (the package is installed)" >&2; }
llm() { printf 'Hello there, how are you today?'; }   # an LLM writing a reply
aplay() { cat > /dev/null; }                          # a player: takes the audio
"""
"""Shell stand-ins: the repository's interpreter and CLI, and the commands a reader has that a test
machine does not (``pip install`` of what is installed, an LLM, a player)."""


def _runnable() -> list[Block]:
    """Every block that runs, each text once (the engine page repeats the README's example)."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    out = []
    for path in doc_files():
        for block in read_blocks(path):
            key = (block.source, tuple(sorted(block.env.items())))
            if block.runs and key not in seen:
                seen.add(key)
                out.append(block)
    return out


BLOCKS = _runnable()


class DocWorld:
    """What the blocks of the docs run with: a working directory, the tiny checkpoints standing in for
    hub ids, an environment, and (started on first use, stopped at the end) an HTTP server and an RQ
    worker."""

    def __init__(self, work: Path, models: dict[str, Path], redis_url: Callable[[], str]) -> None:
        self.work, self.models, self._redis_url = work, models, redis_url
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
            "DOCS_PYTHON": sys.executable,
            "VOXCAST_MODEL": str(models["custom_voice"]),
            "VOXCAST_STORAGE_DIR": str(work / "store"),
            "VOXCAST_WARMUP": "0",
            "VOXCAST_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
        }
        self._server: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._worker: Any = None

    def substitute(self, text: str) -> str:
        # what examples write under /tmp stays in the test's folder (before the model paths go in:
        # a checkout under /tmp puts " /tmp/" in them too)
        text = text.replace(" /tmp/", f" {self.work}/")
        text = CHECKPOINT_NAMES.sub(lambda name: str(self.models[checkpoint_kind(name)]), text)
        if self._port:
            text = text.replace("127.0.0.1:8000", f"127.0.0.1:{self._port}")
            text = text.replace("localhost:8000", f"127.0.0.1:{self._port}")
        return text

    def prepare(self, block: Block) -> tuple[str, dict[str, str]]:
        """The block's text and environment, with what its page needs running."""
        env = dict(self.env)
        if block.path.name == "http.md":
            self._start_server()
        if block.path.name == "queue.md":
            env["VOXCAST_REDIS_URL"] = self._start_worker()
        env.update({k: self.substitute(v) for k, v in block.env.items()})
        return self.substitute(block.source), env

    def _start_server(self) -> None:
        if self._server is not None:
            return
        self._port = free_port()
        log = (self.work / "serve.log").open("wb")
        cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(self._port)]
        self._server = subprocess.Popen(
            cmd, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self._port}/ping", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert self._server.poll() is None, (self.work / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "voxcast serve did not become ready"
            time.sleep(0.2)

    def _start_worker(self) -> str:
        url = self._redis_url()
        if self._worker is None:
            import redis

            from tests.fixtures.rq_worker import WorkerProcess

            self._worker = WorkerProcess(
                url,
                self.models["custom_voice"],
                self.work / "store",
                self.work / "worker.log",
                "voxcast",
                self.env,
            )
            self._worker.wait_ready(redis.Redis.from_url(url))
        return url

    def close(self) -> None:
        if self._server is not None:
            stop_process(self._server)
        if self._worker is not None:
            self._worker.stop()


@pytest.fixture(scope="module")
def world(
    tiny_model_dir: Callable[..., Path], turbo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[DocWorld]:  # fmt: skip
    work = tmp_path_factory.mktemp("docs")
    for name in ("me.wav", "ref.wav"):  # the references the examples clone from
        sf.write(work / name, np.concatenate([np.zeros(2400), _speech(6.0)]), 24000, subtype="PCM_16")
    for name in ("handler.py", "worker.py", "server.py", "test_input.json"):
        (work / name).symlink_to(REPO / name)
    models = {"custom_voice": tiny_model_dir("custom_voice"), "base": tiny_model_dir("base")}
    models["chatterbox_turbo"] = turbo_model_dir

    def redis_url() -> str:
        return str(request.getfixturevalue("redis_server").url)

    w = DocWorld(work, models, redis_url)
    try:
        yield w
    finally:
        w.close()


def _speech(seconds: float) -> np.ndarray:
    from voxcast.testing.signals import speech_like

    return speech_like(seconds, 24000, level=0.1)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs_as_printed(block: Block, world: DocWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    source, env = world.prepare(block)
    if block.lang == "python":
        monkeypatch.chdir(world.work)
        for key, value in env.items():
            if os.environ.get(key) != value:
                monkeypatch.setenv(key, value)
        exec(compile(source, block.name, "exec"), {"__name__": "__docs__"})  # our own docs, as printed
        return
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", PRELUDE + source],
        cwd=world.work,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stderr.decode()[-4000:]}"


def test_markers_are_well_formed_and_name_a_reason() -> None:
    """A marker is ``skip (why)`` or ``env NAME=value``; every skipped block says why."""
    for path in doc_files():
        for block in read_blocks(path):  # raises on a malformed marker
            assert block.skip is None or len(block.skip) > 10, f"{block.name}: say why it is skipped"


def test_every_doc_path_named_in_the_code_and_docs_exists() -> None:
    """``docs/<page>.md`` in help texts, docstrings and pages, and relative links, point at files."""
    import re

    texts = [(p, p.read_text()) for p in (*doc_files(), *sorted((REPO / "src").rglob("*.py")))]
    missing = []
    for path, text in texts:
        for name in re.findall(r"\bdocs/[\w./-]+\.md\b", text):
            if not (REPO / name).is_file():
                missing.append(f"{path.relative_to(REPO)}: {name}")
        if path.suffix == ".md":
            for link in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)", text):
                if not (path.parent / link).is_file():
                    missing.append(f"{path.relative_to(REPO)}: {link}")
    assert not missing, missing
