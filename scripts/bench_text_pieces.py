"""First audio for text that arrives at LLM speed: word by word vs waiting for a sentence vs the whole text.

An agent's reply arrives as tokens (default 30 a second, about 4 characters each). Three ways to speak it,
each timed from the first token's arrival, on the same engine, interleaved, ``--reps`` times:

- ``words``: ``engine.open`` and push every token as it arrives (exact: the whole text's frames);
- ``sentence``: wait for the first sentence to be complete, then synthesize it (what a sentence
  splitter in front of a whole-text TTS does; later sentences follow, not timed here);
- ``full``: wait for the whole text, then synthesize it.

All three use the streaming-text layout and the same seed. Reports first audio (ms after the first
token), total time, audio seconds, playback stalls, and for ``words`` how often the stream waited for
text. Prints a table, writes ``bench-results/text_pieces.json`` and a timeline plot (tokens arriving,
audio chunks arriving, per scenario) as ``bench-results/text_pieces.png``.

``--long N``: also a text of about N characters (default 0: skip; the issue's case is 5000) spoken
whole through the long-text planner, one stream of sentence pieces, with each piece capped at
``--long-piece-frames`` (random weights never draw end-of-speech, so uncapped pieces would each run
to their derived limit): total time, real-time factor, playback stalls and, per piece, its prefill
and whether it was prefilled ahead while the previous one played.

Usage::

    python scripts/bench_text_pieces.py [--size 0.6b] [--quant none,int8] [--reps 3] [--frames 60]
        [--long 5000 --long-piece-frames 60]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
from benchlib import checkpoint, cpu_name, use_checkout  # noqa: E402

use_checkout()


from voxcast import Engine, EngineConfig  # noqa: E402

TEXT = (
    "Sure, I can help with that. Your order number 48213 shipped yesterday from our Denver warehouse "
    "and should arrive by Thursday afternoon. Is there anything else I can do for you today?"
)


def _tokens(text: str) -> list[str]:
    """LLM-like tokens: words with their leading space, long words cut into 4-character parts."""
    out: list[str] = []
    for word in re.findall(r"\s*\S+", text):
        while len(word) > 6:
            out.append(word[:4])
            word = word[4:]
        out.append(word)
    return out


def _consume(stream: Any, t0: float) -> dict[str, Any]:
    chunks = []
    for c in stream:
        chunks.append({"t_s": time.perf_counter() - t0, "audio_s": c.duration_s, "frames": c.frames})
    t = stream.timing
    return {
        "first_audio_ms": chunks[0]["t_s"] * 1000 if chunks else None,
        "total_ms": (time.perf_counter() - t0) * 1000,
        "audio_s": t.audio_s,
        "frames": t.frames,
        "stalls": t.stalls,
        "stall_ms": t.stall_ms,
        "waits": t.extra.get("text_in_pieces", {}).get("waits"),
        "chunks": chunks,
    }


def run_once(
    engine: Engine, scenario: str, tokens: list[str], dt: float, base: dict[str, Any]
) -> dict[str, Any]:
    text = "".join(tokens)
    arrivals = [i * dt for i in range(len(tokens))]
    first_sentence_end = next(i for i, tok in enumerate(tokens) if tok.rstrip().endswith("."))
    t0 = time.perf_counter()
    if scenario == "words":
        stream = engine.open(base)

        def feed() -> None:
            for tok, at in zip(tokens, arrivals, strict=True):
                time.sleep(max(0.0, t0 + at - time.perf_counter()))
                stream.push(tok)
            stream.close_text()

        feeder = threading.Thread(target=feed)
        feeder.start()
        out = _consume(stream, t0)
        feeder.join()
    else:
        upto = first_sentence_end if scenario == "sentence" else len(tokens) - 1
        # the text is complete when its last token arrives (and the next one shows the sentence ended)
        ready_at = arrivals[min(upto + 1, len(tokens) - 1)] if scenario == "sentence" else arrivals[-1]
        time.sleep(max(0.0, t0 + ready_at - time.perf_counter()))
        spoken = "".join(tokens[: upto + 1]).strip() if scenario == "sentence" else text
        out = _consume(engine.synthesize({**base, "text": spoken}), t0)
        out["text_ready_ms"] = ready_at * 1000
    out["tokens"] = [round(a, 4) for a in arrivals]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--quant", default="none,int8", help="comma-separated: none, int8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--frames", type=int, default=60, help="frames per run (random weights never stop)")
    ap.add_argument("--tokens-per-s", type=float, default=30.0)
    ap.add_argument("--long", type=int, default=0, help="characters of a long text to speak whole (0: skip)")
    ap.add_argument("--long-piece-frames", type=int, default=60)
    ap.add_argument("--out", type=Path, default=REPO / "bench-results" / "text_pieces.json")
    args = ap.parse_args()

    model = checkpoint(args.size, "custom_voice")
    tokens, dt = _tokens(TEXT), 1.0 / args.tokens_per_s
    base = {
        "voice": "ryan",
        "seed": 11,
        "non_streaming_text": False,
        "max_frames": args.frames,
        "cache": False,
    }
    scenarios = ["words", "sentence", "full"]
    results: dict[str, Any] = {
        "cpu": cpu_name(),
        "size": args.size,
        "tokens": len(tokens),
        "tokens_per_s": args.tokens_per_s,
        "frames": args.frames,
        "text_chars": len(TEXT),
        "runs": {},
    }
    quants = [q.strip() for q in args.quant.split(",") if q.strip()]
    for quant in quants:
        cap = args.long_piece_frames if args.long else 2400
        engine = Engine.load(EngineConfig(model=str(model), quant=quant, warmup=False, max_frames_cap=cap))
        try:
            for scenario in scenarios:  # each path once before timing (first-call costs)
                run_once(engine, scenario, tokens, dt / 10, {**base, "max_frames": 4})
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in scenarios}
            for _ in range(args.reps):
                for scenario in scenarios:
                    runs[scenario].append(run_once(engine, scenario, tokens, dt, base))
            if args.long:
                results.setdefault("long", {})[quant] = long_text(engine, args.long, base)
        finally:
            engine.close()
        results["runs"][quant] = runs
    print(
        f"{results['cpu']}, {args.size}, {len(tokens)} tokens at {args.tokens_per_s:g}/s, {args.frames} frames"
    )
    print(
        f"{'quant':6} {'scenario':9} {'first audio ms (median; runs)':40} {'total ms':>9} {'stall ms':>9} {'waits':>6}"
    )
    summary: dict[str, Any] = {}
    for quant, runs in results["runs"].items():
        for scenario, reps in runs.items():
            first = [r["first_audio_ms"] for r in reps]
            med = statistics.median(first)
            summary.setdefault(quant, {})[scenario] = {
                "first_audio_ms": med,
                "total_ms": statistics.median(r["total_ms"] for r in reps),
                "stall_ms": statistics.median(r["stall_ms"] for r in reps),
            }
            waits = reps[0]["waits"] if reps[0]["waits"] is not None else "-"
            runs_s = ", ".join(f"{x:.0f}" for x in first)
            print(
                f"{quant:6} {scenario:9} {med:8.0f} ({runs_s}){'':{max(0, 28 - len(runs_s))}}"
                f" {summary[quant][scenario]['total_ms']:9.0f} {summary[quant][scenario]['stall_ms']:9.0f} {waits!s:>6}"
            )
        s = summary[quant]
        print(
            f"{quant:6} words first audio: {s['sentence']['first_audio_ms'] / s['words']['first_audio_ms']:.1f}x "
            f"sooner than after the sentence, {s['full']['first_audio_ms'] / s['words']['first_audio_ms']:.1f}x "
            "sooner than after the whole text"
        )
    for quant, row in results.get("long", {}).items():
        print(
            f"{quant:6} long text: {row['chars']} characters in {row['pieces']} pieces ({args.long_piece_frames}"
            f" frames each at most): {row['total_ms'] / 1000:.1f} s for {row['audio_s']:.1f} s of audio (RTF"
            f" {row['rtf']:.2f}), first audio {row['first_audio_ms']:.0f} ms, {row['stalls']} stalls /"
            f" {row['stall_ms']:.0f} ms; next piece prefilled ahead {row['ahead']} of {row['pieces'] - 1}"
        )
    results["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    _plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def long_text(engine: Engine, chars: int, base: dict[str, Any]) -> dict[str, Any]:
    """Speak ``chars`` characters of varied sentences whole (the planner cuts them into pieces)."""
    sentences = [
        "Thank you for calling the city library.",
        "Our opening hours are nine to six on weekdays, and ten to four on Saturdays.",
        "Dr. Smith's reading group meets at 3 p.m. in room 2.5 on the first floor.",
        "To renew a book, press one; to reserve a study room, press two.",
        "Please have your card number ready, it is the 14-digit number on the back.",
    ]
    text, i = "", 0
    while len(text) < chars:
        text += ("" if not text else " ") + sentences[i % len(sentences)]
        i += 1
    text = text[:chars].rsplit(" ", 1)[0]
    request = {k: v for k, v in base.items() if k != "max_frames"}
    t0 = time.perf_counter()
    stream = engine.synthesize({**request, "text": text})
    out = _consume(stream, t0)
    t = stream.timing
    pieces = t.extra.get("pieces", [])
    return {
        "chars": len(text),
        "pieces": t.pieces,
        "first_audio_ms": out["first_audio_ms"],
        "total_ms": out["total_ms"],
        "audio_s": t.audio_s,
        "rtf": t.rtf,
        "stalls": t.stalls,
        "stall_ms": t.stall_ms,
        "ahead": sum(1 for p in pieces if p.get("ahead")),
        "piece_prefill_ms": [round(p.get("prefill_ms", 0.0), 1) for p in pieces],
        "chunks": out["chunks"],
    }


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quants = list(results["runs"])
    fig, axes = plt.subplots(len(quants), 1, figsize=(10, 2.6 * len(quants)), squeeze=False)
    for ax, quant in zip(axes[:, 0], quants, strict=True):
        runs = results["runs"][quant]
        for row, scenario in enumerate(["words", "sentence", "full"]):
            rep = runs[scenario][0]
            y = 2 - row
            ax.plot(rep["tokens"], [y + 0.3] * len(rep["tokens"]), "|", color="grey", markersize=6)
            end = 0.0
            for c in rep["chunks"]:  # played from its arrival, or when the audio before it ends
                start = max(c["t_s"], end)
                ax.barh(y, c["audio_s"], left=start, height=0.35, color=f"C{row}", edgecolor="white", lw=0.3)
                ax.plot([c["t_s"]], [y - 0.25], "^", color="black", markersize=2)
                end = start + c["audio_s"]
            ax.text(-0.05, y, scenario, ha="right", va="center")
        ax.set_yticks([])
        ax.set_xlim(left=-0.6)
        ax.set_xlabel(
            "seconds after the first token (grey: tokens arriving; bars: audio chunks as played; ^: arrival)"
        )
        ax.set_title(
            f"{results['size']} {quant}: {results['tokens']} tokens at {results['tokens_per_s']:g}/s"
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
