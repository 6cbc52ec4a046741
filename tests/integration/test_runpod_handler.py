"""The RunPod handler called directly (async iteration) on a real service with a tiny checkpoint."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.engines import holding_steps
from voxcast.audio.encode import stream_to_file
from voxcast.audio.formats import AudioFormat
from voxcast.errors import EngineUnavailable
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.handler import RunpodHandler

pytestmark = pytest.mark.slow

TEXT = "Hello there, this is a test."


class _Tap:
    """Wraps one real ServiceStream: counts the chunks taken, notes the engine's step count when
    cancel is called, and sets :attr:`ended` when the stream ends."""

    def __init__(self, stream: Any, steps: Callable[[], int]) -> None:
        self.stream = stream
        self._steps = steps
        self.chunks = 0
        self.steps_at_cancel: int | None = None
        self.ended = threading.Event()

    def __iter__(self) -> _Tap:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self.stream)
        except BaseException:
            self.ended.set()
            raise
        self.chunks += 1
        return chunk

    def cancel(self) -> None:
        self.stream.cancel()
        self.steps_at_cancel = self._steps()

    @property
    def result(self) -> Any:
        return self.stream.result

    @property
    def file(self) -> Any:
        return self.stream.file


class _TappedService:
    """The real service, with every stream it returns wrapped in a :class:`_Tap`."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.taps: list[_Tap] = []

    def synthesize(self, *args: Any, **kwargs: Any) -> _Tap:
        tap = self._tap(self._service.synthesize(*args, **kwargs))
        self.taps.append(tap)
        return tap

    def _tap(self, stream: Any) -> _Tap:
        return _Tap(stream, lambda: self._service.engine.stats()["steps"])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)


