"""Load benchmark: how many real-time streams one process carries, and with what first audio.

Open-loop Poisson arrivals at each request rate in ``--rates`` (requests/s) for ``--duration``
seconds, or ``--concurrency`` clients each sending its next request when the last one ended. Texts
are agent turns of 4-40 words drawn from a fixed seed. Requests go

* ``--transport http``: to the real server (``voxcast serve`` in a subprocess, ``POST
  /v1/audio/speech``, raw pcm) over loopback, the clients in this process;
* ``--transport inprocess``: to a :class:`~voxcast.service.Service` in this process (no HTTP).

Per request: first audio (from its scheduled arrival, so a late client counts against the server,
not for it), and whether playback stalls when the client plays each chunk in real time from its
arrival (playback starts with the first chunk; a chunk that arrives after the audio before it has
finished playing is a stall). Per level: p50/p95/p99 first audio (of the requests served), viable %
(requests answered with no stall, out of all sent: a refused or failed request is not viable),
refused (503/429: the server's admission control, ``VOXCAST_ADMISSION``; ``--transport inprocess``
asks the engine the same way) and served requests/s, audio seconds per second (= real-time streams
carried), frames/s, RTF (p50 of a request's time from first audio to its end over its audio),
peak memory (GPU where the model runs on CUDA, else the server's resident memory), and

    capacity = the highest rate with p95 first audio <= --ttfa-ms and >= --viable-pct viable,

so a level whose requests are refused is not capacity, however fast the served ones started: a
refused request counts as not served. A refused client does not retry.

The JSON also has each run's ``startup``: the seconds from spawning the server (or loading the engine
in process) to ready, and the first request's first audio after that (a serverless cold start).
``--family chatterbox_turbo`` runs Chatterbox Turbo (``--size tiny`` or ``full``, its built-in voice).

Writes ``<out>/load-<label>.json`` and a PNG of p95 first audio against the request rate.

    python scripts/bench_load.py --size tiny --rates 1,2,4 --duration 20
    python scripts/bench_load.py --size 0.6b --quant int8 --transport inprocess --concurrency 1,2,4
    python scripts/bench_load.py --family chatterbox_turbo --size full --device cuda --dtype bfloat16 \
        --rates 1,2,4 --ttfa-ms 300
    python scripts/bench_load.py --model /models/Qwen3-TTS-12Hz-1.7B-CustomVoice --device cuda \
        --dtype bfloat16 --rates 5,10,15,20,25 --duration 60
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_PHRASES = (
    "sure I can help you with that your order is on its way and should arrive by Tuesday afternoon",
    "the payment went through thank you for waiting let me check the account one moment please",
    "we have two appointments open tomorrow morning at nine or eleven which one works better for you",
    "I am sorry about the delay the technician will call you before arriving the balance is forty two",
    "dollars would you like to pay it now or schedule a reminder",
)


def agent_turns(n: int, seed: int, lo: int = 4, hi: int = 40) -> list[str]:
    """``n`` agent-turn texts of ``lo``-``hi`` words, the same for the same seed."""
    rng = random.Random(seed)
    vocabulary = " ".join(_PHRASES).split()
    out = []
    for _ in range(n):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(lo, hi))]
        cut = sorted(rng.sample(range(3, len(words)), k=min(2, max(0, len(words) - 4))))
        for i in reversed(cut):  # a sentence break or two, as replies have
            if i < len(words) - 1:
                words[i] += "."
        words[0] = words[0].capitalize()
        out.append(" ".join(words).rstrip(".") + ".")
    return out


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times (s from the start) of a Poisson process of ``rate``/s within ``duration_s``."""
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)


@dataclass
class Playback:
    """A listener who starts playing at the first chunk and plays every chunk in real time."""

    first_s: float | None = None
    end_s: float = 0.0  # when the audio received so far has finished playing
    audio_s: float = 0.0
    stalls: int = 0
    stall_s: float = 0.0

    def chunk(self, t_s: float, dur_s: float, tolerance_s: float = 0.0) -> None:
        if self.first_s is None:
            self.first_s, self.end_s = t_s, t_s
        elif t_s > self.end_s + tolerance_s:
            self.stalls += 1
            self.stall_s += t_s - self.end_s
            self.end_s = t_s
        self.end_s += dur_s
        self.audio_s += dur_s


