#!/usr/bin/env bash
# nari-labs' open TTS serving benchmark (tts_bench), run unmodified from its own source tree against
# `voxcast serve`: for each target and rate one `python -m tts_bench run`, then the harness's
# summary.json, report.txt and run.json copied to docs/results/<cpu>/ (docs/benchmarks.md, "The open
# serving benchmark"). The benchmark is not vendored: point TTS_BENCH_DIR at a checkout of it.
#
#     git clone https://github.com/nari-labs/benchmarks /tmp/nari-benchmarks
#     python3.12 -m venv /tmp/tb-venv && /tmp/tb-venv/bin/pip install aiohttp click jiwer numpy pydantic \
#         whisper-normalizer
#     TTS_BENCH_DIR=/tmp/nari-benchmarks TB_PYTHON=/tmp/tb-venv/bin/python bash scripts/run_tts_bench.sh
#
# Settings (environment; defaults in brackets):
#   TTS_BENCH_DIR   the benchmark's checkout (its tts_bench/src is put on PYTHONPATH) [required]
#   TB_PYTHON       Python >= 3.12 with the benchmark's dependencies [python3.12]
#   TB_PYTHONPATH   folders put on the benchmark's path only (its dependencies, if installed apart) []
#   VOXCAST_MODEL   the checkpoint served [a tiny random CustomVoice checkpoint whose speech ends,
#                   built once into .cache/tts-bench-model by voxcast make-test-model --ends-speech]
#   TB_TARGETS      any of vllm-omni, voxserve, nari (HTTP), nari-ws (--target nari --transport
#                   websocket: the nari.speech.v1 socket, one word every 10 ms) [vllm-omni voxserve nari-ws]
#   TB_RATES        target requests per second, one run each [1]
#   TB_WARMUP, TB_DURATION, TB_TIMEOUT, TB_ARRIVAL, TB_SEED   the harness's flags [5s, 30s, 120s, poisson, 0]
#   TB_DATASET      JSONL of {"id", "text"} [scripts/data/tts_bench_prompts.jsonl; the published runs
#                   used the harness's datasets/seed-tts-eval.jsonl, made by `bench dataset prepare`]
#   TB_VOICE, TB_LANGUAGE   [Ryan, English]
#   TB_MODEL_NAME   the requests' model field [the harness's default with VOXCAST_MODEL set, else
#                   voxcast-tiny-custom_voice]
#   TB_PARAMS       extra request fields, space-separated KEY=JSON (--request-param) [with the built
#                   tiny checkpoint: "seed=3 cache=false": a random model cannot read, and seed 3 ends
#                   every prompt of the default set by end of speech (1-9 s) where an unseeded
#                   request now and then runs to its frame limit; cache=false: no seeded repeat is
#                   served from the audio cache]
#   TB_OUT          the harness's output folders [bench-results/tts_bench]
#   TB_RESULTS      where the figures are copied, "" for nowhere [docs/results/<cpu>, named from lscpu]
#   TB_PORT         the server's port [8765]; VOXCAST_* settings pass through to the server (e.g.
#                   VOXCAST_THREADS, VOXCAST_ADMISSION, VOXCAST_DEVICE)
#   VOXCAST_CMD     how voxcast is run [voxcast, or python3 -m voxcast.serving.cli.main without it]
set -euo pipefail
cd "$(dirname "$0")/.."

: "${TTS_BENCH_DIR:?set TTS_BENCH_DIR to a checkout of nari-labs/benchmarks}"
[ -d "$TTS_BENCH_DIR/tts_bench/src/tts_bench" ] || { echo "run_tts_bench: no tts_bench/src in $TTS_BENCH_DIR" >&2; exit 2; }
TB_PYTHON=${TB_PYTHON:-python3.12}
TB_TARGETS=${TB_TARGETS:-vllm-omni voxserve nari-ws}
TB_RATES=${TB_RATES:-1}
TB_OUT=${TB_OUT:-bench-results/tts_bench}
TB_PORT=${TB_PORT:-8765}
TB_DATASET=$(realpath "${TB_DATASET:-scripts/data/tts_bench_prompts.jsonl}")
mkdir -p "$TB_OUT"
TB_OUT=$(realpath "$TB_OUT")

cpu_name() {  # a folder name for this CPU: amd-epyc-zen2, xeon-amx, ...
    local model family number flags
    model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
    family=$(lscpu | sed -n 's/^CPU family: *//p' | head -1)
    number=$(lscpu | sed -n 's/^Model: *//p' | head -1)
    flags=$(lscpu | sed -n 's/^Flags: *//p' | head -1)
    case "$model" in
        *AMD*|*EPYC*|*Ryzen*)
            local zen
            case "$family" in
                23) if [ "$number" -lt 48 ]; then zen=zen1; else zen=zen2; fi ;;
                25) case "$number" in 1|8|33|68|80) zen=zen3 ;; *) zen=zen4 ;; esac ;;
                26) zen=zen5 ;;
                *) zen="family$family" ;;
            esac
            case "$model" in *EPYC*) echo "amd-epyc-$zen" ;; *) echo "amd-$zen" ;; esac ;;
        *Xeon*)
            case " $flags " in *" amx_tile "*) echo xeon-amx ;; *" avx512f "*) echo xeon-avx512 ;; *) echo xeon ;; esac ;;
        *) echo "$model" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//' ;;
    esac
}
TB_RESULTS=${TB_RESULTS-docs/results/$(cpu_name)}

if [ -z "${VOXCAST_CMD:-}" ]; then  # the voxcast command (a checkout without it installed: python -m)
    if command -v voxcast >/dev/null; then VOXCAST_CMD=voxcast; else VOXCAST_CMD="python3 -m voxcast.serving.cli.main"; fi
