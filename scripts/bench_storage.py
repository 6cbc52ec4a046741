"""Benchmark: rendered-audio cache hits and voice lookups over a loopback S3 server (moto).

Measures, for a 3 s prompt as 24 kHz PCM16 WAV (~144 KB) and as 8 kHz mu-law (~24 KB):
time to the first chunk and to the full body of a cache hit, via ``AudioCache.open`` (one GET) and via
``lookup`` + ``iter_chunks`` (HEAD + GET); and a voice-prompt lookup cold (from S3) vs warm (LRU).
The local-directory store is measured too, for reference. Prints a table and writes JSON to
``bench-results/storage.json``. Target: cache-hit first chunk p50 <= 20 ms over loopback S3.

Usage: ``PYTHONPATH=src python scripts/bench_storage.py [--reads 200] [--out bench-results/storage.json]``
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from benchlib import use_checkout

use_checkout()


from tests.fixtures.s3 import MotoServer  # noqa: E402

from voxcast.cache import AudioCache  # noqa: E402
from voxcast.engine.request import parse_request  # noqa: E402
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt  # noqa: E402
from voxcast.storage import BlobStore, LocalBlobStore, open_store  # noqa: E402
from voxcast.voices import VoiceRegistry  # noqa: E402

log = logging.getLogger("bench_storage")
MODEL = "bench-model@0"


def _payloads(seconds: float = 3.0) -> dict[str, tuple[str, bytes]]:
    """name -> (format, bytes) of a 3 s tone."""
    out: dict[str, tuple[str, bytes]] = {}
    for name, rate, fmt, kwargs in [
        ("wav24k", 24000, "wav", {"format": "WAV", "subtype": "PCM_16"}),
        ("mulaw8k", 8000, "mulaw", {"format": "RAW", "subtype": "ULAW"}),
    ]:
        t = np.arange(int(seconds * rate)) / rate
        pcm = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
        buf = io.BytesIO()
        sf.write(buf, pcm, rate, **kwargs)
        out[name] = (fmt, buf.getvalue())
    return out


def _stats(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 3), "p95_ms": round(q[94], 3), "mean_ms": round(statistics.fmean(ms), 3)}


def _time_hits(cache: AudioCache, key: str, reads: int, one_request: bool) -> dict[str, Any]:
    first, full = [], []
    for _ in range(reads):
        t0 = time.perf_counter()
        if one_request:
            stream = cache.open(key)
            assert stream is not None
            chunks = stream.iter_chunks()
        else:
            assert cache.lookup(key) is not None
            chunks = cache.iter_chunks(key)
        size = len(next(chunks))
        t1 = time.perf_counter()
        size += sum(len(c) for c in chunks)
        t2 = time.perf_counter()
        first.append((t1 - t0) * 1e3)
        full.append((t2 - t0) * 1e3)
    return {"first_chunk": _stats(first), "full_read": _stats(full), "bytes": size}


def bench_cache(store: BlobStore, reads: int) -> dict[str, Any]:
    cache = AudioCache(store)
    out: dict[str, Any] = {"chunk_bytes": cache.chunk_bytes}
    for name, (fmt, data) in _payloads().items():
        req = parse_request({"text": f"Bench {name}", "seed": 1, "response_format": fmt})
        key = cache.key_for(req, model_identity=MODEL)
        cache.fill(key, data, {"format": fmt, "audio_s": 3.0})
        _time_hits(cache, key, 5, True)  # warm the connection pool
        out[name] = {
            "open": _time_hits(cache, key, reads, one_request=True),
            "lookup+iter": _time_hits(cache, key, reads, one_request=False),
        }
    return out


def _prompt(audio: bytes, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
    g = torch.Generator().manual_seed(len(audio))
    codes = torch.randint(0, 2048, (125, 16), generator=g)  # 10 s reference clip
    return VoicePrompt(torch.randn(2048, generator=g), codes, ref_text, torch.arange(40), False, MODEL)


def bench_voices(store: BlobStore, reads: int) -> dict[str, Any]:
    def registry() -> VoiceRegistry[VoicePrompt]:
        return VoiceRegistry(store, MODEL, _prompt, lambda b: VoicePrompt.from_bytes(b, MODEL))

    reg = registry()
    vid = reg.register(b"reference-audio" * 1000, "A ten second reference clip.")
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(reads):
        fresh = registry()
        t0 = time.perf_counter()
        fresh.get(vid)
        t1 = time.perf_counter()
        fresh.get(vid)
        t2 = time.perf_counter()
        cold.append((t1 - t0) * 1e3)
        warm.append((t2 - t1) * 1e3)
    nbytes = len(reg.get(vid).to_bytes())
    return {"prompt_bytes": nbytes, "cold": _stats(cold), "warm": _stats(warm)}


def _run(label: str, store: BlobStore, reads: int, results: dict[str, Any]) -> None:
    log.info("%s: cache hits", label)
    results[label] = {"cache": bench_cache(store, reads)}
    log.info("%s: voice lookups", label)
    results[label]["voice"] = bench_voices(store, reads)


def _print(results: dict[str, Any]) -> None:
    print(
        f"{'backend':8} {'payload':8} {'path':12} {'first p50':>10} {'first p95':>10} {'full p50':>9} {'full p95':>9}"
    )
    for backend in ("s3", "local"):
        cache = results[backend]["cache"]
        for name in ("wav24k", "mulaw8k"):
            for path in ("open", "lookup+iter"):
                r = cache[name][path]
                f, a = r["first_chunk"], r["full_read"]
                print(
                    f"{backend:8} {name:8} {path:12} {f['p50_ms']:10.2f} {f['p95_ms']:10.2f} "
                    f"{a['p50_ms']:9.2f} {a['p95_ms']:9.2f}"
                )
        v = results[backend]["voice"]
        print(
            f"{backend:8} voice {v['prompt_bytes']} B: cold p50 {v['cold']['p50_ms']:.2f} ms "
            f"p95 {v['cold']['p95_ms']:.2f} ms | warm p50 {v['warm']['p50_ms'] * 1e3:.1f} us"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--out", default="bench-results/storage.json")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "reads": args.reads,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "loadavg_before": os.getloadavg(),
    }
    server = MotoServer()
    server.start()
    try:
        cfg = server.storage_config("bench")
        s3 = open_store(cfg, check_bucket=False)
        s3.client.create_bucket(Bucket="bench")  # type: ignore[attr-defined]
        _run("s3", s3, args.reads, results)
        with tempfile.TemporaryDirectory() as tmp:
            _run("local", LocalBlobStore(tmp, fsync=False), args.reads, results)
    finally:
        server.stop()
    results["loadavg_after"] = os.getloadavg()
    _print(results)
    print(f"load average before/after: {results['loadavg_before']} / {results['loadavg_after']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
