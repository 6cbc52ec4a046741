"""Queue commands of ``voxcast``: worker, enqueue, listen, status, cancel, register-voice, prerender.

Every option that has a ``VOXCAST_*`` variable defaults to it (see :class:`QueueConfig` and
:class:`~voxcast.service.ServiceConfig`); a flag overrides it for this process.

::

    voxcast worker --queues voxcast --redis-url redis://127.0.0.1:6379/0
    voxcast enqueue "Thanks for calling." --voice vivian --format mulaw --sample-rate 8000 --follow --out hi.wav
    voxcast listen JOB_ID --out hi.wav          # replay a stream from its start
    voxcast prerender prompts.csv --library acme --presets mulaw8k,alaw8k,mp3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import redis

from voxcast.audio.files import OutputFile, output_file
from voxcast.audio.formats import NATIVE_SAMPLE_RATE, AudioFormat
from voxcast.errors import InvalidRequest, VoxcastError
from voxcast.logs import redact
from voxcast.serving.cli.errors import CommandError, describe, exit_code_of, with_field
from voxcast.serving.cli.request_flag import add_request_flag, request_fields
from voxcast.serving.exit import ends_process
from voxcast.serving.rq.config import QueueConfig
from voxcast.serving.rq.stream import EntryType, StreamEntry, StreamTimeout

__all__ = ["add_parsers", "worker_main"]

log = logging.getLogger(__name__)

_MODEL_FLAGS = (("model", "VOXCAST_MODEL"), ("device", "VOXCAST_DEVICE"), ("dtype", "VOXCAST_DTYPE"))


def add_parsers(sub: Any) -> None:
    """Register the queue subcommands on ``voxcast``'s subparsers."""
    p = sub.add_parser("worker", help="run an RQ worker (loads and warms the model first)")
    add_worker_arguments(p)
    p.set_defaults(func=run_worker)

    p = sub.add_parser("enqueue", help="enqueue a synthesis job (optionally follow its stream)")
    _redis_args(p)
    p.add_argument("text", help="text to speak")
    p.add_argument("--voice", help="CustomVoice speaker or a registered voice id (vx_...)")
    p.add_argument("--language", help="language name or auto (default auto)")
    p.add_argument("--instruct", help="style instruction / voice description")
    p.add_argument(
        "--format", help="response format (default: --out's extension, else wav; with --out they must agree)"
    )
    p.add_argument(
        "--sample-rate",
        type=int,
        help="output rate in Hz (default: --out's extension's, e.g. .ulaw 8000; else 24000)",
    )
    p.add_argument(
        "--seed", type=int, help="sampling seed: the same seed gives the same audio (and cacheable)"
    )
    p.add_argument("--greedy", action="store_true", help="greedy decoding (deterministic, cacheable)")
    p.add_argument("--max-frames", type=int, help="frame limit (12.5 frames a second)")
    p.add_argument("--no-cache", action="store_true", help="do not read or fill the audio cache")
    add_request_flag(p)
    p.add_argument("--queue", help="queue name (default: the first of VOXCAST_QUEUES)")
    p.add_argument("--follow", action="store_true", help="read the stream as it grows")
    p.add_argument(
        "--out",
        type=Path,
        help="write the audio here (implies --follow); the extension picks the format as for synth "
        "(.wav .mp3 .flac .opus .aac .pcm, Asterisk's raw .ulaw .alaw .sln .sln16 ...)",
    )
    _idle_timeout_arg(p)
    p.set_defaults(func=run_enqueue)

    p = sub.add_parser("listen", help="replay a job's stream from the start (then follow it live)")
    _redis_args(p)
    p.add_argument("job_id", help="the job id enqueue printed")
    p.add_argument("--out", type=Path, help="write the audio here")
    _idle_timeout_arg(p)
    p.set_defaults(func=run_listen)

    p = sub.add_parser("status", help="print a job's status, meta and result")
    _redis_args(p)
    p.add_argument("job_id", help="the job id enqueue printed")
    p.set_defaults(func=run_status)

    p = sub.add_parser("workers", help="list the workers on the queues, with their state (JSON)")
    _redis_args(p)
    p.set_defaults(func=run_workers)

    p = sub.add_parser("cancel", help="cancel a queued or running job")
    _redis_args(p)
    p.add_argument("job_id", help="the job to cancel")
    p.set_defaults(func=run_cancel)

    p = sub.add_parser("register-voice", help="enqueue a voice registration from reference audio")
    _redis_args(p)
    p.add_argument("audio", type=Path, help="reference recording (WAV, FLAC, MP3, OGG...; 1-30 s)")
    p.add_argument("--ref-text", help="transcript of the recording (in-context cloning)")
    p.add_argument(
        "--x-vector-only", action="store_true", help="clone from the speaker vector only (no transcript)"
    )
    p.add_argument("--queue", help="queue name (default: the first of VOXCAST_QUEUES)")
    p.set_defaults(func=run_register_voice)

    p = sub.add_parser("prerender", help="render a prompt library from a manifest (CSV/JSON/YAML)")
    _redis_args(p)
    p.add_argument("manifest", type=Path, help="the prompts: CSV, JSON or YAML (id and text per row)")
    p.add_argument("--library", required=True, help="library name: objects go under libraries/<name>/")
    p.add_argument(
        "--presets", help="comma-separated presets (default: mulaw8k,alaw8k,pcm8k,pcm16k,wav24k,mp3)"
    )
    p.add_argument("--loudness", type=float, help="target LUFS (default -19)")
    p.add_argument("--peak", type=float, help="true-peak ceiling, dBTP (default -1)")
    p.add_argument("--pad-ms", type=float, help="silence kept around speech (default 100)")
    p.add_argument("--no-trim", action="store_true", help="keep leading and trailing silence")
    p.add_argument("--voice", help="default voice for rows without one")
    p.add_argument("--language", help="default language for rows without one")
    p.add_argument("--force", action="store_true", help="re-render prompts that are already done")
    p.add_argument(
        "--attempts", type=int, help="renders per prompt before it fails the quality gate (default 3)"
    )
    p.add_argument(
        "--gate",
        help='quality-gate settings as JSON, e.g. \'{"chars_per_s": [4, 20], "max_pause_ms": 1000}\' '
        '(docs/queue.md, "Prerendering prompt libraries")',
    )
    p.add_argument("--no-gate", action="store_true", help="store every render without checking it")
    p.add_argument(
        "--in-flight",
        type=int,
        help="prompts each worker renders at once (default: its VOXCAST_MAX_ACTIVE; never more)",
    )
    p.add_argument("--chunk-prompts", type=int, help="prompts per chunk job (default 32)")
    p.add_argument("--queue", help="queue name (default: the first of VOXCAST_QUEUES)")
    p.add_argument("--no-wait", action="store_true", help="print the job id and return")
    p.set_defaults(func=run_prerender)


