"""Timeline: Chrome trace format, rows, spans and counters, the event cap, and busy/overlap arithmetic."""

import json
import threading

import pytest

from asyncrl.telemetry import Timeline, busy_seconds, overlap_seconds, read_trace


def test_saved_trace_has_labelled_rows_exact_spans_and_counters(tmp_path):
    timeline = Timeline()
    origin_s = timeline.start_s
    timeline.add_span("rollout/replica0", "generate", origin_s + 1.0, origin_s + 3.5, step=1)
    timeline.add_span("trainer/rank0", "update_actor", origin_s + 2.0, origin_s + 2.25)
    timeline.add_counter("queue_size", 4, origin_s + 0.5)
    path = timeline.save(tmp_path / "timeline.json")

    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    row_names = {event["tid"]: event["args"]["name"] for event in events
                 if event["ph"] == "M" and event["name"] == "thread_name"}
    assert sorted(row_names.values()) == ["rollout/replica0", "trainer/rank0"]
    spans = {event["name"]: event for event in events if event["ph"] == "X"}
    assert spans["generate"]["ts"] == pytest.approx(1_000_000) and spans["generate"]["dur"] == pytest.approx(2_500_000)
    assert spans["update_actor"]["dur"] == pytest.approx(250_000)
    assert row_names[spans["generate"]["tid"]] == "rollout/replica0"
    assert spans["generate"]["args"] == {"step": 1}
    counters = [event for event in events if event["ph"] == "C"]
    assert counters == [{"name": "queue_size", "ph": "C", "pid": 1, "ts": pytest.approx(500_000),
                         "args": {"queue_size": 4.0}}]

    read_back = read_trace(path)
    generate = read_back.spans_by_row["rollout/replica0"][0]
    assert (generate.start_s, generate.end_s) == (pytest.approx(1.0), pytest.approx(3.5))
    assert read_back.counters["queue_size"][0].value == 4.0


def test_span_context_manager_records_its_block_on_its_row():
    timeline = Timeline()
    with timeline.span("driver", "step", step=3):
        pass
    (span,) = timeline.spans("driver")
    assert span.name == "step" and span.args == {"step": 3}
    assert timeline.start_s <= span.start_s <= span.end_s
    assert timeline.spans("trainer/rank0") == []


def test_span_ending_before_it_starts_is_rejected():
    with pytest.raises(ValueError, match="driver/step ends before it starts"):
        Timeline().add_span("driver", "step", 2.0, 1.0)


def test_event_cap_drops_the_oldest_and_counts_them(tmp_path):
    timeline = Timeline(max_events=3)
    for index in range(5):
        timeline.add_span("driver", f"span{index}", float(index), index + 0.5)
    assert [span.name for span in timeline.spans("driver")] == ["span2", "span3", "span4"]
    assert timeline.num_dropped_events == 2
    trace = json.loads(timeline.save(tmp_path / "trace.json").read_text())
    assert trace["otherData"]["num_dropped_events"] == 2
    assert any(event["ph"] == "M" and event["args"] == {"name": "driver"} for event in trace["traceEvents"])


def test_concurrent_spans_are_all_recorded():
    timeline = Timeline()

    def record(row):
        for index in range(500):
            timeline.add_span(row, "work", float(index), index + 0.5)

    threads = [threading.Thread(target=record, args=(f"rollout/replica{index}",)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(timeline.rows()) == [f"rollout/replica{index}" for index in range(4)]
    assert all(len(timeline.spans(row)) == 500 for row in timeline.rows())


def test_busy_seconds_counts_overlapping_spans_of_a_row_once():
    assert busy_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.75)]) == pytest.approx(4.0)
    assert busy_seconds([]) == 0.0


def test_overlap_seconds_between_two_rows_matches_hand_computation():
    timeline = Timeline()
    # rollout: [0, 4] and [6, 10]; training: [3, 7] and [9, 12] -> overlap [3,4] + [6,7] + [9,10] = 3 s.
    for start_s, end_s in [(0.0, 4.0), (6.0, 10.0)]:
        timeline.add_span("rollout/replica0", "generate", start_s, end_s)
    for start_s, end_s in [(3.0, 7.0), (9.0, 12.0)]:
        timeline.add_span("trainer/rank0", "update_actor", start_s, end_s)
    rollout = timeline.intervals("rollout/replica0")
    training = timeline.intervals("trainer/rank0")
    assert overlap_seconds(rollout, training) == pytest.approx(3.0)
    assert overlap_seconds(training, rollout) == pytest.approx(3.0)
    assert busy_seconds(training) == pytest.approx(7.0)
    assert overlap_seconds(rollout, [(4.0, 6.0)]) == 0.0  # touching is not overlapping
    assert overlap_seconds([(0.0, 1.0), (5.0, 6.0)], [(2.0, 3.0)]) == 0.0  # disjoint: gaps are not negative overlap
    assert overlap_seconds([(0.0, 2.0), (1.0, 3.0)], [(2.5, 4.0)]) == pytest.approx(0.5)  # a row's own overlap merged