@pytest.fixture(scope="module")
def service(tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from voxcast.service import Service, ServiceConfig

    env = {
        "VOXCAST_MODEL": str(tiny_model_dir("custom_voice")),
        "VOXCAST_STORAGE_DIR": str(tmp_path_factory.mktemp("rp_store")),
        "VOXCAST_THREADS": "1",
    }
    svc = Service.load(ServiceConfig.from_env(env))
    yield svc
    svc.close()


def _handler(service: Any, **env: str) -> RunpodHandler:
    return RunpodHandler(service, RunpodConfig.from_env(env))


async def _collect(handler: RunpodHandler, job_input: Any, job_id: str = "job-1") -> list[dict[str, Any]]:
    return [m async for m in handler.handle({"id": job_id, "input": job_input})]


def _run(handler: RunpodHandler, job_input: Any, job_id: str = "job-1") -> list[dict[str, Any]]:
    return asyncio.run(_collect(handler, job_input, job_id))


def _audio(messages: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(m["audio"]) for m in messages if "audio" in m and not m.get("done"))


def test_streams_json_chunks_then_a_final_message_with_key_and_timing(service: Any) -> None:
    msgs = _run(_handler(service), {"text": TEXT, "voice": "ryan", "max_frames": 8, "chunk_frames": 2})
    json.dumps(msgs)
    *chunks, final = msgs
    assert len(chunks) >= 3
    assert [m["seq"] for m in chunks] == list(range(len(chunks)))
    assert all(m["format"] == "wav" and m["sample_rate"] == 24000 for m in chunks)
    t_ms = [m["t_ms"] for m in chunks]
    assert t_ms == sorted(t_ms) and t_ms[0] > 0
    assert final["done"] is True and final["seq"] == len(chunks) == final["messages"]
    assert final["request_id"] == "job-1" and final["timing"]["frames"] == 8
    assert final["timing"]["ttfa_ms"] > 0 and "t0_unix" in final and "audio" not in final
    streamed = _audio(chunks)
    assert streamed[:4] == b"RIFF" and final["bytes"] == len(streamed)
    stored = service.store.get_bytes(final["audio_key"])
    assert stored == stream_to_file(AudioFormat.WAV, 24000, streamed)


def test_every_message_respects_the_size_bound(service: Any) -> None:
    handler = _handler(service, VOXCAST_RUNPOD_MAX_MESSAGE_BYTES="1024")
    msgs = _run(handler, {"text": TEXT, "voice": "ryan", "max_frames": 4, "response_format": "pcm"})
    *chunks, final = msgs
    assert all(len(base64.b64decode(m["audio"])) <= 1024 for m in chunks)
    assert len(json.dumps(final)) < 16_384
    assert len(_audio(chunks)) == final["bytes"] == 4 * 1920 * 2  # 4 frames x 1920 samples x int16


def test_non_streaming_inlines_small_files_only(service: Any) -> None:
    req = {
        "text": TEXT,
        "voice": "ryan",
        "max_frames": 4,
        "stream": False,
        "response_format": "mulaw",
        "sample_rate": 8000,
    }
    (small,) = _run(_handler(service), req)
    assert small["done"] and small["seq"] == 0 and small["messages"] == 0
    # the inline file is the stored object: a G.711 WAV for mulaw
    assert base64.b64decode(small["audio"]) == service.store.get_bytes(small["audio_key"])
    assert small["audio_content_type"] == "audio/wav" and small["content_type"].startswith("audio/PCMU")
    (big,) = _run(_handler(service, VOXCAST_RUNPOD_INLINE_MAX_BYTES="0"), req)
    assert big["done"] and "audio" not in big and big["audio_key"]


@pytest.mark.parametrize(
    ("job_input", "field"),
    [
        ({"text": "   "}, "text"),
        ({"input": "hi", "sample_rate": 12345}, "sample_rate"),
        ({"text": "hi", "response_format": "ogg"}, "response_format"),
        ({"text": "hi", "voice": "nobody-knows-me"}, "voice"),  # found by the model, during iteration
        ({"text": "hi", "surprise": 1}, "surprise"),
        ("just a string", "request"),
        ({"action": "dance"}, "action"),
        ({"action": "register_voice", "ref_audio": "not base64!"}, "ref_audio"),
        # refused before any audio (the old id rule let these stream, then fail storing: field "key")
        ({"text": "hi", "voice": "ryan", "request_id": "a:b"}, "request_id"),
        ({"text": "hi", "voice": "ryan", "request_id": ".x"}, "request_id"),
        # were internal_error
        ({"text": "caf\udce9", "voice": "ryan"}, "text"),
        ({"text": "hi", "voice": "ryan", "sampling": 5, "seed": 1}, "sampling"),
    ],
)
def test_bad_input_ends_the_job_with_a_structured_error_naming_the_field(
    service: Any, job_input: Any, field: str
) -> None:
    msgs = _run(_handler(service), job_input)
    assert len(msgs) == 1 and set(msgs[0]) == {"error"}
    err = msgs[0]["error"]
    assert err["field"] == field, err
    assert json.loads(str(err)) == dict(err)  # what the SDK POSTs after its str()


@pytest.mark.parametrize("job", [["not", "a", "job"], "text", None, 5])
def test_a_job_that_is_not_an_object_gets_an_error_not_a_crash(service: Any, job: Any) -> None:
    async def collect() -> list[dict[str, Any]]:
        return [m async for m in _handler(service).handle(job)]

    (msg,) = asyncio.run(collect())
    assert msg["error"]["code"] == "invalid_request" and msg["error"]["field"] == "job"


def test_the_handler_keeps_serving_after_errors(service: Any) -> None:
    handler = _handler(service)
    assert "error" in _run(handler, {"text": ""})[0]
    assert "error" in _run(handler, {"text": "hi", "voice": "nobody"})[0]
    assert _run(handler, {"text": TEXT, "voice": "ryan", "max_frames": 2})[-1]["done"]


def test_list_voices_action(service: Any) -> None:
    (msg,) = _run(_handler(service), {"action": "list_voices"})
    assert any("ryan" in json.dumps(v) for v in msg["voices"])


@pytest.mark.parametrize("where", ["in_handler", "in_sdk_post"])
def test_cancelling_the_job_task_stops_the_engine_within_one_frame(service: Any, where: str) -> None:
    """The SDK cancels the job task wherever it waits: inside the handler (awaiting the next chunk)
    or in its own await of a stream POST while the generator sits at a ``yield``. The engine is held
    after its first frame, so the cancel lands mid-stream however fast the host."""
    tapped = _TappedService(service)
    handler = RunpodHandler(tapped, RunpodConfig())  # type: ignore[arg-type]
    req = {"text": TEXT * 4, "voice": "ryan", "max_frames": 400, "first_chunk_frames": 1, "chunk_frames": 1}
    agens: list[Any] = []  # keeps the generator alive: no finalisation may do the work for us

    async def run() -> int:
        got = 0
        first = asyncio.Event()

        async def consume() -> None:
            nonlocal got
            agen = handler.handle({"id": "job-cancel", "input": req})
            agens.append(agen)
            async for _ in agen:
                got += 1
                first.set()
                if where == "in_sdk_post":
                    await asyncio.sleep(30)  # stands for the SDK's stream POST

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 60)
        task.cancel()  # what the SDK does when the platform stops the job
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)  # let the task's done callbacks run
        # cancelled now, not when asyncio.run() finally closes the abandoned generator
        assert tapped.taps[0].steps_at_cancel is not None
        return got

    with holding_steps(service.engine):
        got = asyncio.run(run())
    tap = tapped.taps[0]
    assert tap.ended.wait(10) and tap.steps_at_cancel is not None
    result = tap.result
    assert result.timing.finish_reason == "cancelled"
    assert got <= result.timing.frames <= 2  # the first, and the one held when the cancel came
    # steps are counted as they start: at most one more, whose round looked before the cancel
    assert service.engine.stats()["steps"] <= tap.steps_at_cancel + 1
    assert result.audio_key is None  # a cancelled rendering is not stored