def _gate(args: argparse.Namespace) -> Any:
    if args.no_gate:
        return False
    gate: dict[str, Any] = {}
    if args.gate:
        try:
            gate = json.loads(args.gate)
        except ValueError as e:
            raise CommandError(f"--gate is not JSON: {e}", code=2) from e
        if not isinstance(gate, dict):
            raise CommandError("--gate must be a JSON object", code=2)
    if args.attempts is not None:
        gate["max_attempts"] = args.attempts
    return gate or None


def _idle_timeout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--idle-timeout",
        type=float,
        help="give up after this many seconds without a stream entry, saying why (no worker serves the "
        "queue, or the job's status); default VOXCAST_FOLLOW_IDLE_TIMEOUT_S or 120",
    )


def _redis_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", help="Redis URL (default: VOXCAST_REDIS_URL or redis://127.0.0.1:6379/0)")


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``voxcast worker`` (also used by the root ``worker.py``)."""
    _redis_args(p)
    p.add_argument("--queues", help="comma-separated queues, highest priority first (VOXCAST_QUEUES)")
    p.add_argument("--name", help="worker name (default: RQ's)")
    p.add_argument("--burst", action="store_true", help="quit when the queues are empty")
    p.add_argument("--max-jobs", type=int, help="quit after this many jobs")
    p.add_argument("--worker-ttl", type=int, help="VOXCAST_WORKER_TTL_S (default 30)")
    p.add_argument("--maintenance-interval", type=int, help="VOXCAST_MAINTENANCE_INTERVAL_S (default 15)")
    p.add_argument("--job-heartbeat-ttl", type=int, help="VOXCAST_JOB_HEARTBEAT_TTL_S (default 30)")
    p.add_argument("--model", help="VOXCAST_MODEL")
    p.add_argument("--device", help="VOXCAST_DEVICE")
    p.add_argument("--dtype", help="VOXCAST_DTYPE")


def _config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> QueueConfig:
    config = QueueConfig.from_env(os.environ if env is None else env)
    queues = getattr(args, "queues", None)
    return config.with_overrides(
        redis_url=getattr(args, "redis_url", None),
        queues=tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None,
        worker_ttl_s=getattr(args, "worker_ttl", None),
        maintenance_interval_s=getattr(args, "maintenance_interval", None),
        heartbeat_ttl_s=getattr(args, "job_heartbeat_ttl", None),
    )


def _client(args: argparse.Namespace) -> Any:
    from voxcast.serving.rq.client import QueueClient

    config = _config(args)
    _reachable(config.redis_url)
    return QueueClient.connect(config)


def _reachable(url: str, timeout_s: float = 3.0) -> None:
    """One ping without retries: an unreachable Redis is an error in seconds, not after the
    client's whole retry budget. Raises CommandError (exit 1)."""
    probe = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=None)
    try:
        probe.ping()
    except redis.RedisError as e:
        raise CommandError(f"cannot reach Redis at {redact(url)}: {e}") from e
    finally:
        probe.close()


