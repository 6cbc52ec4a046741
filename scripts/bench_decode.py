"""Per-frame decode benchmark: talker step + code predictor, before/after as ratios, vs bandwidth.

Each measurement runs in its own subprocess (``--worker``) so that a baseline revision of the source
(``--baseline REV``: ``src/`` of that git revision, extracted to a temporary folder) and the working
tree can be timed in the same run, interleaved rep by rep (the machine is shared: absolute numbers are
noisy, ratios less so). Also prints the bytes of weights read per frame divided by the frame time next
to the matrix-vector bandwidth of this machine (a float32 2048->8192 product of one row, in a loop:
one matrix, which a large L3 holds, and 16 distinct ones, 1 GiB, which only DRAM does; the fastest of
``F.linear``, the blocks-in-one-bmm kernel and voxcast's packed float32 row kernel) and the plain read
bandwidth, and
with ``--streams 1,2,4`` the aggregate frames/s of batched decoding (working tree only).

    python scripts/bench_decode.py [--size tiny|0.6b] [--frames 20] [--reps 2] [--baseline HEAD~3]
        [--streams 1,2,4] [--quant none|int8] [--int8-kernel auto|pytorch|voxcast|voxcast-VARIANT|both]
        [--fused-ops auto|on|off|both] [--f32-rows auto|on|off|both] [--threads N]

Writes ``bench-results/decode-<size>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Distinct 64 MiB weights the DRAM bandwidth figure cycles through (1 GiB: beyond any L3 here).
_DRAM_MATRICES = 16
TEXT = "Thank you for calling. Your order has shipped and will arrive on Tuesday afternoon, as promised."


def checkpoint(size: str) -> Path:
    """The cached random checkpoint (custom_voice for tiny, base for full size)."""
    kind = "custom_voice" if size == "tiny" else "base"
    out = ROOT / ".cache" / "bench-models" / f"{size}-{kind}"
    if not (out / "config.json").exists():
        sys.path.insert(0, str(ROOT / "src"))
        from voxcast.testing.qwen3_tts import make_test_model

        print(f"building random {size} {kind} checkpoint in {out} ...", flush=True)
        tmp = out.with_name(out.name + ".tmp")
        make_test_model(tmp, kind, size=size, seed=0)
        tmp.rename(out)
    return out


# ---------------------------------------------------------------------------------------- worker


class _XVoice:
    """A minimal x-vector-only voice (the Base model's prompt needs a voice)."""

    def __init__(self, dim: int) -> None:
        import torch

        g = torch.Generator().manual_seed(3)
        self.x_vector = torch.randn(dim, generator=g) * 0.1
        self.ref_codes = None
        self.ref_text = None
        self.model_identity = ""


def _weight_bytes(model: Any) -> int:
    """Bytes of weights read by one frame: talker layers + norm + codec head, 15x the code predictor."""
    t = model.talker
    cp = t.code_predictor

    def size(mod: Any) -> int:
        total = 0
        for p in list(mod.parameters()):
            total += p.numel() * p.element_size()
        for m in mod.modules():  # int8 (dynamically quantized) Linears keep packed weights
            if m.__class__.__name__ == "Linear" and callable(getattr(m, "weight", None)):
                total += m.weight().numel()
                if m.bias() is not None:
                    total += m.bias().numel() * 4
        return total

    talker = size(t.model.layers) + size(t.model.norm) + size(t.codec_head)
    cp_body = size(cp.model.layers) + size(cp.model.norm) + size(cp.small_to_mtp_projection)
    return talker + cp.num_codes * cp_body + size(cp.lm_head)


def _prompt(model: Any) -> Any:
    if model.model_type == "base":
        voice = _XVoice(model.talker.cfg.hidden_size)
        return model.build_prompt(TEXT, voice=voice, language="english")
    return model.build_prompt(TEXT, speaker=model.speakers[0], language="english")


def teacher_forced_agreement(model: Any, prompt: Any, codes: list[list[int]]) -> dict[str, float]:
    """Top-1 agreement of ``model`` with reference greedy ``codes``, every choice made on the reference history.

    Free-running codes stop agreeing at the first differing choice (on random weights, whose logits are
    nearly flat, that is the first frame), which says little about how often the two models choose
    alike. Here both see the same history: the talker runs once over the prompt plus the reference
    frames, the code predictor once per reference frame, and each greedy choice (the talker's with its
    repetition penalty and masks, on the reference history) is compared with the reference code.
    """
    import torch

    from voxcast.models.qwen3_tts.sampling import SamplerSettings, TalkerSampler

    t = model.talker
    cp = t.code_predictor
    ref = torch.tensor(codes, dtype=torch.long)  # [N, 16]
    n, length = ref.shape[0], prompt.length
    with torch.inference_mode():
        code0 = t.codec_embed(ref[:, :1])  # [N, 1, H]
        frames = cp.frame_embed(code0, ref[:, 1:])  # [N, 1, H]
        steps = [prompt.embeds]
        for j in range(n - 1):
            text = prompt.trailing[:, j : j + 1] if j < prompt.trailing.shape[1] else prompt.pad
            steps.append(frames[j : j + 1] + text)
        embeds = torch.cat(steps, dim=1)
        hidden, logits = t(embeds, t.new_cache(embeds.shape[1]), 0)
        cfg = t.cfg
        sampler = TalkerSampler(
            cfg.vocab_size, cfg.codec_eos_token_id, SamplerSettings(greedy=True), torch.Generator()
        )
        talker_hits = cp_hits = 0
        for j in range(n):
            want = int(ref[j, 0])
            talker_hits += int(sampler.scores(logits[:, length - 1 + j].float()).argmax(-1).item() == want)
            sampler._seen[0, want] = True
            sampler.samples += 1
            parts = [hidden[:, length - 1 + j : length + j], code0[j : j + 1]]
            parts += [
                cp.model.codec_embedding[g](ref[j : j + 1, g + 1 : g + 2]) for g in range(cp.num_codes - 1)
            ]
            out = cp._forward(torch.cat(parts, dim=1), cp.new_cache(), 0)  # [1, 16, cp_hidden]
            for g in range(cp.num_codes):
                cp_hits += int(cp.lm_head[g](out[:, g + 1]).argmax(-1).item() == int(ref[j, g + 1]))
    return {
        "talker_top1": talker_hits / n,
        "code_predictor_top1": cp_hits / (n * cp.num_codes),
        "all_top1": (talker_hits + cp_hits) / (n * (1 + cp.num_codes)),
    }


def _use_traced_steps(model: Any) -> None:
    """Recorded steps, in this revision's API or a baseline revision's (methods on the layers)."""
    try:
        from voxcast.models.qwen3_tts.accel.cp_trace import use_traced_steps
        from voxcast.models.qwen3_tts.accel.talker_trace import use_traced_step
    except ImportError:
        model.talker.code_predictor.use_traced_steps()
        if hasattr(model.talker, "use_traced_step"):  # the talker's steps (later revisions)
            model.talker.use_traced_step()
        return
    use_traced_steps(model.talker.code_predictor)
    use_traced_step(model.talker)


def _use_static_decode(model: Any) -> None:
    """Compiled steps, in this revision's API or a baseline revision's."""
    try:
        from voxcast.models.qwen3_tts.accel.graphs import use_static_decode
    except ImportError:
        model.talker.use_static_decode()
        return
    use_static_decode(model.talker)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from voxcast.engine.request import SamplingParams
    from voxcast.models.qwen3_tts.model import Qwen3TTS

    kw: dict[str, Any] = {}
    if args.quant != "none":
        kw["quant"] = args.quant
    if args.rows_kernel != "auto":
        kw["onednn_rows"] = args.rows_kernel == "onednn"
    if args.quant == "int8" and args.int8_kernel != "auto":
        kw["int8_kernel"] = args.int8_kernel != "pytorch"
        if args.int8_kernel.startswith("voxcast-"):
            kw["int8_variant"] = args.int8_kernel.removeprefix("voxcast-")
    if args.fused_ops != "auto":  # (older sources have no such option)
        kw["fused_ops"] = args.fused_ops == "on"
    if args.f32_rows != "auto":  # (older sources have no such option)
        kw["f32_rows"] = args.f32_rows == "on"
    model = Qwen3TTS.from_pretrained(args.model, **kw)
    out: dict[str, Any] = {"weight_bytes_per_frame": _weight_bytes(model)}
    out["int8_kernel"] = getattr(model, "int8_kernel", None)
    out["int8_kernel_timing"] = getattr(model, "int8_kernel_timing", None)
    out["int8_variant"] = getattr(model, "int8_variant", None)
    out["onednn_rows"] = getattr(model, "onednn_rows", None)
    out["rows_kernel"] = getattr(model, "rows_kernel", None)
    out["row_parts"] = getattr(model, "row_parts", None)
    out["row_kernel"] = getattr(model, "row_kernel", None)
    out["f32_rows"] = getattr(model, "f32_rows", None)
    prompt = _prompt(model)
    if args.trace:
        t0 = time.perf_counter()
        _use_traced_steps(model)
        model.prepare_batches(int(args.streams or 1))
        out["trace_s"] = time.perf_counter() - t0
    if args.compile:
        t0 = time.perf_counter()
        _use_static_decode(model)
        gen = model.new_generator(prompt, SamplingParams(seed=5, greedy=args.greedy), max_frames=3)
        while gen.step() is not None:  # compile every graph (talker step, both code-predictor steps)
            pass
        out["compile_s"] = time.perf_counter() - t0
    sampling = SamplingParams(seed=5, greedy=args.greedy)
    warm = 2
    streams = int(args.streams or 1)
    if not args.batched:
        gen = model.new_generator(prompt, sampling, max_frames=args.frames + warm)
        gen.prefill()
        for _ in range(warm):
            gen.step()
        t_talker, t_cp = gen.talker_s, gen.code_predictor_s
        t0 = time.perf_counter()
        n = 0
        codes, times = [], []
        while True:
            t1 = time.perf_counter()
            frame = gen.step()
            if frame is None:
                break
            times.append(time.perf_counter() - t1)
            codes.append(frame.tolist())
            n += 1
        wall = time.perf_counter() - t0
        out.update(
            frames=n,
            # the median frame: robust to other processes' bursts on a shared machine
            frame_ms=statistics.median(times) * 1000 if times else 0.0,
            mean_frame_ms=wall / max(n, 1) * 1000,
            talker_ms=(gen.talker_s - t_talker) / max(n, 1) * 1000,
            code_predictor_ms=(gen.code_predictor_s - t_cp) / max(n, 1) * 1000,
            codes=codes,
        )
        if args.ref_codes:
            ref = json.loads(Path(args.ref_codes).read_text())
            out["teacher_forced"] = teacher_forced_agreement(model, prompt, ref)
        return out
    from voxcast.models.qwen3_tts.generator import step_many

    gens = []
    for i in range(streams):
        g = model.new_generator(prompt, SamplingParams(seed=5 + i, greedy=args.greedy), args.frames + warm)
        g.prefill()
        gens.append(g)
    for _ in range(warm):
        step_many(gens)
    t0 = time.perf_counter()
    n = 0
    steps = []
    while True:
        t1 = time.perf_counter()
        frames = step_many(gens)
        got = sum(f is not None for f in frames)
        if not got:
            break
        if got == streams:
            steps.append(time.perf_counter() - t1)
        n += got
    wall = time.perf_counter() - t0
    step_s = statistics.median(steps)  # a full round: every stream advances one frame
    out.update(streams=streams, frames=n, wall_s=wall, frames_per_s=streams / step_s)
    out["per_stream_frame_ms"] = step_s * 1000
    return out


def bandwidth(threads: int, seconds: float = 1.5, matrices: int = 1) -> dict[str, float]:
    """Bandwidths in GB/s over float32 2048->8192 weights (64 MiB each), one row at a time.

    ``linear``: ``F.linear`` at M=1 (MKL's matrix-vector product: one thread whatever the pool);
    ``blocks``: the same product as one block of outputs per thread in one bmm (the kernel the model
    uses for one row where it is faster, :func:`voxcast.kernels.rows_linear.split_linear`);
    ``read``: a plain read of the same weights (``Tensor.sum``), what the memory gives at all;
    ``packed``: voxcast's float32 row kernel on packed weights (:mod:`voxcast.models.qwen3_tts.accel.f32_rows`).
    ``matrices`` > 1 cycles through that many distinct weights, so that the working set outgrows
    the last-level cache the way a frame's 6.6 GB of weights do: one 64 MiB matrix stays in a large
    L3 (105-260 MB on this project's Intel machines) and measures the cache, not DRAM.
    """
    import torch
    import torch.nn.functional as F

    try:
        from voxcast.kernels.rows_linear import split_linear
    except ImportError:  # a baseline revision before voxcast.kernels
        from voxcast.models.qwen3_tts.rows_linear import split_linear  # type: ignore[no-redef]

    if threads:
        torch.set_num_threads(threads)
    parts = max(2, torch.get_num_threads())
    weights = [torch.randn(8192, 2048) for _ in range(matrices)]
    x = torch.randn(1, 2048)
    kernels = {
        "linear": lambda w: F.linear(x, w),
        "blocks": lambda w: split_linear(x, w, None, parts),
        "read": lambda w: w.sum(),
    }
    try:  # voxcast's float32 row kernel on packed weights (later sources; where it builds)
        try:
            from voxcast.models.qwen3_tts.accel import f32_rows
        except ImportError:  # a baseline revision before the accel package
            from voxcast.models.qwen3_tts import f32_rows  # type: ignore[no-redef]

        if f32_rows.available():
            packs = {id(w): f32_rows.pack(w) for w in weights}
            kernels["packed"] = lambda w: f32_rows.packed_linear(x, packs[id(w)])
    except ImportError:
        pass
    out = {}
    with torch.inference_mode():
        for name, fn in kernels.items():
            for w in weights:
                fn(w)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / len(kernels):
                for w in weights:
                    fn(w)
                n += 1
            dt = (time.perf_counter() - t0) / (n * matrices)
            out[name] = weights[0].numel() * 4 / dt / 1e9
    return out


# ---------------------------------------------------------------------------------------- driver


def _extract(rev: str, dest: Path) -> Path:
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar.stdout, check=True)
    return dest / "src"