@dataclass
class Result:
    """One request, seen by its client."""

    arrival_s: float
    words: int
    late_ms: float = 0.0  # how late the client sent it after its scheduled arrival
    status: str = "ok"  # ok, refused (503/429), error
    ttfa_ms: float | None = None
    total_ms: float = 0.0
    audio_s: float = 0.0
    stalls: int = 0
    stall_ms: float = 0.0
    error: str | None = None

    @property
    def viable(self) -> bool:
        return self.status == "ok" and self.stalls == 0 and self.audio_s > 0

    @property
    def rtf(self) -> float | None:
        if self.ttfa_ms is None or self.audio_s <= 0:
            return None
        return (self.total_ms - self.ttfa_ms) / 1000 / self.audio_s


def _finish(res: Result, play: Playback, t_sched: float, t_end: float) -> Result:
    if play.first_s is not None:
        res.ttfa_ms = (play.first_s - t_sched) * 1000
    res.total_ms = (t_end - t_sched) * 1000
    res.audio_s, res.stalls, res.stall_ms = play.audio_s, play.stalls, play.stall_s * 1000
    return res


#: Seconds of speech a word (about 2.5 words a second): a random checkpoint's requests are capped at it.
SECONDS_PER_WORD = 0.4


def frames_for(text: str, frames_per_word: float, cap: int) -> int | None:
    """A request's frame cap: random checkpoints never end an utterance by themselves, so they get the
    length real speech would have (:data:`SECONDS_PER_WORD`: 5 frames a word at 12.5 Hz, 10 at 25 Hz);
    0 = none."""
    if frames_per_word > 0:
        n = round(frames_per_word * len(text.split())) + 4
        return min(n, cap) if cap else n
    return cap or None


Sender = Callable[[str, int, float, Result], Result]
"""``send(text, seed, t_sched, result)``: make one request scheduled at ``t_sched`` (perf_counter)."""


def _body(text: str, seed: int, voice: str, extra: dict[str, Any]) -> dict[str, Any]:
    body = {"text": text, "voice": voice, "response_format": "pcm", "seed": seed, "cache": False}
    body |= {k: v for k, v in extra.items() if k != "frames_per_word"}
    frames = frames_for(text, extra.get("frames_per_word", 0.0), body.pop("max_frames", 0))
    if frames:
        body["max_frames"] = frames
    return body


