"""Pacing policy (voxcast.engine.pacing) on a fake clock: who steps while a new request waits for its
first chunk, the measured step costs, and when admission control refuses one more real-time stream."""

from __future__ import annotations

import pytest

from voxcast.config import EngineConfig
from voxcast.engine.pacing import (
    MAX_SKIP_S,
    MIN_SAMPLES,
    BusyMeter,
    Room,
    RoundCosts,
    Row,
    Waiting,
    over_capacity,
    rows_to_step,
)

NOW = 100.0
HORIZON = 0.3
FRAME = 0.08


def _costs(**by_rows: float) -> RoundCosts:
    """Step costs measured MIN_SAMPLES times per batch size (``r2=0.05``: 2 rows, 50 ms)."""
    costs = RoundCosts()
    for key, seconds in by_rows.items():
        for _ in range(MIN_SAMPLES):
            costs.record_step(int(key[1:]), seconds)
    return costs


def test_slack_is_audio_delivered_ahead_of_playback() -> None:
    assert Row(True, None).slack_s(NOW) is None
    assert Row(True, NOW + 0.5).slack_s(NOW) == pytest.approx(0.5)
    assert Row(True, NOW - 0.1).slack_s(NOW) == pytest.approx(-0.1)  # the listener waits


def test_without_a_new_request_every_stream_steps() -> None:
    rows = [Row(True, NOW + 5.0), Row(False, NOW + 5.0), Row(True, None), Row(True, NOW - 1)]
    assert rows_to_step(rows, NOW, HORIZON, urgent=False) == [True] * 4


def test_a_new_request_is_not_queued_behind_streams_with_slack() -> None:
    far_ahead = Row(True, NOW + 2.0)
    at_horizon = Row(True, NOW + HORIZON)
    behind = Row(True, NOW + 0.1)
    new = Row(True, None)
    got = rows_to_step([far_ahead, at_horizon, behind, new], NOW, HORIZON, urgent=True)
    assert got == [False, True, True, True]  # the ones that need frames still run together


def test_streams_without_a_listener_yield_to_every_new_request() -> None:
    batch_old, batch_new = Row(False, NOW - 3.0), Row(False, None)
    got = rows_to_step([batch_old, batch_new, Row(True, None)], NOW, HORIZON, urgent=True)
    assert got == [False, False, True]


def test_a_stream_without_a_listener_steps_once_it_skipped_for_max_skip_s() -> None:
    new = Row(True, None)
    fresh, short, starved = (Row(False, NOW - 1, NOW - s) for s in (0.0, MAX_SKIP_S / 2, MAX_SKIP_S))
    got = rows_to_step([fresh, short, starved, new], NOW, HORIZON, urgent=True)
    assert got == [False, False, True, True]
    far_ahead = Row(True, NOW + 60.0, NOW - 10 * MAX_SKIP_S)  # a listener's slack bounds its skips
    assert rows_to_step([far_ahead, new], NOW, HORIZON, urgent=True) == [False, True]


def test_waiting_streams_are_taken_real_time_first_fifo_within_each() -> None:
    waiting: Waiting[str] = Waiting()
    for name, realtime in (("b1", False), ("r1", True), ("b2", False), ("r2", True)):
        waiting.put(name, realtime)
    assert (len(waiting), waiting.realtime) == (4, 2)
    assert [waiting.take() for _ in range(5)] == ["r1", "r2", "b1", "b2", None]
    assert (len(waiting), waiting.realtime) == (0, 0)


def test_no_horizon_means_no_skipping() -> None:
    assert rows_to_step([Row(True, NOW + 9), Row(False, None)], NOW, 0.0, urgent=True) == [True, True]


def test_step_costs_are_trusted_after_a_few_rounds_and_extrapolated() -> None:
    costs = RoundCosts()
    costs.record_step(1, 0.010)
    assert costs.predict_s(1) is None  # one round (maybe a compile) is not a measurement
    costs = _costs(r1=0.010)
    assert costs.predict_s(1) == pytest.approx(0.010)
    assert costs.predict_s(3) == pytest.approx(0.030)  # proportional: conservative
    two = _costs(r1=0.020, r4=0.032)  # a fixed cost and a small one per row (a GPU)
    assert two.predict_s(8) == pytest.approx(0.048)
    assert two.predict_s(2) == pytest.approx(0.024)


def test_recent_rounds_floor_the_horizon() -> None:
    costs = RoundCosts()
    assert costs.recent_max_s() == 0.0
    for s in (0.01, 0.2, 0.02):
        costs.record_round(s)
    assert costs.recent_max_s() == pytest.approx(0.2)


