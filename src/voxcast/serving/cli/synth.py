"""``voxcast synth``: speak one text to a file and print the timing.

Runs the same path as the servers (Service -> engine -> encoder -> store/cache), on the embedded
defaults unless told otherwise: local storage, the model from ``--model`` or ``VOXCAST_MODEL``.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from voxcast.audio.files import OutputFile, output_file, raw_samples
from voxcast.audio.formats import NATIVE_SAMPLE_RATE, AudioFormat
from voxcast.audio.wav import WavCodec
from voxcast.errors import InvalidRequest
from voxcast.serving.cli.errors import CommandError
from voxcast.serving.cli.request_flag import add_request_flag, request_fields

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("synth", help="synthesize one text to a file and print the timing")
    p.add_argument("text", nargs="?", help="text to speak (or --stdin)")
    p.add_argument(
        "--stdin",
        action="store_true",
        help="read the text from standard input as it arrives and speak it as it comes, appending "
        "its audio to --out (wav, pcm, mulaw, alaw; --out - writes raw audio to standard output, "
        "e.g. piped into a player); see --text-mode",
    )
    p.add_argument(
        "--text-mode",
        choices=("words", "sentences"),
        default="words",
        help="with --stdin: 'words' (default) feeds the model each word as soon as it is complete, one "
        "utterance up to the end of input; 'sentences' speaks each sentence on its own once the text "
        "after it arrives. With --seed, 'words' gives byte for byte the audio of "
        "'synth TEXT --seed N --streaming-text', not of 'synth TEXT --seed N' for a named speaker, "
        "whose default puts the whole text in the prefill",
    )
    p.add_argument(
        "--streaming-text",
        action="store_true",
        help="feed the text one token per frame (the request's non_streaming_text: false) instead of "
        "the model's default (named speakers: the whole text in the prefill); text read with --stdin "
        "is always fed this way",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output file; the extension picks the format: .wav .mp3 .flac .opus .aac, raw .pcm, and "
        "Asterisk's headerless .ulaw .alaw (8 kHz) .sln .sln16 ... (docs/telephony.md); '-' with "
        "--stdin: stdout",
    )
    p.add_argument("--model", help="checkpoint directory or hub id (default: VOXCAST_MODEL)")
    p.add_argument("--voice", help="named speaker (CustomVoice) or registered voice id")
    p.add_argument("--ref-audio", type=Path, help="reference audio file for cloning (Base models)")
    p.add_argument("--ref-text", help="transcript of the reference audio (ICL cloning)")
    p.add_argument("--instruct", help="style instruction / voice description")
    p.add_argument("--language", default="auto", help="language name or auto (default auto)")
    p.add_argument(
        "--seed", type=int, help="sampling seed: the same seed gives the same audio (and cacheable)"
    )
    p.add_argument("--greedy", action="store_true", help="greedy decoding (deterministic, cacheable)")
    p.add_argument(
        "--sample-rate",
        type=int,
        help="output rate in Hz (default: the extension's, e.g. .sln16 16000; else 24000)",
    )
    p.add_argument(
        "--speed", type=float, help="speaking rate 0.25-4.0 (the audio time-stretched, pitch kept; default 1)"
    )
    p.add_argument(
        "--format",
        choices=[f.value for f in AudioFormat],
        help="for a name without a known extension; with one it must agree (.wav also holds mulaw, alaw)",
    )
    p.add_argument("--device", help="auto, cpu, cuda (default: VOXCAST_DEVICE)")
    p.add_argument("--dtype", help="auto, float32, bfloat16 (default: VOXCAST_DTYPE)")
    p.add_argument(
        "--warmup",
        action="store_true",
        help="warm every request path up first, as a server does (a one-shot run skips it: its own "
        "request is the only one, and it warms its own path; VOXCAST_WARMUP=1 does the same)",
    )
    p.add_argument("--no-warmup", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--no-cache", action="store_true", help="do not read or fill the audio cache")
    p.add_argument("--max-frames", type=int, help="frame limit (12.5 frames a second)")
    add_request_flag(p)
    p.add_argument(
        "--word-timestamps",
        action="store_true",
        help="add each word's estimated start and end (ms) to the printed result",
    )
    p.set_defaults(func=run)


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    for flag, name in (("model", "VOXCAST_MODEL"), ("device", "VOXCAST_DEVICE"), ("dtype", "VOXCAST_DTYPE")):
        if getattr(args, flag):
            env[name] = getattr(args, flag)
    # One request, one stream: warm nothing but its own path, record batch-1 steps only.
    if args.warmup or args.no_warmup:
        env["VOXCAST_WARMUP"] = "1" if args.warmup else "0"
    env.setdefault("VOXCAST_WARMUP", "0")
    env.setdefault("VOXCAST_MAX_ACTIVE", "1")
    return env


_STDIN_FORMATS = (AudioFormat.WAV, AudioFormat.PCM, AudioFormat.MULAW, AudioFormat.ALAW)
#: WAVE format tag of each format a ``.wav`` file written by ``--stdin`` can hold (voxcast.audio.wav).
_WAV_CODECS = {
    AudioFormat.WAV: WavCodec.PCM16,
    AudioFormat.MULAW: WavCodec.MULAW,
    AudioFormat.ALAW: WavCodec.ALAW,
    AudioFormat.PCM: WavCodec.PCM16,
}


def _speak_stdin(args: argparse.Namespace, out: OutputFile, service: Any) -> int:
    """``--stdin``: the text spoken as it arrives (word by word in one utterance, or sentence by
    sentence), its audio appended to the output as it is generated; one JSON line per utterance or
    sentence on stderr, a summary on stdout."""
    from voxcast.audio.wav import finalize_stream, stream_header
    from voxcast.text.incremental import SentenceBuffer

    fmt = out.format
    header = None if out.raw or args.out == "-" else _WAV_CODECS[fmt]  # a .wav: its header first
    fields = _request(args, AudioFormat.PCM if fmt == AudioFormat.WAV else fmt)
    fields.pop("text")
    to_stdout = args.out == "-"
    sink = sys.stdout.buffer if to_stdout else open(args.out, "wb")  # noqa: SIM115 (closed below)
    report = sys.stderr
    t0 = time.perf_counter()
    sentences: list[dict[str, Any]] = []
    try:
        if header is not None:
            sink.write(stream_header(header, args.sample_rate))

        def speak(stream: Any, kind: str) -> None:
            for chunk in stream:
                sink.write(chunk.data)
                sink.flush()
            t = stream.result.timing
            line = {kind: len(sentences), "chars": len(stream.request.text), "ttfa_ms": round(t.ttfa_ms, 1)}
            line |= {"frames": t.frames, "audio_s": round(t.audio_s, 3), "finish_reason": t.finish_reason}
            if stream.result.words is not None:
                line["words"] = stream.result.words
            sentences.append(line)
            print(json.dumps(line), file=report, flush=True)

        fd = sys.stdin.fileno()
        if args.text_mode == "words":
            stream = service.open(fields, store=False, entry="cli")
            failed: list[BaseException] = []

            def read() -> None:  # pushes whatever has arrived (bytes: split characters are fine)
                try:
                    while data := os.read(fd, 4096):
                        stream.push(data)
                    stream.close_text()
                except BaseException as e:
                    failed.append(e)
                    stream.cancel()

            reader = threading.Thread(target=read, name="voxcast-stdin", daemon=True)
            reader.start()
            speak(stream, "utterance")
            reader.join()
            if failed:
                raise failed[0]
        else:
            buffer, decoder = SentenceBuffer(), codecs.getincrementaldecoder("utf-8")("replace")
            while data := os.read(fd, 4096):  # whatever has arrived, not whole lines
                for sentence in buffer.push(decoder.decode(data)):
                    speak(
                        service.synthesize({**fields, "text": sentence}, store=False, entry="cli"), "sentence"
                    )
            for sentence in buffer.push(decoder.decode(b"", final=True)) + buffer.flush():
                speak(service.synthesize({**fields, "text": sentence}, store=False, entry="cli"), "sentence")
    finally:
        if not to_stdout:
            sink.close()
    if header is not None:
        path = Path(args.out)
        path.write_bytes(finalize_stream(path.read_bytes()))  # the true sizes in the header
    summary = {
        "out": args.out,
        "segments": len(sentences),
        "audio_s": round(sum(s["audio_s"] for s in sentences), 3),
        "wall_ms": round((time.perf_counter() - t0) * 1000, 1),
    }
    print(json.dumps(summary), file=report if to_stdout else sys.stdout)
    return 0


def _request(args: argparse.Namespace, fmt: AudioFormat) -> dict[str, Any]:
    req: dict[str, Any] = {
        "text": args.text,
        "language": args.language,
        "response_format": fmt.value,
        "sample_rate": args.sample_rate,
        "cache": not args.no_cache,
        "greedy": args.greedy,
    }
    if args.word_timestamps:
        req["word_timestamps"] = True
    if args.streaming_text:
        req["non_streaming_text"] = False
    for key in ("voice", "ref_text", "instruct", "seed", "max_frames", "speed"):
        if getattr(args, key) is not None:
            req[key] = getattr(args, key)
    if args.ref_audio is not None:
        req["ref_audio"] = base64.b64encode(args.ref_audio.read_bytes()).decode()
    req.update(request_fields(args.request))
    return req


def _load(args: argparse.Namespace) -> Any:
    """The service (torch and the model are imported here, once every argument has been checked);
    a model that names no checkpoint is bad input (exit 2) before anything loads."""
    from voxcast.models.hub import not_a_checkpoint

    env = _env(args)
    model = env.get("VOXCAST_MODEL")
    wrong = not_a_checkpoint(model) if model else None
    if wrong is not None:
        raise CommandError(wrong, code=2)
    from voxcast.service import Service, ServiceConfig

    return Service.load(ServiceConfig.from_env(env))


def _check_out(out: Path, ref_audio: Path | None) -> None:
    """Refuse, before anything loads, an output that cannot be written or that is an input.

    Raises:
        InvalidRequest: ``out`` is in a missing or read-only directory, is a directory, or is the
            reference audio (field ``out``).
    """
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidRequest(f"no such directory: {parent}", field="out")
    if out.is_dir() or not os.access(parent, os.W_OK):
        raise InvalidRequest(f"cannot write {out}", field="out")
    if ref_audio is not None and out.resolve() == ref_audio.resolve():
        raise InvalidRequest(
            f"{out} is also --ref-audio: writing it would destroy the reference; choose another --out",
            field="out",
        )


def run(args: argparse.Namespace) -> int:
    from voxcast.audio.encode import stream_to_file
    from voxcast.engine.request import parse_request

    if (args.text is None) == (not args.stdin):
        raise CommandError("give the text, or --stdin to read it as it arrives (not both)", code=2)
    out = Path(args.out)
    if args.stdin and args.out == "-":
        spec = OutputFile(AudioFormat(args.format or "pcm"), args.sample_rate or NATIVE_SAMPLE_RATE, raw=True)
    else:
        spec = output_file(out, args.format, args.sample_rate)
        _check_out(out, args.ref_audio)
    args.sample_rate, fmt = spec.sample_rate, spec.format
    if args.stdin:
        if fmt not in _STDIN_FORMATS:
            raise CommandError("--stdin writes wav, pcm, mulaw or alaw (audio that can be appended)", code=2)
        if args.out == "-" and fmt == AudioFormat.WAV:
            raise CommandError("--out - writes raw audio: use --format pcm, mulaw or alaw", code=2)
        parse_request({**_request(args, fmt), "text": "x"})  # bad arguments fail before loading
        service = _load(args)
        try:
            return _speak_stdin(args, spec, service)
        finally:
            service.close()
    request = parse_request(_request(args, fmt))  # bad arguments fail before minutes of loading
    service = _load(args)
    try:
        # the complete file as the service would store it (marked where VOXCAST_WATERMARK is on)
        stream = service.synthesize(request, store=False, entry="cli", keep_file=True)
        t0 = time.perf_counter()
        parts = []
        for chunk in stream:
            parts.append(chunk.data)
            print(
                f"chunk {chunk.seq:3d}  {chunk.t_ms:8.1f} ms  {len(chunk.data):7d} B  {chunk.frames} frames",
                file=sys.stderr,
            )
        body = b"".join(parts)
        whole = stream.file if stream.file is not None else stream_to_file(fmt, args.sample_rate, body)
        if spec.raw:  # Asterisk's .ulaw / .sln ...: the samples alone
            whole = raw_samples(whole, fmt)
        out.write_bytes(whole if parts else b"")
        result = stream.result
        assert result is not None
        print(
            json.dumps(
                {"out": str(out), "wall_ms": round((time.perf_counter() - t0) * 1000, 1), **result.to_dict()},
                indent=2,
                default=str,
            )
        )
        return 0
    finally:
        service.close()
