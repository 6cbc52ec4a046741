"""``voxcast`` ends bad input and unreachable services with one line on stderr and a documented exit
code, never a traceback, and never prints a password from a URL."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.procs import free_port
from voxcast.logs import RedactingFilter, redact
from voxcast.serving.cli.main import main

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-PASSWORD"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def _unreachable() -> str:
    return f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize("command", [["enqueue", "hi"], ["status", "j1"], ["cancel", "j1"], ["listen", "j1"]])
def test_an_unreachable_redis_is_one_redacted_line(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code, err = _run(capsys, *command, "--redis-url", _unreachable())
    assert code == 1 and "Traceback" not in err and SECRET not in err
    assert err.startswith("error: cannot reach Redis at redis://:***@127.0.0.1:") and err.count("\n") == 1


def test_worker_py_with_a_password_in_its_url_never_prints_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "worker.py"), "--redis-url", _unreachable()],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and SECRET not in proc.stderr + proc.stdout
    assert "cannot reach Redis at redis://:***@" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("extra", "field"),
    [('{"text": ', "request"), ("[1, 2]", "request"), ('{"sampling": 5, "seed": 1}', "sampling")],
)
def test_bad_request_json_is_an_invalid_request(
    capsys: pytest.CaptureFixture[str], redis_url: str, extra: str, field: str
) -> None:
    code, err = _run(capsys, "enqueue", "hi", "--redis-url", redis_url, "--request", extra)
    assert code == 2 and f'"field": "{field}"' in err and "Traceback" not in err


def test_missing_manifest_and_unknown_job(
    capsys: pytest.CaptureFixture[str], redis_url: str, tmp_path: Path
) -> None:
    code, err = _run(
        capsys, "prerender", str(tmp_path / "nope.csv"), "--library", "x", "--redis-url", redis_url
    )
    assert (code, err) == (2, f"error: no such file: {tmp_path / 'nope.csv'}\n")
    code, err = _run(capsys, "cancel", "no-such-job", "--redis-url", redis_url)
    assert code == 1 and err == "error: no job 'no-such-job' (unknown or expired)\n"


def test_a_bad_families_variable_is_one_line_and_help_still_works(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VOXCAST_FAMILIES", "no_such_family_module")
    with pytest.raises(SystemExit) as ended:
        main(["--help"])
    assert ended.value.code == 0 and "make-test-model" in capsys.readouterr().out
    for command in (["make-test-model", "--out", str(tmp_path / "m")], ["synth", "hi", "--out", "a.wav"]):
        code, err = _run(capsys, *command)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith("error: VOXCAST_FAMILIES: model family module 'no_such_family_module'")


def test_log_records_are_redacted() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "connecting to %s", (_unreachable(),), None)
    RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and ":***@127.0.0.1" in record.getMessage()
    try:
        raise ConnectionError(f"failed: https://user:{SECRET}@s3.example.com/bucket")
    except ConnectionError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", None, sys.exc_info())
    RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and "https://user:***@s3.example.com" in record.getMessage()
    assert (
        redact("redis://localhost:6379/0 and redis://h:6379") == "redis://localhost:6379/0 and redis://h:6379"
    )


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gate", "{not json"], "--gate is not JSON"),
        (["--gate", "[1]"], "--gate must be a JSON object"),
        (["--attempts", "0"], '"field": "gate.max_attempts"'),
        (["--gate", '{"max_pause_ms": "long"}'], '"field": "gate.max_pause_ms"'),
    ],
)
def test_bad_gate_options_exit_2_naming_the_setting(
    capsys: pytest.CaptureFixture[str], redis_url: str, tmp_path: Path, flags: list[str], needle: str
) -> None:
    manifest = tmp_path / "p.csv"
    manifest.write_text("id,text\nhi,Hello.\n")
    code, err = _run(capsys, "prerender", str(manifest), "--library", "x", "--redis-url", redis_url, *flags)
    assert code == 2 and needle in err and "Traceback" not in err


def test_every_option_of_every_command_has_help_text() -> None:
    import argparse

    from voxcast.serving.cli.main import build_parser

    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [
        f"{name} {action.dest}"
        for name, command in sub.choices.items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and action.help is None
    ]
    assert sub.choices and not missing, missing


def test_synth_refuses_a_bad_speed_before_loading_a_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = _run(
        capsys,
        "synth",
        "Hi.",
        "--speed",
        "9",
        "--out",
        str(tmp_path / "x.wav"),
        "--model",
        str(tmp_path / "none"),
    )
    assert (code, err) == (2, "error: speed: 9.0 is not a number from 0.25 to 4.0\n")
    assert not (tmp_path / "x.wav").exists()


#: Runs ``voxcast ARGS`` with torch unimportable: a command that imports it before its arguments are
#: checked fails with ImportError instead of its one-line error.
_NO_TORCH = "import sys; sys.modules['torch'] = None\nfrom voxcast.serving.cli.main import main\nsys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--out", "x.mp4"], "cannot tell the format from '.mp4'"),
        (["--out", "nodir/x.wav"], "no such directory"),
        (["--out", "x.wav", "--sample-rate", "12345"], "sample_rate"),
        (["--out", "x.wav", "--speed", "9"], "speed"),
        (["--out", "x.wav", "--model", "no/such/model"], "no/such/model: no such directory"),
        (["--out", "x.wav", "--model", "./missing-model"], "./missing-model: no such directory"),
    ],
)
def test_synth_checks_arguments_paths_and_the_model_before_importing_torch(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """Before: torch (and the model stack) was imported first, so each of these took 10-17 s on a
    loaded host, and a missing model path exited 1 after the import."""
    run = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, "synth", "Hi.", *args], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "VOXCAST_MODEL": str(tmp_path)}, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr and "torch" not in run.stderr


def test_serve_with_a_missing_model_or_a_taken_port_is_one_line_before_binding(tmp_path: Path) -> None:
    """Before: a missing model printed a 32-126-line traceback ending ``Uvicorn running on ...`` and
    exited 1; a port in use logged "listening on ..." and exited 3 (prerender's code)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    port = free_port()
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)]
    for model in (str(tmp_path / "no-such-model"), "Qwen/Not-In-The-Cache"):
        run = subprocess.run([*cmd, "--model", model], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 2, run.stderr
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: model: "), run.stderr
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        run = subprocess.run(
            [*cmd, "--model", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
        )
    assert run.returncode == 4, run.stderr
    assert (
        run.stderr
        == f"error: port {port} on 127.0.0.1 is already in use (another server?): choose another with --port / VOXCAST_PORT\n"
    )