def _run(
    src: Path,
    model: Path,
    args: argparse.Namespace,
    streams: int = 1,
    quant: str = "none",
    batched: bool = False,
    ref_codes: Path | None = None,
    compile: bool = False,
    trace: bool = False,
    rows_kernel: str = "auto",
    int8_kernel: str = "auto",
    fused_ops: str = "auto",
    f32_rows: str = "auto",
) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", str(model), "--frames", str(args.frames)]
    cmd += ["--streams", str(streams), "--threads", str(args.threads), "--quant", quant]
    if batched:
        cmd.append("--batched")
    if ref_codes is not None:
        cmd += ["--ref-codes", str(ref_codes)]
    if compile:
        cmd.append("--compile")
    if trace:
        cmd.append("--trace")
    if rows_kernel != "auto":
        cmd += ["--rows-kernel", rows_kernel]
    if int8_kernel != "auto":
        cmd += ["--int8-kernel", int8_kernel]
    if fused_ops != "auto":
        cmd += ["--fused-ops", fused_ops]
    if f32_rows != "auto":
        cmd += ["--f32-rows", f32_rows]
    if args.greedy:
        cmd.append("--greedy")
    env = dict(os.environ, PYTHONPATH=str(src))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"worker failed:\n{res.stderr[-3000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _batched_runs(args: argparse.Namespace, cur: Path, model: Path) -> list[dict[str, Any]]:
    """Batched runs at each ``--streams`` level; ``--rows-kernel both`` alternates aten and oneDNN,
    ``--f32-rows both`` voxcast's float32 row kernels (as measured at load) and PyTorch's."""
    kernels = ["aten", "onednn"] if args.rows_kernel == "both" else [args.rows_kernel]
    f32s = ["auto", "off"] if args.f32_rows == "both" else [args.f32_rows]
    arms = [(k, f) for k in kernels for f in f32s]
    label = {a: " ".join(x for x in (a[0], f"f32-rows {a[1]}" if len(f32s) > 1 else "") if x) for a in arms}
    rows: list[dict[str, Any]] = []
    base: dict[str, float] = {}
    for s in (int(x) for x in args.streams.split(",")):
        runs: dict[str, list[dict]] = {label[a]: [] for a in arms}
        for rep in range(args.reps):
            for k, f in arms if rep % 2 == 0 else arms[::-1]:
                r = _run(
                    cur,
                    model,
                    args,
                    s,
                    args.batch_quant,
                    True,
                    trace=args.trace,
                    rows_kernel=k,
                    int8_kernel="auto" if args.int8_kernel == "both" else args.int8_kernel,
                    f32_rows=f,
                )
                runs[label[(k, f)]].append(r)
        for k, rs in runs.items():
            fps = _median(rs, "frames_per_s")
            base.setdefault(k, fps)
            per = _median(rs, "per_stream_frame_ms")
            on = rs[0].get("onednn_rows")
            rows.append(
                {
                    "streams": s,
                    "rows_kernel": k,
                    "onednn_rows": on,
                    "f32_rows": rs[0].get("f32_rows"),
                    "frames_per_s": fps,
                    "per_stream_frame_ms": per,
                }
            )
            print(
                f"{s} streams ({k}, oneDNN rows {on}): {fps:.2f} frames/s aggregate "
                f"({fps / base[k]:.2f}x), {per:.1f} ms/frame/stream",
                flush=True,
            )
        if len(kernels) == 2 and len(f32s) == 1:
            ratio = _median(runs["onednn"], "frames_per_s") / _median(runs["aten"], "frames_per_s")
            rows[-1]["onednn_vs_aten"] = ratio
            print(f"{s} streams: oneDNN rows / PyTorch's rows = {ratio:.2f}x frames/s", flush=True)
        if len(f32s) == 2 and len(kernels) == 1:
            on_off = [_median(runs[label[(kernels[0], f)]], "frames_per_s") for f in f32s]
            rows[-1]["f32_rows_vs_off"] = on_off[0] / on_off[1]
            print(
                f"{s} streams: float32 row kernels / PyTorch's = {on_off[0] / on_off[1]:.2f}x frames/s",
                flush=True,
            )
    return rows


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