def test_an_idle_engine_always_admits() -> None:
    slow = _costs(r1=10.0)  # far slower than real time
    assert over_capacity(Room(0, 0, 1), slow, FRAME, 0.8, queue=0) is None


def test_admits_under_max_active_with_measured_headroom() -> None:
    costs = _costs(r1=0.010, r2=0.018)
    assert over_capacity(Room(2, 0, 8), costs, FRAME, 0.8, queue=0) is None
    assert over_capacity(Room(1, 0, 8), RoundCosts(), FRAME, 0.8, queue=0) is None  # nothing measured


def test_refuses_when_one_more_row_would_outlast_a_frame() -> None:
    costs = _costs(r1=0.025)  # 3 rows: ~75 ms > 0.8 x 80 ms
    reason = over_capacity(Room(2, 0, 8), costs, FRAME, 0.8, queue=0)
    assert reason is not None and "VOXCAST_ADMISSION_LOAD" in reason
    assert over_capacity(Room(1, 0, 8), costs, FRAME, 0.8, queue=0) is None  # 2 rows: 50 ms
    assert over_capacity(Room(1, 1, 8), costs, FRAME, 0.8, queue=0) is not None  # one waits already


def test_refuses_past_max_active_beyond_the_queue_allowance() -> None:
    costs = RoundCosts()
    full = Room(held=4, waiting=0, max_active=4)
    reason = over_capacity(full, costs, FRAME, 0.8, queue=0)
    assert reason is not None and "VOXCAST_MAX_ACTIVE" in reason
    assert over_capacity(full, costs, FRAME, 0.8, queue=1) is None
    assert over_capacity(Room(4, 1, 4), costs, FRAME, 0.8, queue=1) is not None


def test_refuses_when_the_decode_thread_would_fall_behind() -> None:
    fast = _costs(r1=0.002, r2=0.003, r3=0.004)  # the rounds keep up easily
    assert over_capacity(Room(2, 0, 8), fast, FRAME, 0.8, queue=0, decode_busy=0.5) is None  # 3: 75 %
    reason = over_capacity(Room(2, 0, 8), fast, FRAME, 0.8, queue=0, decode_busy=0.6)  # 3: 90 %
    assert reason is not None and "decoder is busy 60%" in reason and "VOXCAST_ADMISSION_LOAD" in reason
    assert over_capacity(Room(0, 0, 8), fast, FRAME, 0.8, queue=0, decode_busy=1.0) is None  # idle
    # streams whose generation ended but whose last chunks wait for the decoder count for it
    finishing = over_capacity(Room(0, 0, 8, finishing=2), fast, FRAME, 0.8, queue=0, decode_busy=0.9)
    assert finishing is not None and "with 2 streams" in finishing
    assert over_capacity(Room(0, 0, 8, finishing=2), fast, FRAME, 0.8, queue=0, decode_busy=0.3) is None


def test_busy_meter_counts_the_last_window_and_a_running_job() -> None:
    meter = BusyMeter(window_s=2.0)
    assert meter.fraction(NOW) == 0.0
    meter.start(NOW - 3.0)
    meter.stop(NOW - 2.5)  # wholly before the window
    meter.start(NOW - 2.2)
    meter.stop(NOW - 1.6)  # 0.4 s of it inside
    meter.start(NOW - 1.0)
    meter.stop(NOW - 0.5)  # 0.5 s
    assert meter.fraction(NOW) == pytest.approx(0.9 / 2.0)
    meter.start(NOW - 0.25)  # running: counts up to now
    assert meter.fraction(NOW) == pytest.approx(1.15 / 2.0)
    assert meter.fraction(NOW + 10.0) == pytest.approx(1.0)  # still running, the whole window


def test_settings_from_the_environment() -> None:
    d = EngineConfig()
    assert (d.slack_horizon_ms, d.admission, d.admission_load, d.admission_queue) == (300.0, True, 0.8, 0)
    c = EngineConfig.from_env(
        {
            "VOXCAST_SLACK_HORIZON_MS": "0",
            "VOXCAST_ADMISSION": "off",
            "VOXCAST_ADMISSION_LOAD": "0.5",
            "VOXCAST_ADMISSION_QUEUE": "4",
        }
    )
    assert (c.slack_horizon_ms, c.admission, c.admission_load, c.admission_queue) == (0.0, False, 0.5, 4)
    for bad in ({"VOXCAST_ADMISSION_LOAD": "0"}, {"VOXCAST_ADMISSION_QUEUE": "-1"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineConfig.from_env(bad)