# -- worker ------------------------------------------------------------------------------------------
@ends_process
def run_worker(args: argparse.Namespace) -> int:
    """Load the service, then serve jobs until stopped (SIGTERM/SIGINT: warm shutdown)."""
    from voxcast.serving.rq.config import connect
    from voxcast.serving.rq.worker import VoxcastWorker, worker_service_config

    env = dict(os.environ)
    for flag, name in _MODEL_FLAGS:
        if getattr(args, flag, None):
            env[name] = getattr(args, flag)
    config = _config(args, env)
    _reachable(config.redis_url)  # fail fast, before minutes of model loading
    connection = connect(config)
    worker = VoxcastWorker(
        list(config.queues),
        connection=connection,
        name=args.name,
        queue_config=config,
        service_config=worker_service_config(env),
    )
    try:
        worker.work(burst=args.burst, max_jobs=args.max_jobs, logging_level=None)
    except VoxcastError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 1
    return 0


def worker_main(argv: Sequence[str] | None = None) -> int:
    """``python worker.py [flags]``: the same as ``voxcast worker [flags]``."""
    parser = argparse.ArgumentParser(prog="worker.py", description="voxcast RQ worker")
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_worker(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        code, message = describe(e)
        log.debug("worker failed", exc_info=True)
        print(f"error: {redact(message)}", file=sys.stderr)
        return code


# -- enqueue / listen ----------------------------------------------------------------------------------
def _request(args: argparse.Namespace, out: OutputFile) -> dict[str, Any]:
    req: dict[str, Any] = {
        "text": args.text,
        "response_format": out.format.value,
        "sample_rate": out.sample_rate,
        "cache": not args.no_cache,
    }
    for key in ("voice", "language", "instruct", "seed", "max_frames"):
        if getattr(args, key) is not None:
            req[key] = getattr(args, key)
    if args.greedy:
        req["greedy"] = True
    req.update(request_fields(args.request))
    return req


def _output(args: argparse.Namespace) -> OutputFile:
    """The format and rate to request: from ``--out`` (its extension, checked against ``--format`` and
    ``--sample-rate``; its directory must exist) or the flags alone."""
    if args.out is None:
        fmt = args.format or "wav"
        try:
            return OutputFile(AudioFormat(fmt), args.sample_rate or NATIVE_SAMPLE_RATE)
        except ValueError as e:
            raise InvalidRequest(f"unknown format {fmt!r}", field="format") from e
    if not args.out.parent.is_dir():
        raise InvalidRequest(f"no such directory: {args.out.parent}", field="out")
    return output_file(args.out, args.format, args.sample_rate)


def run_enqueue(args: argparse.Namespace) -> int:
    try:
        out = _output(args)  # a bad --out is refused before Redis is asked anything
    except VoxcastError as e:
        print(json.dumps({"error": e.to_dict()}), file=sys.stderr)
        return 2
    client = _client(args)
    try:
        t0 = time.time()
        submitted = client.submit(_request(args, out), queue=args.queue)
    except VoxcastError as e:
        print(json.dumps({"error": e.to_dict()}), file=sys.stderr)
        return 2
    job_id = submitted.job_id
    if not submitted.created:
        print(
            f"job {job_id} already exists for this identical request: nothing new was enqueued "
            f"(status: {client.status(job_id)['status']})",
            file=sys.stderr,
        )
    following = bool(args.follow or args.out)
    # stdout is one thing a script can read: the job id alone, or (following) the result's JSON
    print(job_id, file=sys.stderr if following else sys.stdout, flush=True)
    if not following:
        return 0
    return _follow(client, job_id, args.out, t0=t0, idle_timeout_s=args.idle_timeout)


def run_listen(args: argparse.Namespace) -> int:
    client = _client(args)
    if not client.exists(args.job_id):
        raise CommandError(f"no such job {args.job_id!r} (unknown or expired)")
    return _follow(client, args.job_id, args.out, idle_timeout_s=args.idle_timeout)


def _warn_if_unserved(client: Any, job_id: str, idle_timeout_s: float) -> None:
    queue = client.unserved_queue(job_id)
    if queue is not None:
        print(
            f"waiting: no worker serves queue {queue!r} (start one: voxcast worker --queues {queue}); "
            f"giving up after {idle_timeout_s:g} s without news",
            file=sys.stderr,
            flush=True,
        )


def _follow(
    client: Any,
    job_id: str,
    out: Path | None,
    *,
    t0: float | None = None,
    idle_timeout_s: float | None = None,
) -> int:
    """Print every chunk as it arrives, write the audio, print the result. Exit 0 on ``eos``; 2 when
    the job ended with an error that blames the input; 1 otherwise (also when nothing arrives within
    ``idle_timeout_s``, default the config's, naming the reason: no worker serves the queue)."""
    from voxcast.serving.rq.client import StreamCapture

    idle = idle_timeout_s if idle_timeout_s is not None else client.config.follow_idle_timeout_s
    _warn_if_unserved(client, job_id, idle)
    capture = StreamCapture()
    try:
        for entry in client.follow(job_id, idle_timeout_s=idle):
            capture.add(entry)
            _print_entry(entry, t0 if t0 is not None else capture.first_received_ts or entry.received_ts)
    except StreamTimeout as e:
        queue = client.unserved_queue(job_id)
        if queue is not None:
            raise CommandError(
                f"job {job_id} still queued after {idle:g} s: no worker serves queue {queue!r} "
                f"(start one: voxcast worker --queues {queue})"
            ) from e
        raise CommandError(f"{e} (job status: {client.status(job_id)['status']})") from e
    if out is not None and capture.chunks:
        _write_audio(out, capture)
    shown = {"job_id": job_id, "status": capture.status, **capture.result}
    print(json.dumps(shown, indent=2, default=str))
    if capture.gaps:
        raise CommandError(_incomplete(capture, out))
    if capture.status == EntryType.EOS.value:
        return 0
    return exit_code_of(capture.result if capture.status == EntryType.ERROR.value else None)


def _incomplete(capture: Any, out: Path | None) -> str:
    """The error of a followed stream that lost chunks (trimmed, or its start lost with a Redis
    restart): how many, and what was written."""
    expected = capture.result.get("chunks") if capture.status == EntryType.EOS.value else None
    of = f" of {expected}" if isinstance(expected, int) else ""
    lost = "its start" if (capture.chunks[0].seq or 0) > 0 else "chunks in the middle"
    wrote = f"; {out} holds the {len(capture.chunks)} chunks that were there" if out is not None else ""
    return f"the stream is incomplete: {capture.gaps}{of} chunks missing (it lost {lost}){wrote}"


def _print_entry(e: StreamEntry, t0: float, file: TextIO = sys.stderr) -> None:
    at_ms = (e.received_ts - t0) * 1000
    if e.type is EntryType.CHUNK:
        lat = (e.received_ts - e.ts) * 1000
        print(
            f"chunk {e.seq:4d}  at {at_ms:8.1f} ms  engine t {e.t_ms or 0:8.1f} ms  "
            f"{len(e.audio):7d} B  {e.frames or 0:3d} frames  since publish {lat:7.2f} ms",
            file=file,
        )
    elif e.type is EntryType.START:
        print(f"start         at {at_ms:8.1f} ms  {json.dumps(e.info)}", file=file)
    else:
        print(f"{e.type.value:<13} at {at_ms:8.1f} ms", file=file)


def _write_audio(out: Path, capture: Any) -> None:
    """Write the followed audio as ``out``'s extension asks (a G.711 ``.wav`` or a raw ``.ulaw``...).

    Raises:
        InvalidRequest: the job's format or rate is not what ``out``'s name holds (``listen --out``).
    """
    from voxcast.audio.encode import stream_to_file

    first = capture.chunks[0]
    fmt = AudioFormat(first.format)
    spec = (
        output_file(out, fmt.value, first.sample_rate) if out.suffix else OutputFile(fmt, first.sample_rate)
    )
    data = capture.audio
    if capture.gaps:
        data = _playable_part(fmt, first.sample_rate, capture, raw=spec.raw)
    elif not spec.raw:
        data = stream_to_file(fmt, first.sample_rate, data)
    out.write_bytes(data)
    print(f"wrote {out} ({len(data)} bytes, {fmt.value} {first.sample_rate} Hz)", file=sys.stderr)


def _playable_part(fmt: AudioFormat, sample_rate: int, capture: Any, *, raw: bool) -> bytes:
    """What a stream with missing chunks still holds, as a file that opens: PCM and G.711 chunks are
    whole samples, so what is there is kept (under a header of its true size when the file has one;
    a WAV stream whose first chunk, the one with the header, is gone gets a new header). A compressed
    format cut anywhere cannot be repaired here.

    Raises:
        CommandError: a compressed format (nothing is written).
    """
    from voxcast.audio.encode import stream_to_file
    from voxcast.audio.wav import WavCodec, file_header, header_size

    data = capture.audio
    if fmt in (AudioFormat.PCM, AudioFormat.MULAW, AudioFormat.ALAW):
        return data if raw else stream_to_file(fmt, sample_rate, data)
    if fmt is AudioFormat.WAV:  # the first chunk, where present, starts with the streaming header
        samples = data if (capture.chunks[0].seq or 0) > 0 else data[header_size(WavCodec.PCM16) :]
        samples = samples[: len(samples) // 2 * 2]
        if raw:
            return samples
        return file_header(WavCodec.PCM16, sample_rate, len(samples)) + samples
    raise CommandError(
        f"the stream is incomplete ({capture.gaps} chunks missing) and {fmt.value} cannot be written from "
        "part of a stream; nothing was written (listen again in a format such as wav or pcm, or render it "
        "again)"
    )


# -- status / cancel / voices ------------------------------------------------------------------------
def run_status(args: argparse.Namespace) -> int:
    st = _client(args).status(args.job_id)
    if st["status"] == "unknown":  # as cancel and listen say it
        raise CommandError(f"no such job {args.job_id!r} (unknown or expired)")
    print(json.dumps(st, indent=2, default=str))
    return 0


def run_workers(args: argparse.Namespace) -> int:
    print(json.dumps(_client(args).workers(), indent=2, default=str))
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    """Print what the cancel did (cancelled, cancelling, or the status of a job that had ended)."""
    outcome = _client(args).cancel(args.job_id)
    if outcome == "unknown":
        raise CommandError(f"no job {args.job_id!r} (unknown or expired)")
    print(outcome)
    return 0


def run_register_voice(args: argparse.Namespace) -> int:
    client = _client(args)
    job_id = client.register_voice(
        args.audio.read_bytes(), ref_text=args.ref_text, x_vector_only=args.x_vector_only, queue=args.queue
    )
    print(job_id, file=sys.stderr)
    return _wait_and_print(client, job_id)


def _wait_and_print(client: Any, job_id: str, timeout_s: float = 3600.0) -> int:
    """Wait for the job's result and print it; exit 2 when it failed on its input, 1 on another failure."""
    from voxcast.serving.rq.client import JobFailed

    _warn_if_unserved(client, job_id, timeout_s)
    try:
        print(json.dumps(client.wait(job_id, timeout_s=timeout_s), indent=2, default=str))
        return 0
    except JobFailed as e:
        print(json.dumps({"error": e.error or {"message": str(e)}, "status": e.status}), file=sys.stderr)
        return exit_code_of(e.error)


# -- prerender ---------------------------------------------------------------------------------------
def run_prerender(args: argparse.Namespace) -> int:
    from voxcast.prerender.manifest import parse_manifest

    defaults = {k: getattr(args, k) for k in ("voice", "language") if getattr(args, k)}
    manifest = args.manifest.read_text(encoding="utf-8")
    options = {
        "presets": args.presets,
        "loudness_lufs": args.loudness,
        "peak_dbfs": args.peak,
        "pad_ms": args.pad_ms,
        "trim": False if args.no_trim else None,
        "defaults": defaults or None,
        "force": args.force or None,
        "gate": _gate(args),
        "in_flight": args.in_flight,
        "chunk_prompts": args.chunk_prompts,
    }
    try:
        # a manifest no worker could read (empty, unparseable) is refused before it is enqueued
        parse_manifest(manifest, args.manifest.name, defaults)
        client = _client(args)
        job_id = client.prerender(
            manifest,
            library=args.library,
            manifest_format=args.manifest.name,
            queue=args.queue,
            **options,
        )
    except VoxcastError as e:  # bad input 2; Redis or storage unreachable 1
        print(json.dumps({"error": e.to_dict()}), file=sys.stderr)
        return describe(e)[0]
    print(job_id, file=sys.stderr)
    if args.no_wait:
        print(job_id)
        return 0
    return _prerender_progress(client, job_id)


def _bar(p: Mapping[str, Any], width: int = 30) -> str:
    total, done = int(p.get("total", 0)), int(p.get("done", 0))
    filled = int(width * done / total) if total else 0
    return (
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  rendered {p.get('rendered', 0)}  "
        f"skipped {p.get('skipped', 0)}  failed {p.get('failed', 0)}  workers {len(p.get('workers') or {})}"
    )


def _prerender_progress(client: Any, job_id: str, poll_s: float = 0.5) -> int:
    """Draw a progress bar of the whole library (every chunk, every worker) until its final step
    ends, then print the library's summary."""
    last = None
    while True:
        st = client.status(job_id)
        progress = client.progress(job_id)
        if progress and progress != last:
            print(_bar(progress), end="", file=sys.stderr, flush=True)
            last = progress
        if st["status"] not in ("queued", "started", "deferred", "scheduled"):
            break
        time.sleep(poll_s)
    print(file=sys.stderr)
    return _print_summary(st)


def _print_summary(st: Mapping[str, Any]) -> int:
    """Print how the library ended; returns the exit code: 2 for a job failed on its input (its
    structured error shown, not the worker's traceback), 1 for another failure, 3 for failed prompts."""
    if st["status"] == "cancelled" and st["result"]:  # a cancelled library: what it did
        summary = dict(st["result"])
        print(json.dumps({k: v for k, v in summary.items() if k != "errors"}, indent=2))
        print(f"library cancelled: {summary.get('not_rendered', 0)} prompts not rendered", file=sys.stderr)
        return 1
    if st["status"] != "finished":
        shown = {"status": st["status"], "error": st["error"]}
        if not st["error"]:  # nothing structured: the traceback is all there is
            shown["exc"] = st["exc"]
        print(json.dumps(shown, indent=2), file=sys.stderr)
        return exit_code_of(st["error"])
    summary = st["result"] or {}
    errors: Iterable[Mapping[str, Any]] = summary.get("errors", [])
    for e in errors:
        print(f"row {e['row']} ({e.get('id')}): {with_field(e['field'], e['message'])}", file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "errors"}, indent=2))
    return 0 if not summary.get("errors") else 3