fi
model=${VOXCAST_MODEL:-}
if [ -z "$model" ]; then
    model="$PWD/.cache/tts-bench-model"
    [ -f "$model/config.json" ] || $VOXCAST_CMD make-test-model --kind custom_voice --size tiny --ends-speech --out "$model"
    TB_MODEL_NAME=${TB_MODEL_NAME:-voxcast-tiny-custom_voice}
    TB_PARAMS=${TB_PARAMS-seed=3 cache=false}
fi
TB_PARAMS=${TB_PARAMS-}
params=()
for p in $TB_PARAMS; do params+=(--request-param "$p"); done
model_flag=()
[ -n "${TB_MODEL_NAME:-}" ] && model_flag=(--model "$TB_MODEL_NAME")

base="http://127.0.0.1:$TB_PORT"
# The harness's aiohttp pool keeps idle connections 15 s; the server's default idle limit (5 s) would
# close some just as a request is sent on them (ServerDisconnectedError): the server waits longer.
export VOXCAST_MODEL="$model" VOXCAST_HTTP_IDLE_TIMEOUT_S=${VOXCAST_HTTP_IDLE_TIMEOUT_S:-30}
export VOXCAST_STORAGE_DIR=${VOXCAST_STORAGE_DIR:-$TB_OUT/store}
$VOXCAST_CMD serve --host 127.0.0.1 --port "$TB_PORT" >"$TB_OUT/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
# /health answers 204 while the model loads and warms, which the harness's preflight takes as healthy:
# start only at 200
for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health" || true)" = 200 ] && break
    kill -0 "$server" 2>/dev/null || { tail -20 "$TB_OUT/serve.log" >&2; exit 1; }
    sleep 1
done
echo "run_tts_bench: voxcast serve ready on $base (model $model)"
server_json() {  # what was served, and how: /health's model and capacity, voxcast's commit, VOXCAST_*
    curl -s "$base/health" | "$TB_PYTHON" -c '
import json, os, subprocess, sys
health = json.load(sys.stdin)
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
commit, dirty = git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--", "src"))
env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("VOXCAST_") and "KEY" not in k}
env["VOXCAST_MODEL"] = os.path.basename(env.get("VOXCAST_MODEL", ""))  # no local paths
env.pop("VOXCAST_STORAGE_DIR", None)
cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
out = {"voxcast_commit": commit, "voxcast_src_dirty": dirty, "model": health.get("model"),
       "checkpoint": os.path.basename(sys.argv[1]), "cpu": cpu[0] if cpu else None, "cpus": os.cpu_count(),
       "env": env, "capacity_since_start": health.get("capacity")}
print(json.dumps(out, indent=2))' "$model"
}

summarize() {  # one line of figures from a summary.json
    "$TB_PYTHON" - "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
ttfa, rtf = s["audible_ttfa_ms"], s["realtime_factor"]
fmt = lambda v, spec: "n/a" if v is None else format(v, spec)
print(
    f"{s['target']}/{s['transport']} rps {s['requested_rps']:g} (actual {s['actual_rps']:.2f}): "
    f"success {s['success_fraction'] * 100:.1f} % ({s['successful_requests']}/{s['scheduled_requests']}), "
    f"underrun requests {s['underrun_requests']}, audible TTFA p50 {fmt(ttfa['p50'], '.1f')} / "
    f"p95 {fmt(ttfa['p95'], '.1f')} ms, RTF p50 {fmt(rtf['p50'], '.3f')}, peak in flight {s['peak_in_flight']}"
)
EOF
}

for target in $TB_TARGETS; do
    case "$target" in
        nari-ws) flags=(--target nari --transport websocket) ;;
        vllm-omni|voxserve|nari) flags=(--target "$target") ;;
        *) echo "run_tts_bench: unknown target '$target'" >&2; exit 2 ;;
    esac
    for rps in $TB_RATES; do
        name="$target-rps$rps"
        rm -rf "${TB_OUT:?}/$name"  # the harness refuses an output folder that exists
        (cd "$TTS_BENCH_DIR" && PYTHONPATH="tts_bench/src${TB_PYTHONPATH:+:$TB_PYTHONPATH}${PYTHONPATH:+:$PYTHONPATH}" "$TB_PYTHON" -m tts_bench run "${flags[@]}" \
            --base-url "$base" --dataset "$TB_DATASET" --rps "$rps" --warmup "${TB_WARMUP:-5s}" \
            --duration "${TB_DURATION:-30s}" --timeout "${TB_TIMEOUT:-120s}" --arrival "${TB_ARRIVAL:-poisson}" \
            --seed "${TB_SEED:-0}" --voice "${TB_VOICE:-Ryan}" --language "${TB_LANGUAGE:-English}" \
            ${model_flag[@]+"${model_flag[@]}"} ${params[@]+"${params[@]}"} --output "$TB_OUT/$name") \
            >"$TB_OUT/$name.log" 2>&1 || { tail -20 "$TB_OUT/$name.log" >&2; exit 1; }
        summarize "$TB_OUT/$name/summary.json"
        if [ -n "$TB_RESULTS" ]; then
            mkdir -p "$TB_RESULTS"
            server_json >"$TB_RESULTS/tts_bench-$name.server.json"
            cp "$TB_OUT/$name/summary.json" "$TB_RESULTS/tts_bench-$name.json"
            cp "$TB_OUT/$name/run.json" "$TB_RESULTS/tts_bench-$name.run.json"
            cp "$TB_OUT/$name/report.txt" "$TB_RESULTS/tts_bench-$name.report.txt"
        fi
    done
done