def http_sender(base: str, voice: str, extra: dict[str, Any], tolerance_s: float) -> Sender:
    import httpx

    local = threading.local()

    def send(text: str, seed: int, t_sched: float, res: Result) -> Result:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(timeout=600)
        body = _body(text, seed, voice, extra)
        body["input"] = body.pop("text")  # the OpenAI name
        play = Playback()
        res.late_ms = max(0.0, (time.perf_counter() - t_sched) * 1000)
        try:
            with client.stream("POST", base + "/v1/audio/speech", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    res.status = "refused" if r.status_code in (429, 503) else "error"
                    res.error = f"{r.status_code} {r.text[:200]}"
                    return _finish(res, play, t_sched, time.perf_counter())
                rate = int(body["sample_rate"])
                for data in r.iter_raw():
                    play.chunk(time.perf_counter(), len(data) / 2 / rate, tolerance_s)
        except httpx.HTTPError as e:
            res.status, res.error = "error", repr(e)
        return _finish(res, play, t_sched, time.perf_counter())

    return send


def service_sender(service: Any, voice: str, extra: dict[str, Any], tolerance_s: float) -> Sender:
    def send(text: str, seed: int, t_sched: float, res: Result) -> Result:
        body = _body(text, seed, voice, extra)
        play = Playback()
        res.late_ms = max(0.0, (time.perf_counter() - t_sched) * 1000)
        try:  # refused past capacity, as the HTTP route is
            for chunk in service.synthesize(body, store=False, entry="bench", refusable=True):
                play.chunk(time.perf_counter(), len(chunk.data) / 2 / chunk.sample_rate, tolerance_s)
        except Exception as e:
            refused = getattr(e, "code", None) == "over_capacity"
            res.status, res.error = "refused" if refused else "error", repr(e)
        return _finish(res, play, t_sched, time.perf_counter())

    return send


def run_open_loop(send: Sender, rate: float, duration_s: float, seed: int) -> tuple[list[Result], float]:
    """Poisson arrivals at ``rate``; returns the results and the wall time until the last one ended."""
    arrivals = poisson_arrivals(rate, duration_s, seed)
    texts = agent_turns(len(arrivals), seed)
    with ThreadPoolExecutor(max_workers=max(8, min(512, int(rate * 60) + 8))) as pool:
        t0 = time.perf_counter()
        futures = []
        for i, (a, text) in enumerate(zip(arrivals, texts, strict=True)):
            delay = t0 + a - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            res = Result(arrival_s=a, words=len(text.split()))
            futures.append(pool.submit(send, text, seed * 100_003 + i, t0 + a, res))
        results = [f.result() for f in futures]
    return results, time.perf_counter() - t0


def run_closed_loop(send: Sender, clients: int, duration_s: float, seed: int) -> tuple[list[Result], float]:
    """``clients`` clients, each sending its next request when the last ended, for ``duration_s``."""
    texts = iter(agent_turns(100_000, seed))
    lock = threading.Lock()
    out: list[Result] = []
    t0 = time.perf_counter()

    def client(k: int) -> None:
        n = 0
        while time.perf_counter() - t0 < duration_s:
            with lock:
                text = next(texts)
            now = time.perf_counter()
            res = send(text, seed * 100_003 + k * 10_007 + n, now, Result(now - t0, len(text.split())))
            with lock:
                out.append(res)
            n += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(out, key=lambda r: r.arrival_s), time.perf_counter() - t0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


def summarize(results: list[Result], wall_s: float, frame_rate: float) -> dict[str, Any]:
    """The figures of one level (rate or concurrency)."""
    ok = [r for r in results if r.status == "ok"]
    ttfa = [r.ttfa_ms for r in ok if r.ttfa_ms is not None]
    rtfs = [x for x in (r.rtf for r in ok) if x is not None]
    audio = sum(r.audio_s for r in results)
    n = len(results)

    def r2(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    refused = sum(r.status == "refused" for r in results)
    return {
        "requests": n,
        "refused": refused,
        "refused_pct": r2(100.0 * refused / n if n else 0.0),
        "errors": sum(r.status == "error" for r in results),
        "achieved_rate": r2(n / wall_s if wall_s else 0.0),
        "served_rate": r2(len(ok) / wall_s if wall_s else 0.0),
        "ttfa_ms_p50": r2(pct(ttfa, 0.50)),
        "ttfa_ms_p95": r2(pct(ttfa, 0.95)),
        "ttfa_ms_p99": r2(pct(ttfa, 0.99)),
        "late_ms_p95": r2(pct([r.late_ms for r in results], 0.95)),
        "viable_pct": r2(100.0 * sum(r.viable for r in results) / n if n else 0.0),
        "stalls": sum(r.stalls for r in results),
        "audio_s_per_s": r2(audio / wall_s if wall_s else 0.0),
        "frames_per_s": r2(audio * frame_rate / wall_s if wall_s else 0.0),
        "rtf_p50": r2(statistics.median(rtfs) if rtfs else None),
        "wall_s": r2(wall_s),
        "first_errors": [r.error for r in results if r.error][:3],
    }


def capacity(levels: list[dict[str, Any]], ttfa_ms: float, viable_pct: float) -> float | None:
    """The highest offered rate whose p95 first audio (of the served requests) and viability (of all
    sent: refused and failed ones are not viable) meet the targets."""
    good = [
        lv["rate"]
        for lv in levels
        if lv.get("rate") is not None
        and lv["requests"] > 0
        and lv["ttfa_ms_p95"] is not None
        and lv["ttfa_ms_p95"] <= ttfa_ms
        and lv["viable_pct"] >= viable_pct
    ]
    return max(good) if good else None


TURBO_FRAME_RATE = 25.0


def frame_rate_of(model: Path) -> float:
    """Codec frames per second of the checkpoint's family (Qwen3-TTS-12Hz 12.5, Chatterbox Turbo 25)."""
    try:
        cfg = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return TURBO_FRAME_RATE if (model / "t3_turbo_v1.safetensors").exists() else 12.5
    return TURBO_FRAME_RATE if "chatterbox" in str(cfg.get("model_type", "")) else 12.5


def _cuda_memory_mb(pid: int) -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        p, _, mb = line.partition(",")
        if p.strip() == str(pid):
            return float(mb)
    return None


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


@dataclass
class Target:
    """Where requests go: a sender, and how to read the serving process's peak memory."""

    send: Sender
    memory: Callable[[], dict[str, float | None]]
    close: Callable[[], None] = field(default=lambda: None)
    ready_s: float | None = None  # from spawning the server (or loading the engine) to ready


def _server_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VOXCAST_MAX_ACTIVE=str(args.max_active),
        VOXCAST_STORE_AUDIO="false",
        VOXCAST_LOG_LEVEL="WARNING",
        VOXCAST_ADMISSION=args.admission,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p),
    )
    if args.quant != "none":
        env["VOXCAST_QUANT"] = args.quant
    return env