#: voxcast's int8 kernel variants (``int8_kernel.VARIANTS``, named here because a worker may run an
#: older source that has fewer).
_KERNEL_VARIANTS = ("vnni", "avx2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="tiny", help="tiny | 0.6b")
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--baseline", default=None, help="git revision to compare against (e.g. HEAD~3)")
    p.add_argument("--streams", default="", help="batched runs, e.g. 1,2,4")
    p.add_argument("--quant", default="none", help="also time this weight quantization (int8)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--batch-quant", default="none", help="weights of the batched runs (none | int8)")
    p.add_argument("--greedy", action="store_true")
    p.add_argument(
        "--trace",
        action="store_true",
        help="time recorded talker and code-predictor steps (VOXCAST_TRACE_STEPS)",
    )
    p.add_argument(
        "--compile", action="store_true", help="also time compiled static-shape steps (VOXCAST_COMPILE)"
    )
    p.add_argument(
        "--rows-kernel",
        default="auto",
        choices=["auto", "aten", "onednn", "both"],
        help="float32 batched rows: measured at load (auto), PyTorch's BLAS, oneDNN, or both alternated",
    )
    p.add_argument(
        "--int8-kernel",
        default="auto",
        choices=["auto", "pytorch", "voxcast", *(f"voxcast-{v}" for v in _KERNEL_VARIANTS), "both"],
        help="int8 decode rows: measured at load (auto), fbgemm, voxcast's kernel (its fastest variant, "
        "or the one named), or fbgemm and every variant this CPU runs, timed (both)",
    )
    p.add_argument(
        "--fused-ops",
        default="auto",
        choices=["auto", "on", "off", "both"],
        help="norms, rotary embeddings and decode attention as voxcast's fused operations: the model's "
        "default (auto: with int8 weights), on, off, or each int8 arm both ways (both)",
    )
    p.add_argument(
        "--f32-rows",
        default="auto",
        choices=["auto", "on", "off", "both"],
        help="float32 decode rows on voxcast's BLAS-order kernels (VOXCAST_F32_ROWS): measured at load "
        "(auto), on, off, or the float32 arms both ways (both: an extra 'f32-rows off' arm)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batched", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ref-codes", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    model = checkpoint(args.size)
    cur = ROOT / "src"
    # name -> (source, weight quantization, int8 kernel)
    variants: dict[str, tuple[Path, str, str]] = {"current": (cur, "none", "auto")}
    if args.compile:
        variants["compiled"] = (cur, "none", "auto")
    if args.trace:
        variants["traced"] = (cur, "none", "auto")
    tmp = tempfile.TemporaryDirectory()
    if args.baseline:
        variants = {"baseline": (_extract(args.baseline, Path(tmp.name)), "none", "auto"), **variants}
    if args.quant != "none" and args.int8_kernel == "both":
        variants[f"{args.quant} fbgemm"] = (cur, args.quant, "pytorch")
        from voxcast.kernels import native as int8_kernel

        for v in int8_kernel.variants():  # every variant this CPU runs, the default first
            variants[f"{args.quant} voxcast-{v}"] = (cur, args.quant, f"voxcast-{v}")
    elif args.quant != "none":
        variants[args.quant] = (cur, args.quant, args.int8_kernel)
        if args.baseline:  # the quantized arm of the baseline revision too, for its ratio
            variants[f"baseline {args.quant}"] = (variants["baseline"][0], args.quant, args.int8_kernel)
    fused = {k: "auto" for k in variants}
    if args.fused_ops == "both":  # each quantized arm again without the fused operations
        for name in [k for k, v in variants.items() if v[1] != "none"]:
            variants[f"{name} unfused"] = variants[name]
            fused[f"{name} unfused"] = "off"
    elif args.fused_ops != "auto":
        fused = {k: args.fused_ops for k in variants}
    f32 = {k: "auto" if args.f32_rows == "both" else args.f32_rows for k in variants}
    if args.f32_rows == "both":  # the float32 arms again with PyTorch's kernels
        for name in [k for k, v in variants.items() if v[1] == "none" and k != "baseline"]:
            variants[f"{name} f32-rows off"] = variants[name]
            f32[f"{name} f32-rows off"] = "off"
    rows: dict[str, list[dict]] = {k: [] for k in variants}
    bw, bw_dram = [], []
    for rep in range(args.reps):
        bw.append(bandwidth(args.threads))
        bw_dram.append(bandwidth(args.threads, seconds=3.0, matrices=_DRAM_MATRICES))
        for name, (src, quant, kernel) in variants.items():
            ref = None
            if quant != "none" and rep == 0 and args.greedy:  # fp32 greedy codes as the reference
                ref = Path(tmp.name) / "ref-codes.json"
                ref.write_text(json.dumps(rows["current"][0]["codes"]))
            if name == "compiled" and rep == 0 and args.greedy:
                ref = Path(tmp.name) / "ref-codes.json"
                ref.write_text(json.dumps(rows["current"][0]["codes"]))
            trace = args.trace and name.split(" f32-rows")[0] not in ("current", "baseline", "compiled")
            r = _run(
                src,
                model,
                args,
                quant=quant,
                ref_codes=ref,
                compile=name == "compiled",
                trace=trace,
                int8_kernel=kernel,
                fused_ops=fused.get(name, "auto"),
                f32_rows=f32[name],
            )
            rows[name].append(r)
            print(f"rep {rep} {name:14s} {r['frame_ms']:8.1f} ms/frame ({r['frames']} frames)", flush=True)
    one = {k: statistics.median(b[k] for b in bw) for k in bw[0]}
    many = {k: statistics.median(b[k] for b in bw_dram) for k in bw_dram[0]}
    # The matrix-vector figure is the faster of the two kernels (the one the model uses).
    gbps = max(v for k, v in one.items() if k != "read")
    dram = max(v for k, v in many.items() if k != "read")
    result: dict[str, Any] = {
        "size": args.size,
        "frames": args.frames,
        "bandwidth_gbps": gbps,
        "bandwidth_dram_gbps": dram,
        "bandwidth_one_matrix": one,
        "bandwidth_dram": many,
        "variants": {},
    }
    print(
        f"\nmatrix-vector bandwidth (2048->8192, one row): {gbps:.2f} GB/s one 64 MiB matrix, "
        f"{dram:.2f} GB/s cycling {_DRAM_MATRICES} ({_DRAM_MATRICES * 64} MiB, beyond the cache); "
        f"from DRAM: F.linear {many['linear']:.2f}, blocks in one bmm {many['blocks']:.2f}, "
        f"plain read (Tensor.sum) {many['read']:.2f} GB/s"
        + (f", voxcast's packed float32 rows {many['packed']:.2f} GB/s" if "packed" in many else "")
    )
    for name, rs in rows.items():
        wb = rs[0]["weight_bytes_per_frame"]
        fm = _median(rs, "frame_ms")
        eff = wb / (fm / 1000) / 1e9
        summary = {
            "frame_ms": fm,
            "talker_ms": _median(rs, "talker_ms"),
            "code_predictor_ms": _median(rs, "code_predictor_ms"),
            "weight_bytes_per_frame": wb,
            "effective_gbps": eff,
            "bandwidth_limit_ms": wb / (gbps * 1e9) * 1000,
            "bandwidth_limit_dram_ms": wb / (dram * 1e9) * 1000,
            "read_limit_ms": wb / (many["read"] * 1e9) * 1000,
            "runs": [{k: v for k, v in r.items() if k != "codes"} for r in rs],
        }
        result["variants"][name] = summary
        print(
            f"{name:14s} frame {fm:8.2f} ms (talker {summary['talker_ms']:.2f}, code predictor "
            f"{summary['code_predictor_ms']:.2f}); weights {wb / 1e6:.1f} MB/frame -> {eff:.2f} GB/s "
            f"(limit {summary['bandwidth_limit_ms']:.1f} ms/frame; "
            f"{summary['bandwidth_limit_dram_ms']:.1f} at the DRAM figure, "
            f"{summary['read_limit_ms']:.1f} at the plain read)"
        )
    if "baseline" in rows:
        ratio = result["variants"]["baseline"]["frame_ms"] / result["variants"]["current"]["frame_ms"]
        same = rows["baseline"][0]["codes"] == rows["current"][0]["codes"]
        result["speedup_vs_baseline"] = ratio
        result["codes_identical_to_baseline"] = same
        print(f"speed-up vs {args.baseline}: {ratio:.2f}x; codes identical: {same}")
    if f"baseline {args.quant}" in rows and args.quant in rows:
        base_q, cur_q = rows[f"baseline {args.quant}"], rows[args.quant]
        ratio = (
            result["variants"][f"baseline {args.quant}"]["frame_ms"]
            / result["variants"][args.quant]["frame_ms"]
        )
        same = base_q[0]["codes"] == cur_q[0]["codes"]
        result[f"{args.quant}_speedup_vs_baseline"] = ratio
        result[f"{args.quant}_codes_identical_to_baseline"] = same
        print(f"{args.quant} speed-up vs {args.baseline}: {ratio:.2f}x; codes identical: {same}")
    for name, (_, quant, _) in variants.items():
        if quant == "none":
            continue
        a, b = rows["current"][0]["codes"], rows[name][0]["codes"]
        flat = [(x == y) for fa, fb in zip(a, b, strict=False) for x, y in zip(fa, fb, strict=False)]
        agree = sum(flat) / max(len(flat), 1)
        first = next((i for i, (fa, fb) in enumerate(zip(a, b, strict=False)) if fa != fb), None)
        result.setdefault("quant_agreements", {})[name] = {
            "code_agreement": agree,
            "first_divergent_frame": first,
        }
        print(f"{name} vs fp32 codes, free-running: agreement {agree:.3f}, first divergent frame {first}")
        tf = rows[name][0].get("teacher_forced")
        if tf:
            result["quant_agreements"][name]["teacher_forced"] = tf
            print(
                f"{name} vs fp32 greedy, teacher-forced top-1: talker {tf['talker_top1']:.3f}, "
                f"code predictor {tf['code_predictor_top1']:.3f}, all {tf['all_top1']:.3f}"
            )
    for name in [k for k in rows if k.endswith(" f32-rows off")]:
        on, off = rows[name.removesuffix(" f32-rows off")], rows[name]
        per_rep = statistics.median(a["frame_ms"] / b["frame_ms"] for a, b in zip(on, off, strict=True))
        same = on[0]["codes"] == off[0]["codes"]
        result.setdefault("f32_rows", {})[name.removesuffix(" f32-rows off")] = {
            "ratio": per_rep,
            "codes_identical": same,
            "choice": on[0].get("f32_rows"),
        }
        print(
            f"{name.removesuffix(' f32-rows off')}: float32 row kernels {per_rep:.3f}x the frame time without "
            f"(median per rep); codes identical: {same}"
        )
    for name in [k for k in rows if k.endswith(" unfused")]:
        on, off = rows[name.removesuffix(" unfused")], rows[name]
        per_rep = statistics.median(a["frame_ms"] / b["frame_ms"] for a, b in zip(on, off, strict=True))
        result.setdefault("fused_ops", {})[name.removesuffix(" unfused")] = per_rep
        print(
            f"{name.removesuffix(' unfused')}: fused operations {per_rep:.3f}x the frame time without (median per rep)"
        )
    if args.quant in result.get("quant_agreements", {}):  # the key earlier results used
        result["quant_agreement"] = result["quant_agreements"][args.quant]
    if "traced" in rows:
        ratio = result["variants"]["current"]["frame_ms"] / result["variants"]["traced"]["frame_ms"]
        same = rows["traced"][0]["codes"] == rows["current"][0]["codes"]
        result["traced"] = {
            "speedup": ratio,
            "codes_identical": same,
            "trace_s": _median(rows["traced"], "trace_s"),
        }
        print(f"recorded talker and code-predictor steps: {ratio:.2f}x per frame; codes identical: {same}")
    if "compiled" in rows:
        ratio = result["variants"]["current"]["frame_ms"] / result["variants"]["compiled"]["frame_ms"]
        comp = {"speedup": ratio, "compile_s": _median(rows["compiled"], "compile_s")}
        tf = rows["compiled"][0].get("teacher_forced")
        if tf:
            comp["teacher_forced"] = tf
        result["compiled"] = comp
        print(
            f"compiled static steps: {ratio:.2f}x per frame, compile {comp['compile_s']:.1f} s; agreement {tf}"
        )
    if args.streams:
        result["batched"] = _batched_runs(args, cur, model)
        result["batched_quant"] = args.batch_quant
    out = ROOT / "bench-results" / f"decode-{args.size}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