def test_chunks_are_mirrored_to_a_redis_stream_keyed_by_job_id(service: Any, redis_client: Any) -> None:
    from voxcast.serving.rq.stream import EntryType, read_all
    from voxcast.serving.runpod.mirror import mirror_key

    handler = RunpodHandler(service, RunpodConfig(), redis_client)
    msgs = _run(handler, {"text": TEXT, "voice": "ryan", "max_frames": 4, "chunk_frames": 1}, "rp-job-7")
    entries = read_all(redis_client, mirror_key("rp-job-7"))
    types = [e.type for e in entries]
    assert types[0] == EntryType.START and types[-1] == EntryType.EOS
    chunks = [e for e in entries if e.type == EntryType.CHUNK]
    assert [e.seq for e in chunks] == list(range(len(chunks))) and len(chunks) >= len(msgs) - 1
    assert b"".join(e.audio for e in chunks) == _audio(msgs)
    assert entries[-1].info["audio_key"] == msgs[-1]["audio_key"]
    assert entries[0].info["job_id"] == "rp-job-7"
    assert 0 < redis_client.ttl(mirror_key("rp-job-7")) <= 3600


def test_a_bad_request_is_not_mirrored_but_a_cancelled_one_ends_its_stream(
    service: Any, redis_client: Any
) -> None:
    from voxcast.serving.rq.stream import EntryType, read_all
    from voxcast.serving.runpod.mirror import mirror_key

    handler = RunpodHandler(service, RunpodConfig(), redis_client)
    assert "error" in _run(handler, {"text": ""}, "rp-bad")[0]
    assert read_all(redis_client, mirror_key("rp-bad")) == []

    async def cancel_after_first() -> None:
        agen = handler.handle(
            {"id": "rp-cancel", "input": {"text": TEXT * 4, "voice": "ryan", "chunk_frames": 1}}
        )
        await agen.__anext__()
        await agen.aclose()  # the consumer goes away (same path as a cancelled task)

    asyncio.run(cancel_after_first())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        entries = read_all(redis_client, mirror_key("rp-cancel"))
        if entries and entries[-1].terminal:
            break
        time.sleep(0.02)
    assert entries[-1].type == EntryType.CANCELLED


def test_local_one_shot_mode_iterates_the_generator(service: Any, tmp_path: Path, capsys: Any) -> None:
    from voxcast.serving.runpod.local import is_local, load_job, run_local

    assert is_local({}, []) and not is_local({}, ["--rp_serve_api"])
    assert not is_local({"RUNPOD_WEBHOOK_GET_JOB": "http://x/job-take/$ID?a=1"}, [])
    job = json.dumps({"input": {"text": TEXT, "voice": "ryan", "max_frames": 3}})
    out = tmp_path / "out.wav"
    assert run_local(_handler(service), ["--test_input", job, "--audio_out", str(out)], tmp_path) == 0
    final = json.loads(capsys.readouterr().out)
    assert final["done"] and out.read_bytes()[:4] == b"RIFF" and len(out.read_bytes()) == final["bytes"]
    assert run_local(_handler(service), ["--test_input", json.dumps({"input": {"text": ""}})], tmp_path) == 2
    assert run_local(_handler(service), [], tmp_path) == 2  # no test_input.json in tmp_path
    with pytest.raises(ValueError, match="input"):
        load_job('{"text": "no input key"}', tmp_path)


class _DyingStream(_Tap):
    """A real stream whose engine "dies" after the first chunk (as SynthesisStream reports it)."""

    def __next__(self) -> Any:
        if self.chunks:
            self.stream.cancel()
            raise EngineUnavailable("the engine stopped while this request was running")
        return super().__next__()


def test_a_dead_engine_fails_the_job_and_asks_the_worker_to_exit(service: Any) -> None:
    class Dying(_TappedService):
        def _tap(self, stream: Any) -> _Tap:
            return _DyingStream(stream, lambda: 0)

    handler = RunpodHandler(Dying(service), RunpodConfig())  # type: ignore[arg-type]
    exits: list[bool] = []
    handler.on_engine_failure = lambda: exits.append(True)
    msgs = _run(handler, {"text": TEXT, "voice": "ryan", "max_frames": 6})
    assert msgs[-1]["error"]["code"] == "engine_unavailable" and exits == [True]


def test_a_slow_consumer_gets_waiting_chunks_merged_into_one_message(service: Any) -> None:
    req = {"text": TEXT, "voice": "ryan", "max_frames": 12, "first_chunk_frames": 1, "chunk_frames": 1}
    tapped = _TappedService(service)
    handler = RunpodHandler(tapped, RunpodConfig())  # type: ignore[arg-type]

    async def slow() -> list[dict[str, Any]]:
        out = []
        async for m in handler.handle({"id": "slow", "input": req}):
            out.append(m)
            if len(out) == 1:  # e.g. a slow stream POST: the engine runs ahead meanwhile, here to its end
                assert await asyncio.to_thread(tapped.taps[0].ended.wait, 60)
        return out

    *chunks, final = asyncio.run(slow())
    assert len(chunks) == 2  # the first, then every chunk that waited, merged into one message
    assert sum(c["frames"] for c in chunks) == 12 and [c["seq"] for c in chunks] == [0, 1]
    assert stream_to_file(AudioFormat.WAV, 24000, _audio(chunks)) == service.store.get_bytes(
        final["audio_key"]
    )
    fast = _run(_handler(service, VOXCAST_RUNPOD_COALESCE="0"), req)  # off: one message per chunk
    assert all(c["frames"] == 1 for c in fast[:-1]) and len(fast) == 13
