"""RunPod adapter pieces that need no model: config, message protocol, thread pump."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from voxcast.engine.request import request_id_for
from voxcast.errors import InvalidRequest
from voxcast.serving.pump import ThreadPump
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.messages import ErrorPayload, audio_messages, error_message, final_message
from voxcast.serving.runpod.mirror import mirror_key

# ------------------------------------------------------------------------- config


def _hub_defaults() -> dict[str, str]:
    """The environment a worker created from the RunPod Hub's defaults gets (``.runpod/hub.json``)."""
    hub = json.loads((Path(__file__).resolve().parents[2] / ".runpod" / "hub.json").read_text())
    out = {}
    for e in hub["config"]["env"]:
        value = e["input"].get("default")
        if value is not None:
            out[e["key"]] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def test_hub_defaults_are_the_handlers_own() -> None:
    """A worker started from the Hub with its defaults runs as one started with no settings at all:
    in particular the engine's batch size follows VOXCAST_RUNPOD_CONCURRENCY (1), so warm-up records
    one batch size, not four (VOXCAST_MAX_ACTIVE=8 in the Hub made every start 1.5 -> 8.1 s on the
    tiny model for streams that one job at a time never batches)."""
    from voxcast.service import ServiceConfig
    from voxcast.serving.runpod.main import service_env

    hub = _hub_defaults()
    assert RunpodConfig.from_env(hub) == RunpodConfig.from_env({})
    built = ServiceConfig.from_env(service_env(hub, RunpodConfig.from_env(hub)))
    bare = ServiceConfig.from_env(service_env({}, RunpodConfig.from_env({})))
    assert built.engine.max_active == bare.engine.max_active == 1
    assert built == bare


def test_config_defaults_and_env() -> None:
    d = RunpodConfig.from_env({})
    assert (d.concurrency, d.aggregate, d.redis_url, d.sdk_log_level) == (1, True, None, "INFO")
    c = RunpodConfig.from_env(
        {
            "VOXCAST_RUNPOD_CONCURRENCY": "4",
            "VOXCAST_RUNPOD_AGGREGATE": "no",
            "VOXCAST_RUNPOD_MAX_MESSAGE_BYTES": "65536",
            "VOXCAST_RUNPOD_INLINE_MAX_BYTES": "0",
            "VOXCAST_REDIS_URL": "redis://127.0.0.1:1/0",
            "RUNPOD_LOG_LEVEL": "debug",
        }
    )
    assert (c.concurrency, c.aggregate, c.max_message_audio_bytes, c.inline_max_bytes) == (4, False, 65536, 0)
    assert c.redis_url == "redis://127.0.0.1:1/0" and c.sdk_log_level == "DEBUG"
    assert c.concurrency_modifier(1) == 4 and c.concurrency_modifier(9) == 4


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VOXCAST_RUNPOD_CONCURRENCY", "0"),
        ("VOXCAST_RUNPOD_CONCURRENCY", "two"),
        ("VOXCAST_RUNPOD_AGGREGATE", "maybe"),
        ("VOXCAST_RUNPOD_MAX_MESSAGE_BYTES", str(2 * 1024 * 1024)),
        ("VOXCAST_RUNPOD_INLINE_MAX_BYTES", "-1"),
    ],
)
def test_config_rejects_bad_values_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        RunpodConfig.from_env({name: value})


# ----------------------------------------------------------------------- messages


def test_audio_messages_split_under_the_bound_and_reassemble() -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    msgs = audio_messages(
        data, first_seq=7, format="pcm", sample_rate=24000, t_ms=12.34567, frames=4, max_bytes=3001
    )
    assert [m["seq"] for m in msgs] == list(range(7, 7 + len(msgs)))
    pieces = [base64.b64decode(m["audio"]) for m in msgs]
    assert b"".join(pieces) == data
    assert all(len(p) <= 3001 for p in pieces)  # the last piece too
    assert all(len(p) % 4 == 0 for p in pieces[:-1])
    assert [m["frames"] for m in msgs] == [4] + [0] * (len(msgs) - 1)
    assert all(m["t_ms"] == 12.346 and m["format"] == "pcm" and m["sample_rate"] == 24000 for m in msgs)
    json.dumps(msgs)  # JSON-able: the SDK drops anything else silently
    assert (
        audio_messages(b"", first_seq=0, format="wav", sample_rate=8000, t_ms=0, frames=1, max_bytes=1024)
        == []
    )


