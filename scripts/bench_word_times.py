"""How close the estimated word timestamps (voxcast.audio.word_times) come to true ones, on real speech.

Neither of voxcast's models says when a word is spoken, and no model weights or recorded speech reach
this host, so the truth comes from a speech synthesizer that does say it: eSpeak NG (``apt install
espeak-ng``), whose library reports each word's start in its audio as it synthesizes. Every text is
spoken by eSpeak, its audio goes through the estimator, and each word's estimated start is compared
with eSpeak's. eSpeak's speech is not a neural model's (faster, flatter, its pauses tidier), so the
figures say how the estimator does on speech with real phonetics and real pauses, not on Qwen3-TTS.

    python scripts/bench_word_times.py                 # texts below, 3 speaking rates
    python scripts/bench_word_times.py --out docs/results/xeon-amx/word-times.json

Prints, per rate and in all: words, median and 90th-percentile start error (ms), the share within 50
and 100 ms, and the same for proportional spreading alone (no pauses: what the estimator improves on);
then the same for texts with numbers written as digits (``NUMBER_TEXTS``), apart.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import machine_info, use_checkout, write_json

use_checkout()

from voxcast.audio.word_times import estimate_word_times  # noqa: E402
from voxcast.text.words import split_words  # noqa: E402

TEXTS = [
    "Thanks for calling Acme support. Your order number 4471 shipped on Tuesday, and it should arrive "
    "within three business days.",
    "If you need anything else, press one; otherwise, stay on the line and an agent will be with you "
    "shortly.",
    "Sure, I can help with that. Which account would you like to check, your savings or your checking?",
    "The quarterly report shows revenue of twelve million dollars, up eight percent from last year, while "
    "costs stayed flat.",
    "Please have your card ready. For security reasons, we will ask for the last four digits of your "
    "social security number.",
    "Good morning! The weather today is sunny with a high of seventy two degrees, and a light breeze "
    "from the west.",
]

NUMBER_TEXTS = [
    "Your balance is 342 dollars and 15 cents, due on March 3. Your account number ends in 8812.",
    "We have 12 seats left on flight 417, departing at 9 fifteen from gate 22.",
    "Press 1 for sales, 2 for support, or 0 to speak with an operator. Our hours are 8 to 6.",
    "The total comes to 1250 dollars. In 2024 we shipped 36 orders to 14 countries.",
    "Your confirmation code is 58213, and your table for 4 is ready at 7.",
]
"""Texts with numbers written as digits (amounts, times, codes), measured apart: how long a number
takes to say is the estimator's least certain guess."""

_WORD, _LIST_END = 1, 0
_SYNCHRONOUS = 2
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


class Espeak:
    """eSpeak NG's library, synchronous: a text's samples and its words' (1-based position, start ms)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        self.lib = ctypes.CDLL(name)
        self.rate = self.lib.espeak_Initialize(_SYNCHRONOUS, 0, None, 0)
        if self.rate <= 0:
            raise RuntimeError("espeak_Initialize failed")
        self._samples: list[np.ndarray] = []
        self._words: list[tuple[int, int]] = []
        self._cb = _CALLBACK(self._callback)  # kept alive while the library holds it
        self.lib.espeak_SetSynthCallback(self._cb)

    def _callback(self, wav: Any, n: int, events: Any) -> int:
        if n > 0:
            self._samples.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        ev = ctypes.cast(events, ctypes.POINTER(_Event))
        i = 0
        while ev[i].type != _LIST_END:
            if ev[i].type == _WORD:
                self._words.append((ev[i].text_position, ev[i].audio_position))
            i += 1
        return 0

    def speak(self, text: str, words_per_minute: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        self._samples, self._words = [], []
        self.lib.espeak_SetParameter(1, words_per_minute, 0)  # espeakRATE, absolute
        data = text.encode("utf-8") + b"\0"
        if self.lib.espeak_Synth(data, len(data), 0, 1, 0, 0, None, None) != 0:  # POS_CHARACTER
            raise RuntimeError("espeak_Synth failed")
        pcm = np.concatenate(self._samples) if self._samples else np.zeros(0, np.int16)
        return pcm.astype(np.int16), list(self._words)


def _proportional(text: str, pcm: np.ndarray, rate: int) -> list[float]:
    """Start times with the pauses ignored: the words spread over the clip's speech by weight alone."""
    silent = np.zeros(len(pcm), np.float32)  # the estimator's fallback for a clip without speech...
    est = estimate_word_times(text, silent, rate)
    x = np.abs(pcm.astype(np.float32))
    loud = np.nonzero(x > x.max() * 0.01)[0]
    t0, t1 = 1000 * loud[0] / rate, 1000 * loud[-1] / rate  # ...put over the speech's span
    clip = 1000 * len(pcm) / rate
    return [t0 + (t1 - t0) * e.start_ms / clip for e in est]


def _errors(espeak: Espeak, text: str, wpm: int) -> tuple[list[float], list[float]]:
    pcm, events = espeak.speak(text, wpm)
    words = split_words(text)
    starts = {pos - 1: ms for pos, ms in events}  # 0-based character -> ms
    est = estimate_word_times(text, pcm, espeak.rate)
    flat = _proportional(text, pcm, espeak.rate)
    ours, plain = [], []
    for w, e, f in zip(words, est, flat, strict=True):
        truth = next((starts[c] for c in range(w.start, w.end) if c in starts), None)
        if truth is not None:
            ours.append(abs(e.start_ms - truth))
            plain.append(abs(f - truth))
    return ours, plain


def _summary(errors: list[float]) -> dict[str, float]:
    e = np.asarray(errors)
    return {
        "words": len(e),
        "median_ms": round(float(np.median(e)), 1),
        "p90_ms": round(float(np.percentile(e, 90)), 1),
        "within_50ms": round(float(np.mean(e <= 50)), 3),
        "within_100ms": round(float(np.mean(e <= 100)), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="140,175,220", help="eSpeak speaking rates, words a minute")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    try:
        espeak = Espeak()
    except (OSError, RuntimeError) as e:
        print(f"eSpeak NG's library is needed (apt install espeak-ng): {e}", file=sys.stderr)
        return 2
    runs: dict[str, Any] = {}
    all_ours: list[float] = []
    all_plain: list[float] = []
    for wpm in (int(r) for r in args.rates.split(",")):
        ours: list[float] = []
        plain: list[float] = []
        for text in TEXTS:
            o, p = _errors(espeak, text, wpm)
            ours += o
            plain += p
        runs[str(wpm)] = {"estimator": _summary(ours), "proportional": _summary(plain)}
        all_ours += ours
        all_plain += plain
        print(
            f"{wpm} wpm: estimator {runs[str(wpm)]['estimator']}  proportional {runs[str(wpm)]['proportional']}"
        )
    total = {"estimator": _summary(all_ours), "proportional": _summary(all_plain)}
    print(f"all: estimator {total['estimator']}  proportional {total['proportional']}")
    numbers: list[float] = []
    numbers_plain: list[float] = []
    for wpm in (int(r) for r in args.rates.split(",")):
        for text in NUMBER_TEXTS:
            o, p = _errors(espeak, text, wpm)
            numbers += o
            numbers_plain += p
    total["numbers"] = {"estimator": _summary(numbers), "proportional": _summary(numbers_plain)}
    print(
        f"numbers: estimator {total['numbers']['estimator']}  proportional {total['numbers']['proportional']}"
    )
    if args.out:
        write_json(
            args.out, {"machine": machine_info(), "synthesizer": "espeak-ng", "rates": runs, "all": total}
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