def http_target(args: argparse.Namespace, model: Path, workdir: Path) -> Target:
    """``voxcast serve`` in a subprocess on a free loopback port, ready when ``/ping`` answers 200."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _server_env(args) | {"VOXCAST_STORAGE_DIR": str(workdir / "store")}
    cmd = [
        sys.executable,
        "-c",
        "from voxcast.serving.cli.main import main; main()",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    cmd += ["--model", str(model), "--device", args.device, "--dtype", args.dtype]
    log = (workdir / "server.log").open("w")
    t_spawn = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.load_timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(
                f"the server exited ({proc.returncode}):\n" + (workdir / "server.log").read_text()[-3000:]
            )
        try:
            if httpx.get(base + "/ping", timeout=2).status_code == 200:
                ready_s = time.perf_counter() - t_spawn
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the server did not become ready in time")
        time.sleep(0.5)

    def close() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

    def memory() -> dict[str, float | None]:
        gpu = _cuda_memory_mb(proc.pid) if args.device.startswith("cuda") else None
        return {"server_peak_rss_mb": _peak_rss_mb(proc.pid), "gpu_used_mb": gpu}

    send = http_sender(base, args.voice, _extra(args), args.stall_tolerance_ms / 1000)
    return Target(send, memory, close, ready_s)


def inprocess_target(args: argparse.Namespace, model: Path, workdir: Path) -> Target:
    import torch

    from voxcast.config import EngineConfig
    from voxcast.engine.engine import Engine
    from voxcast.service import Service, ServiceConfig
    from voxcast.storage.local import LocalBlobStore

    config = replace(  # the environment's other settings too (VOXCAST_FAMILIES and their settings)
        EngineConfig.from_env(os.environ),
        model=str(model),
        device=args.device,
        dtype=args.dtype,
        quant=args.quant,
        max_active=args.max_active,
        warmup=True,
        admission=args.admission == "on",
    )
    logging.getLogger("voxcast").setLevel(logging.ERROR)  # per-request lines would drown the figures
    t0 = time.perf_counter()
    engine = Engine.load(config)
    ready_s = time.perf_counter() - t0
    service = Service.assemble(ServiceConfig(store_audio=False), engine, LocalBlobStore(workdir, fsync=False))

    def memory() -> dict[str, float | None]:
        gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        return {"server_peak_rss_mb": _peak_rss_mb(os.getpid()), "gpu_peak_allocated_mb": gpu}

    send = service_sender(service, args.voice, _extra(args), args.stall_tolerance_ms / 1000)
    return Target(send, memory, service.close, ready_s)


def _extra(args: argparse.Namespace) -> dict[str, Any]:
    fpw = args.frames_per_word
    if fpw is None:
        fpw = 0.0 if args.model else SECONDS_PER_WORD * args.frame_rate
    return {"sample_rate": args.sample_rate, "max_frames": args.max_frames, "frames_per_word": fpw}


def levels_of(args: argparse.Namespace) -> Iterator[tuple[str, float]]:
    if args.concurrency:
        for c in args.concurrency.split(","):
            yield "concurrency", float(c)
    else:
        for r in args.rates.split(","):
            yield "rate", float(r)


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    """p95 first audio against the offered rate, one line per transport; the target as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for transport, run in doc["runs"].items():
        pts = [(lv["rate"], lv["ttfa_ms_p95"]) for lv in run["levels"] if lv.get("rate") is not None]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{transport} (capacity {run['capacity']})")
    ax.axhline(doc["targets"]["ttfa_ms"], color="grey", linestyle="--", label="target p95")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_yscale("log")
    ax.set_ylabel("p95 first audio (ms, log scale)")
    ax.set_title(doc["label"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def model_path(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    # scripts/ is on the path of a script run as scripts/bench_load.py
    from benchlib import checkpoint, turbo_checkpoint

    if args.family == "chatterbox_turbo":
        return turbo_checkpoint(args.size)
    return checkpoint(args.size, args.kind)


def label_of(args: argparse.Namespace) -> str:
    built = f"turbo-{args.size}" if args.family == "chatterbox_turbo" else f"{args.size}-{args.kind}"
    name = Path(args.model).name if args.model else built
    return "-".join(
        x for x in (name, args.device, args.dtype, args.quant if args.quant != "none" else "") if x
    )


def run_target(target: Target, args: argparse.Namespace, frame_rate: float) -> dict[str, Any]:
    first = target.send(agent_turns(1, 999)[0], 1, time.perf_counter(), Result(0.0, 0))  # its imports too
    startup = {
        "ready_s": target.ready_s,
        "first_request_ttfa_ms": first.ttfa_ms,
        "first_status": first.status,
    }
    print(
        f"  ready in {target.ready_s or 0:.1f} s, first request's first audio {first.ttfa_ms} ms", flush=True
    )
    levels = []
    for kind, value in levels_of(args):
        if kind == "rate":
            results, wall = run_open_loop(target.send, value, args.duration, args.seed)
        else:
            results, wall = run_closed_loop(target.send, int(value), args.duration, args.seed)
        level = {kind: value, **summarize(results, wall, frame_rate)}
        levels.append(level)
        print(
            f"  {kind} {value:>6g}: {level['requests']:>4} req  first audio p50 {level['ttfa_ms_p50']} "
            f"p95 {level['ttfa_ms_p95']} p99 {level['ttfa_ms_p99']} ms  viable {level['viable_pct']}%  "
            f"refused {level['refused']}  "
            f"{level['audio_s_per_s']} audio s/s  {level['frames_per_s']} frames/s  RTF {level['rtf_p50']}",
            flush=True,
        )
        if args.requests_out:
            rows = [asdict(r) | {"viable": r.viable} for r in results]
            level["requests_detail"] = rows
    return {
        "startup": startup,
        "levels": levels,
        "capacity": capacity(levels, args.ttfa_ms, args.viable_pct),
        "memory": target.memory(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint directory (default: a random checkpoint of --size)")
    ap.add_argument(
        "--family",
        default="qwen3_tts",
        choices=["qwen3_tts", "chatterbox_turbo"],
        help="the random checkpoint's family (with --model, its family is read from the checkpoint)",
    )
    ap.add_argument(
        "--size",
        default="tiny",
        help="random checkpoint size: tiny, 0.6b, 1.7b (Chatterbox Turbo: tiny, full)",
    )
    ap.add_argument("--kind", default="custom_voice", help="random Qwen3-TTS checkpoint kind")
    ap.add_argument("--voice", help="default: ryan (Qwen3-TTS), default (Chatterbox Turbo's built-in voice)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--max-active", type=int, default=16, help="the engine's max_active")
    ap.add_argument("--transport", default="http", choices=["http", "inprocess", "both"])
    ap.add_argument(
        "--admission",
        default="on",
        choices=["on", "off"],
        help="the engine's admission control (VOXCAST_ADMISSION): on, requests past capacity are refused",
    )
    ap.add_argument("--rates", default="1,2,4", help="offered request rates (requests/s), Poisson")
    ap.add_argument("--concurrency", default="", help="fixed-concurrency levels instead of rates")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per level")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-rate", type=int, default=24000, help="of the pcm asked for")
    ap.add_argument("--max-frames", type=int, default=0, help="cap each request's frames (0: the model's)")
    ap.add_argument(
        "--frames-per-word",
        type=float,
        default=None,
        help="cap each request at this many frames a word (default: 0.4 s of frames for a random checkpoint, "
        "which never ends by itself; none with --model)",
    )
    ap.add_argument("--ttfa-ms", type=float, default=50.0, help="capacity's p95 first-audio target")
    ap.add_argument("--viable-pct", type=float, default=99.0, help="capacity's viability target")
    ap.add_argument("--stall-tolerance-ms", type=float, default=0.0, help="a client's jitter buffer")
    ap.add_argument("--load-timeout", type=float, default=900.0, help="seconds for the server to be ready")
    ap.add_argument("--requests-out", action="store_true", help="every request's row in the JSON")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = model_path(args)
    frame_rate = args.frame_rate = frame_rate_of(model)
    if args.voice is None:
        args.voice = "default" if frame_rate == TURBO_FRAME_RATE else "ryan"
    transports = ["http", "inprocess"] if args.transport == "both" else [args.transport]
    label = label_of(args)
    doc: dict[str, Any] = {
        "label": label,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "targets": {"ttfa_ms": args.ttfa_ms, "viable_pct": args.viable_pct},
        "frame_rate": frame_rate,
        "runs": {},
    }
    for transport in transports:
        print(f"{transport}: {label}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            make = http_target if transport == "http" else inprocess_target
            target = make(args, model, Path(tmp))
            try:
                doc["runs"][transport] = run_target(target, args, frame_rate)
            finally:
                target.close()
        print(f"  capacity ({transport}): {doc['runs'][transport]['capacity']} requests/s", flush=True)
    try:
        from benchlib import machine_info

        doc["machine"] = machine_info()
    except Exception as e:
        doc["machine"] = {"error": repr(e)}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"load-{label}.json"
    out.write_text(json.dumps(doc, indent=1))
    png = plot(doc, args.out / f"load-{label}.png")
    print(f"wrote {out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