def test_error_message_is_a_dict_whose_str_is_json() -> None:
    msg = error_message(InvalidRequest("text: text is empty", field="text"))
    err = msg["error"]
    assert isinstance(err, ErrorPayload) and err["field"] == "text" and err["code"] == "invalid_request"
    # runpod 1.12 does str(error) before POSTing it: that must stay parseable
    assert json.loads(str(err)) == {
        "code": "invalid_request",
        "message": "text: text is empty",
        "field": "text",
    }
    assert json.loads(json.dumps(msg)) == {"error": dict(err)}


def test_final_message_carries_result_and_optional_inline_audio() -> None:
    result = {"request_id": "r", "audio_key": "renders/r.wav", "timing": {"ttfa_ms": 1.0}}
    msg = final_message(result, seq=3, messages=3)
    assert (
        msg["done"] is True and msg["seq"] == 3 and msg["audio_key"] == "renders/r.wav" and "audio" not in msg
    )
    inline = final_message(result, seq=0, messages=0, inline_audio=b"RIFF1234")
    assert base64.b64decode(inline["audio"]) == b"RIFF1234"


def test_job_ids_map_to_distinct_streams() -> None:
    assert mirror_key("sync-1b2c_3d4e-u1") == "voxcast:stream:sync-1b2c_3d4e-u1"
    assert mirror_key("job 1") == "voxcast:stream:" + request_id_for("job 1") != mirror_key("job1")
    assert mirror_key("x" * 200 + "1") != mirror_key("x" * 200 + "2")  # were truncated into one key


# --------------------------------------------------------------------------- pump


def test_pump_never_blocks_the_event_loop() -> None:
    """Each item waits until another task on the event loop has run: a pump that iterated its source
    on the loop would leave that task no turn, and the source would give up."""
    loop_ran = threading.Event()

    def source() -> Iterator[int]:
        for i in range(3):
            loop_ran.clear()
            if not loop_ran.wait(10):
                raise RuntimeError("the event loop did not run while the source waited")
            yield i

    async def run() -> list[int]:
        async def ticker() -> None:
            while True:
                loop_ran.set()
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        items = [i async for i in ThreadPump(source(), maxsize=2).start()]
        t.cancel()
        return items

    assert asyncio.run(run()) == [0, 1, 2]


def test_pump_reraises_source_errors_and_runs_on_item_on_its_thread() -> None:
    seen: list[tuple[int, str]] = []

    def source() -> Iterator[int]:
        yield 1
        raise InvalidRequest("bad speaker", field="voice")

    async def run() -> list[int]:
        pump = ThreadPump(
            source(), on_item=lambda i: seen.append((i, threading.current_thread().name)), name="p"
        )
        out = []
        with pytest.raises(InvalidRequest) as ei:
            async for i in pump.start():
                out.append(i)
        assert ei.value.field == "voice"
        return out

    assert asyncio.run(run()) == [1]
    assert seen == [(1, "p")]


class _Cancellable:
    """A slow source that stops at its next item once cancelled (like an engine stream)."""

    def __init__(self, n: int, dt: float) -> None:
        self.n, self.dt, self.cancelled = n, dt, threading.Event()

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            if self.cancelled.is_set():
                return
            time.sleep(self.dt)
            yield i


def test_pump_close_drains_a_cancelled_source_without_blocking() -> None:
    source = _Cancellable(1000, 0.01)

    async def run() -> ThreadPump[int]:
        pump = ThreadPump(source, maxsize=1).start()
        async for i in pump:
            if i == 3:
                break
        source.cancelled.set()
        pump.close()
        assert await pump.wait_finished(2.0)
        return pump

    pump = asyncio.run(run())
    assert pump.finished and pump.items_after_close <= 2


def test_a_job_past_the_aggregate_size_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    from voxcast.serving.runpod.handler import AGGREGATE_WARN_BYTES, RunpodHandler

    with caplog.at_level(logging.WARNING, logger="voxcast.serving.runpod.handler"):
        below = RunpodHandler._aggregated("j1", 0, AGGREGATE_WARN_BYTES)
        assert below == AGGREGATE_WARN_BYTES and not caplog.records  # at the bound: no warning yet
        past = RunpodHandler._aggregated("j1", below, 1)
        RunpodHandler._aggregated("j1", past, 1000)
    (record,) = caplog.records
    assert "j1" in record.getMessage() and "VOXCAST_RUNPOD_AGGREGATE" in record.getMessage()
