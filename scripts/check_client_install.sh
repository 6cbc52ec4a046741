#!/usr/bin/env bash
# The client-only install of docs/queue.md, checked from a fresh venv that has nothing else: the
# packages of requirements-client.txt, then voxcast itself without its dependencies, from a wheel
# built here (as a user installs from a clone or a released wheel). The queue commands run against a
# redis-server of their own on a free port; a command that needs the full install says what to
# install. scripts/test.sh runs it (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
redis_pid=""
cleanup() { [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

python -m venv "$work/venv"
pip=("$work/venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" -r requirements-client.txt
python -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation . -w "$work/dist" >/dev/null
"${pip[@]}" --no-deps "$work"/dist/voxcast-*.whl
vx="$work/venv/bin/voxcast"
if "$work/venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "check_client_install: torch is importable in the client venv" >&2; exit 1
fi

port="$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
redis_pid=$!
url="redis://127.0.0.1:$port/0"
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

fail() { echo "check_client_install: $*" >&2; exit 1; }
job="$("$vx" enqueue "Hello there." --voice ryan --redis-url "$url")" || fail "enqueue failed"
"$vx" status "$job" --redis-url "$url" | grep -q '"status": "queued"' || fail "status is not queued"
[ "$("$vx" workers --redis-url "$url")" = "[]" ] || fail "workers is not []"
[ "$("$vx" cancel "$job" --redis-url "$url")" = "cancelled" ] || fail "cancel did not cancel"
set +e
out="$("$vx" listen "$job" --redis-url "$url" 2>/dev/null)"; code=$?
set -e
[ "$code" = 1 ] && grep -q '"status": "cancelled"' <<<"$out" || fail "listen of a cancelled job: exit $code"
set +e
err="$("$vx" synth "Hi." --out "$work/x.wav" 2>&1)"; code=$?
set -e
[ "$code" = 1 ] && grep -q "needs the package .torch." <<<"$err" && grep -q "requirements-client.txt" <<<"$err" \
    || fail "synth without torch: exit $code: $err"
echo "check_client_install: the client-only install runs enqueue, status, workers, cancel, listen; synth says what to install"
