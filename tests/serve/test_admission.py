"""Admission decisions over a real Backlog: shed when the queue is full or the deadline
cannot be met, with a retry hint a client can act on; admit otherwise."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edged.config.classes import ClassConfig
from edged.serve import admission, pricing
from edged.serve.admission import PACE_FLOOR, TRUST_MIN_NS, TRUST_RATIO, Backlog, Outlook, Shed, admit
from edged.serve.answers import Answers
from edged.serve.lanes.batching import Job
from edged.serve.lanes.watchdog import OpenCalls
from edged.serve.pending import PendingBytes
from edged.serve.pricing import SIZES_KEPT, ServiceTimes
from edged.serve.stats import ClassStats
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature

MS = 1_000_000  # ns


def lane(**settings: int | float) -> ClassConfig:
    return ClassConfig("test", order=0, **{"queue_capacity": 4, "deadline_ms": 100.0, "workers": 1, **settings})


def backlog_of(*costs_ns: int, workers: int = 1) -> Backlog:
    backlog = Backlog(workers)
    for cost in costs_ns:
        backlog.add(cost)
    return backlog


def test_an_idle_lane_admits() -> None:
    assert admit(lane(), backlog_of(), cost_ns=1 * MS, budget_ns=100 * MS) is None


def test_a_full_queue_sheds_with_a_positive_retry_hint() -> None:
    backlog = backlog_of(*[2 * MS] * 4)
    shed = admit(lane(), backlog, cost_ns=1, budget_ns=10_000 * MS)
    assert isinstance(shed, Shed)
    assert shed.reason == "queue_full"
    assert "queue_capacity" in shed.message
    # One slot frees when the average job ahead (2 ms) finishes.
    assert 2.0 <= shed.retry_after_ms <= 2.2


def test_a_full_queue_of_unmeasured_work_still_hints_a_retry_later() -> None:
    shed = admit(lane(), backlog_of(0, 0, 0, 0), cost_ns=0, budget_ns=10_000 * MS)
    assert shed is not None and shed.reason == "queue_full"
    assert shed.retry_after_ms > 0  # a hint of 0 would invite an immediate, doomed retry


def test_a_slot_freed_admits_again() -> None:
    backlog = backlog_of(*[2 * MS] * 4)
    backlog.finish(2 * MS)
    assert backlog.depth == 3
    assert admit(lane(), backlog, cost_ns=1, budget_ns=10_000 * MS) is None


def test_a_deadline_the_work_ahead_makes_unreachable_sheds() -> None:
    shed = admit(lane(), backlog_of(6 * MS), cost_ns=1 * MS, budget_ns=5 * MS)
    assert isinstance(shed, Shed)
    assert shed.reason == "deadline"
    assert "deadline" in shed.message
    assert shed.retry_after_ms >= 2.0  # 7 ms of work for a 5 ms budget


def test_a_request_costlier_than_its_budget_sheds_on_an_idle_lane() -> None:
    shed = admit(lane(), backlog_of(), cost_ns=3 * MS, budget_ns=2 * MS)
    assert shed is not None and shed.reason == "deadline" and shed.retry_after_ms > 0


def test_a_budget_already_spent_sheds() -> None:
    """docs/protocol.md: a tiny deadline_ms, used up before admission, is shed every time."""
    for budget_ns in (0, -1 * MS):
        shed = admit(lane(), backlog_of(), cost_ns=1 * MS, budget_ns=budget_ns)
        assert shed is not None and shed.reason == "deadline", budget_ns


def test_work_ahead_is_shared_among_the_workers() -> None:
    # Alone, one worker would finish at 25 ms (20 ms ahead, with a fifth in hand); two share it: 13 ms.
    one, two = backlog_of(10 * MS, 10 * MS), backlog_of(10 * MS, 10 * MS, workers=2)
    assert admit(lane(workers=1), one, cost_ns=1 * MS, budget_ns=14 * MS) is not None
    assert admit(lane(workers=2), two, cost_ns=1 * MS, budget_ns=14 * MS) is None


def test_a_lane_measured_slower_than_its_prices_admits_less_work_behind_its_backlog() -> None:
    """A job priced at 10 ms that takes at least 40 ms to answer (the lane's cores busy
    with something else) halves the pace at least: the same work ahead now looks
    twice as long, and a request that fitted behind it is shed."""
    backlog = backlog_of(10 * MS)
    assert admit(lane(), backlog_of(10 * MS, 10 * MS), cost_ns=1 * MS, budget_ns=30 * MS) is None
    time.sleep(0.04)
    backlog.finish(10 * MS)
    assert backlog.pace <= 0.65, backlog.pace
    backlog.add(10 * MS)
    backlog.add(10 * MS)
    shed = admit(lane(), backlog, cost_ns=1 * MS, budget_ns=30 * MS)
    assert shed is not None and shed.reason == "deadline", shed


class RecordingLoop:
    """Stands in for a socket's loop (edged.serve.transport.loop.Loop): keeps each reply sent."""

    def __init__(self) -> None:
        self.replies: list[Any] = []

    def send(self, route: Any, frames: Any) -> None:
        self.replies.append(frames)


def test_jobs_answered_unrun_leave_the_backlog_without_speeding_its_pace() -> None:
    """Ten 5 ms jobs, 20 ms of the lane's time, one run and nine expired: the lane did
    5 ms of work, a quarter of its pace. Counted as done, the nine made bulk's pace 1.6
    times its ideal in a burst on a busy box, and 12 of the 13 requests admitted on it
    then expired."""
    backlog, loop = Backlog(1), RecordingLoop()
    answers = Answers(ClassStats(), backlog, PendingBytes())
    now_ns = time.monotonic_ns()
    jobs = [Job((loop, 0, []), i, None, {}, (), now_ns, now_ns, 5 * MS) for i in range(10)]
    for job in jobs:
        backlog.add(job.cost_ns)
    time.sleep(0.02)
    for job in jobs[1:]:
        answers.expired(job)
    backlog.finish(jobs[0].cost_ns)  # the one that ran
    assert (backlog.depth, backlog.work_ns, len(loop.replies)) == (0, 0, 9)
    assert backlog.pace <= 0.65, backlog.pace  # half the old 1.0, half the sample's 0.25 at most


def test_a_lane_starved_now_is_seen_before_its_first_sample_closes() -> None:
    """Niced workers beside a socket loop reading a burst answer next to nothing for
    tens of ms, and the burst is admitted within them: the pace admission uses is the
    sample under way's as soon as that is slower than the average, not the average."""
    backlog = backlog_of(*[5 * MS] * 8)  # 40 ms of work, nothing answered yet
    start_ns = time.monotonic_ns()
    # Within its first 10 ms (LIVE_MIN_NS), and with the call in hand credited whole: the average.
    assert backlog.outlook(start_ns, (0, 5 * MS)).pace == 1.0
    # 20 ms on, one 5 ms call in hand and nothing answered: a quarter of the ideal at most.
    later_ns = start_ns + 20 * MS
    outlook = backlog.outlook(later_ns, (0, 5 * MS))
    assert outlook.pace <= 0.26
    # The average alone admits a 150 ms budget behind the 40 ms ahead; the live pace sheds it.
    assert admit(lane(queue_capacity=16), backlog, cost_ns=5 * MS, budget_ns=150 * MS) is None
    shed = admit(lane(queue_capacity=16), backlog, cost_ns=5 * MS, budget_ns=150 * MS, outlook=Outlook(outlook.pace))
    assert shed is not None and shed.reason == "deadline" and "yet" not in shed.message, shed
    # A lane keeping up (its work answered as fast as it was priced) is never slowed by it.
    for _ in range(4):
        backlog.finish(5 * MS)
    assert backlog.outlook(later_ns, (0, 5 * MS)).pace == backlog.pace


def test_a_lane_waiting_for_higher_classes_is_not_taken_for_a_starved_one() -> None:
    """Bulk yields while realtime computes a long call. 20 ms into its spell, nothing answered
    and no call begun (its niced worker, on a busy box, had not yet said it yields), the live
    pace read as nothing, and requests with a minute to spare were shed for "about 60 s of work
    ahead" (a test, in 3 runs of 8 beside another). A spell with nothing done says nothing of the
    pace for as long as the higher classes' work would take: the average stands, untrusted."""
    backlog = backlog_of(*[2 * MS] * 66)  # 132 ms of bulk work
    later_ns = time.monotonic_ns() + 20 * MS
    starved = backlog.outlook(later_ns, (0, 0))
    assert starved.pace == PACE_FLOOR  # nothing to explain it: a starved lane
    waiting = backlog.outlook(later_ns, (0, 0), above_ns=1_200 * MS)
    assert (waiting.pace, waiting.trusted_ns) == (backlog.pace, 0)
    # For as long as the work above explains: behind 1 ms of it, 20 ms of nothing is a starved lane.
    assert backlog.outlook(later_ns, (0, 0), above_ns=1 * MS).pace == PACE_FLOOR
    # Behind realtime's 1.2 s call: shed on the starved reading, admitted on the waiting one.
    bulk = lane(queue_capacity=512)
    shed = admit(bulk, backlog, cost_ns=2 * MS, budget_ns=60_000 * MS, above_ns=1_200 * MS, outlook=starved)
    assert shed is not None and shed.reason == "deadline", shed
    assert admit(bulk, backlog, cost_ns=2 * MS, budget_ns=60_000 * MS, above_ns=1_200 * MS, outlook=waiting) is None
    # Once a call is under way, the spell is judged as any.
    assert backlog.outlook(later_ns, (0, 2 * MS), above_ns=1_200 * MS).pace < 0.2


def test_a_requests_own_run_behind_work_is_counted_at_the_lanes_pace() -> None:
    """Bulk at a tenth of a core on a busy box: a 3.6 ms call takes 36 ms, its own run
    as much as the work ahead of it. Counted at its price, the last requests a burst
    admitted there expired in their own run."""
    slow = Outlook(0.1)
    # 1 ms ahead (10 ms at this pace, 12 with a fifth in hand), then its own 4 ms run: 40 ms, 48 in hand.
    shed = admit(lane(), backlog_of(1 * MS), cost_ns=4 * MS, budget_ns=59 * MS, outlook=slow)
    assert shed is not None and shed.reason == "deadline", shed
    assert admit(lane(), backlog_of(1 * MS), cost_ns=4 * MS, budget_ns=60 * MS, outlook=slow) is None
    # Each worker runs a call of its own: two at a tenth of a core each (a pace of 0.2) take
    # 5 ms over the 1 ms ahead (6 in hand), then 40 for its run (48): not 20 (24).
    two = backlog_of(1 * MS, workers=2)
    assert admit(lane(workers=2), two, cost_ns=4 * MS, budget_ns=53 * MS, outlook=Outlook(0.2)) is not None
    assert admit(lane(workers=2), two, cost_ns=4 * MS, budget_ns=54 * MS, outlook=Outlook(0.2)) is None
    # A lane never runs a call faster than its price.
    assert admit(lane(), backlog_of(1 * MS), cost_ns=4 * MS, budget_ns=5 * MS, outlook=Outlook(2.0)) is not None


def test_an_idle_lane_counts_a_requests_run_at_its_price() -> None:
    """Only a run measures an idle lane's pace again: a realtime lane slowed once, had it
    counted each request's run at that pace, shed every one until the pace went stale."""
    assert admit(lane(), backlog_of(), cost_ns=4 * MS, budget_ns=5 * MS, outlook=Outlook(0.1)) is None


def test_work_ahead_beyond_what_a_lane_has_seen_its_pace_hold_for_counts_more() -> None:
    """A burst is admitted within a few ms, before any sample shows what it does to
    the lane: until its own time reaches LIVE_MIN_NS and a job has come back, no work
    ahead is trusted, then work past TRUST_MIN_NS plus TRUST_RATIO times the lane's busy
    time counts UNPROVEN_FACTOR times over. A long deadline still takes a long queue."""
    backlog = backlog_of(*[5 * MS] * 10)  # 50 ms ahead, at the ideal pace
    start_ns = time.monotonic_ns()
    fresh = backlog.outlook(start_ns, (0, 5 * MS))
    assert fresh.trusted_ns == 0  # nothing seen of this spell yet
    # 12 ms on, nothing has come back: the call in flight, credited as done, is a guess
    # (on a busy box a bulk worker took 35 ms and more over a 3.5 ms call).
    assert backlog.outlook(start_ns + 12 * MS, (0, 5 * MS)).trusted_ns == 0
    backlog.finish(5 * MS)
    assert backlog.outlook(start_ns + 12 * MS, (0, 5 * MS)).trusted_ns >= TRUST_MIN_NS + TRUST_RATIO * 12 * MS
    # 50 ms ahead would fit 100 ms with room to spare; 50 x 4 = 200 ms does not.
    shed = admit(lane(queue_capacity=64), backlog, cost_ns=5 * MS, budget_ns=100 * MS, outlook=fresh)
    assert shed is not None and shed.reason == "deadline", shed
    assert admit(lane(queue_capacity=64), backlog, cost_ns=5 * MS, budget_ns=1000 * MS, outlook=fresh) is None
    seasoned = Outlook(fresh.pace, trusted_ns=TRUST_MIN_NS + TRUST_RATIO * 20 * MS)
    assert admit(lane(queue_capacity=64), backlog, cost_ns=5 * MS, budget_ns=100 * MS, outlook=seasoned) is None
    assert backlog_of().outlook(start_ns, (0, 0)).trusted_ns == float("inf")  # an idle lane: nothing ahead


def test_a_fifth_of_the_work_ahead_and_of_the_requests_own_price_is_kept_in_hand() -> None:
    """A queue estimated at 100 ms may take longer, and so may the request itself: a job
    admitted with no slack would expire."""
    backlog = backlog_of(100 * MS)
    assert admit(lane(), backlog, cost_ns=1 * MS, budget_ns=110 * MS) is not None
    assert admit(lane(), backlog, cost_ns=1 * MS, budget_ns=122 * MS) is None
    shed = admit(lane(), backlog_of(), cost_ns=10 * MS, budget_ns=11 * MS)
    assert shed is not None and "10.000 ms (12.000 with what is kept in hand)" in shed.message, shed
    assert admit(lane(), backlog_of(), cost_ns=10 * MS, budget_ns=12 * MS) is None


def test_a_yielding_class_counts_the_higher_classes_work_as_ahead_of_it() -> None:
    assert admit(lane(), backlog_of(), cost_ns=1 * MS, budget_ns=10 * MS, above_ns=20 * MS) is not None
    assert admit(lane(), backlog_of(), cost_ns=1 * MS, budget_ns=10 * MS, above_ns=5 * MS) is None


def test_a_job_is_charged_at_the_dearer_of_a_first_row_and_a_further_row() -> None:
    times = ServiceTimes()
    times.observe("m", 1 * MS, rows=1)
    times.observe("m", 1 * MS + 8 * 2 * MS, rows=9)  # further rows at 2 ms: batches ran beside other work
    assert times.charge_ns("m", 1) == 2 * MS
    assert times.charge_ns("m", 3) == 6 * MS


def test_finished_work_no_longer_counts_against_a_deadline() -> None:
    backlog = backlog_of(50 * MS)
    assert admit(lane(), backlog, cost_ns=1 * MS, budget_ns=10 * MS) is not None
    backlog.finish(50 * MS)
    assert (backlog.depth, backlog.work_ns) == (0, 0)
    assert admit(lane(), backlog, cost_ns=1 * MS, budget_ns=10 * MS) is None


def test_service_time_is_learned_per_row() -> None:
    times = ServiceTimes()
    assert times.estimate_ns("m") == 0
    times.observe("m", call_ns=1 * MS, rows=1)
    assert times.estimate_ns("m") == 1 * MS
    # A big batch teaches the cost of a further row; a one-row request stays cheap.
    times.observe("m", call_ns=1 * MS + 99 * MS // 10, rows=100)
    assert times.estimate_ns("m", rows=1) == 1 * MS
    assert abs(times.estimate_ns("m", rows=11) - 2 * MS) < 0.01 * MS
    assert times.estimate_ns("other") == 0


def test_service_time_follows_a_change_of_load() -> None:
    times = ServiceTimes()
    times.observe("m", call_ns=1 * MS, rows=1)
    for _ in range(100):
        times.observe("m", call_ns=3 * MS, rows=1)
    assert abs(times.estimate_ns("m") - 3 * MS) < 0.01 * MS


def test_work_already_done_by_the_call_in_flight_is_not_ahead() -> None:
    """A 30 ms call that has run for 25 ms leaves 5 ms ahead, not 30."""
    backlog = backlog_of(30 * MS)
    assert admit(lane(), backlog, cost_ns=1 * MS, budget_ns=10 * MS) is not None
    assert admit(lane(), backlog, cost_ns=1 * MS, budget_ns=10 * MS, outlook=Outlook(1.0, done_ns=25 * MS)) is None


# --- a model whose cost follows its input's size ------------------------------------


def test_a_sized_model_is_priced_by_the_size_of_each_row() -> None:
    """Measured at 100 and 400 elements a row: a size between is on their line, a row
    size measured costs what it measured, and a batch costs its rows at their size."""
    times = ServiceTimes()
    times.observe("m", 2 * MS, rows=1, elements=100)
    times.observe("m", 8 * MS, rows=1, elements=400)
    assert times.charge_ns("m", 1, elements=100) == 2 * MS
    assert times.charge_ns("m", 1, elements=400) == 8 * MS
    assert times.charge_ns("m", 1, elements=250) == 5 * MS
    assert times.charge_ns("m", 3, elements=3 * 100) == 6 * MS
    assert times.charge_ns("m", 1, elements=10) == 2 * MS  # below the smallest: never cheaper than it


def test_a_batch_of_small_rows_and_one_large_row_are_not_one_size() -> None:
    """Four 100-element rows and one 400-element row have as many elements; the big
    image costs more than four small ones (the OCR detector's cost grows faster than its pixels)."""
    times = ServiceTimes()
    times.observe("m", 4 * 2 * MS, rows=4, elements=4 * 100)
    times.observe("m", 12 * MS, rows=1, elements=400)
    assert times.charge_ns("m", 4, elements=400) == 8 * MS
    assert times.charge_ns("m", 1, elements=400) == 12 * MS


def test_a_size_beyond_those_measured_follows_two_sizes_and_is_a_bounded_guess_from_one() -> None:
    times = ServiceTimes()
    times.observe("m", 1 * MS, rows=1, elements=100)  # a fixed part dominates small inputs
    times.observe("m", 2 * MS, rows=1, elements=200)
    # Past 200: the line through the two (2 ms plus 1 ms per 100 more).
    assert times.charge_ns("m", 1, elements=1000) == 10 * MS
    assert not times.measured("m", 1, 1000) and times.measured("m", 1, 150)
    # One tiny size alone (an image of 1x1 pixels, 1 ms): between that cost and the cost in
    # proportion to size, their geometric mean. A 960x960 image (0.96 s) is shed in
    # realtime's 20 ms, never run; a 320x480 one (0.39 s) is admitted in standard's 5 s,
    # to run and be measured. In proportion alone, both were priced at minutes.
    one = ServiceTimes()
    one.observe("m", 1 * MS, rows=1, elements=3)
    assert one.charge_ns("m", 1, elements=3 * 960 * 960) == 960 * MS
    realtime, standard = lane(deadline_ms=20.0), lane(deadline_ms=5000.0)
    big = admit(realtime, backlog_of(), one.charge_ns("m", 1, 3 * 960 * 960), budget_ns=20 * MS)
    assert big is not None and big.beyond_one_run, big
    assert admit(standard, backlog_of(), one.charge_ns("m", 1, 3 * 320 * 480), budget_ns=5000 * MS) is None
    # A noisy measurement that fell with size: a guess from the dearest, never below it.
    noisy = ServiceTimes()
    noisy.observe("m", 5 * MS, rows=1, elements=100)
    noisy.observe("m", 4 * MS, rows=1, elements=101)
    assert 5 * MS <= noisy.charge_ns("m", 1, elements=102) <= 5.1 * MS
    assert noisy.charge_ns("m", 1, elements=400) == int(5 * MS * math.sqrt(400 / 101))


def test_a_guessed_size_once_run_is_priced_by_its_measurement_and_corrected_by_the_next_calls() -> None:
    """The first calls of a size each count equally: one slow first call is averaged away
    within a few, and after ten, one call moves the price by a tenth of its difference."""
    times = ServiceTimes()
    times.observe("m", 1 * MS, rows=1, elements=3)
    assert times.charge_ns("m", 1, elements=3 * 320 * 480) > 300 * MS  # a guess
    times.observe("m", 200 * MS, rows=1, elements=3 * 320 * 480)  # its first run, slow (a hiccup)
    for _ in range(3):
        times.observe("m", 50 * MS, rows=1, elements=3 * 320 * 480)
    assert times.charge_ns("m", 1, elements=3 * 320 * 480) == int((200 + 3 * 50) / 4 * MS)
    for _ in range(50):
        times.observe("m", 50 * MS, rows=1, elements=3 * 320 * 480)
    before = times.charge_ns("m", 1, elements=3 * 320 * 480)
    times.observe("m", 500 * MS, rows=1, elements=3 * 320 * 480)  # one slow call, late
    assert times.charge_ns("m", 1, elements=3 * 320 * 480) <= before + 0.1 * (500 * MS - before) + 1


def test_a_size_measured_once_is_no_longer_extrapolated() -> None:
    times = ServiceTimes()
    times.observe("m", 1 * MS, rows=1, elements=100)
    assert not times.measured("m", 1, 300)
    times.observe("m", 30 * MS, rows=1, elements=300)
    assert times.measured("m", 1, 300) and times.charge_ns("m", 1, elements=300) == 30 * MS
    assert times.measured("m", 0, 0) and times.measured("per-row", 1, 0)  # a model priced per row


def test_the_sizes_kept_are_the_most_recently_seen() -> None:
    times = ServiceTimes()
    for size in range(1, SIZES_KEPT + 2):
        times.observe("m", size * MS, rows=1, elements=size * 10)
    times.observe("m", 2 * MS, rows=1, elements=20)  # seen again: kept
    times.observe("m", 100 * MS, rows=1, elements=1000)
    # The oldest (10, then 30 elements) went; 10 is now below the smallest kept, 20.
    assert times.charge_ns("m", 1, elements=10) == times.charge_ns("m", 1, elements=20)
    assert times.charge_ns("m", 1, elements=30) == 3 * MS  # on the line from 20 (2 ms) to 40 (4 ms)


def signature(inputs: dict[str, tuple[int, ...]], outputs: dict[str, tuple[int, ...]]) -> Signature:
    return Signature(
        tuple(TensorSpec(name, "float32", shape) for name, shape in inputs.items()),
        tuple(TensorSpec(name, "float32", shape) for name, shape in outputs.items()),
    )


def test_only_a_model_with_a_dynamic_dimension_besides_the_batch_is_priced_by_size() -> None:
    demo = signature({"image": (-1, 3, 64, 64)}, {"logits": (-1, 10)})
    fixed = signature({"n": (1,)}, {"total": (1, 1)})
    ocr = signature({"x": (-1, 3, -1, -1)}, {"maps": (-1, 1, -1, -1)})
    vad = signature({"input": (-1, -1), "state": (2, -1, 128), "sr": ()}, {"output": (-1, 1), "stateN": (2, -1, 128)})
    assert not demo.sized and not fixed.sized and ocr.sized and vad.sized
    assert demo.elements({"image": np.zeros((2, 3, 64, 64))}) == 0
    assert ocr.elements({"x": np.zeros((2, 3, 32, 48))}) == 2 * 3 * 32 * 48
    chunk = {"input": np.zeros((1, 512)), "state": np.zeros((2, 1, 128)), "sr": np.array(16000)}
    assert vad.elements(chunk) == 512 + 256 + 1


def test_time_a_lane_spent_yielding_is_not_taken_for_a_slow_pace() -> None:
    """A worker that waits for the higher classes' work answers nothing meanwhile, and
    admission counts that work apart (`above_ns`): the lane's own pace leaves the wait
    out, or a bulk lane behind a long realtime call would shed a minute's deadline."""
    backlog = Backlog(watched=True)
    backlog.add(5 * MS)
    backlog.yielding(True)
    time.sleep(0.03)
    # 30 ms waiting, nothing answered: not a measured pace of zero, but its own time too short to say.
    assert backlog.outlook(time.monotonic_ns(), (0, 0)).pace == 1.0
    backlog.yielding(False)
    assert backlog.outlook(time.monotonic_ns(), (0, 0)).pace == 1.0
    time.sleep(0.015)
    # 15 ms of its own time and nothing answered: now it is slow, and seen so.
    assert backlog.outlook(time.monotonic_ns(), (0, 0)).pace < 0.1


def test_a_pipeline_is_priced_whole_where_its_runs_cost_more_than_its_critical_path() -> None:
    """The steps' prices leave out the bookkeeping between them and the join: a pipeline
    whose runs measured dearer than its critical path is admitted for what its runs cost."""
    from support import ENGINES, REPO_ROOT

    from edged.models.pipeline_manifest import discover_pipelines
    from edged.models.repository import discover
    from edged.serve.lanes.priced import Priced

    models = discover(ENGINES, "onnxruntime")
    manifest = REPO_ROOT / "docs" / "examples" / "demo-ensemble" / "pipeline.toml"
    (entry,) = discover_pipelines([manifest], models, print)
    pipeline = entry.pipeline
    assert pipeline is not None
    service, elements = ServiceTimes(), 3 * 64 * 64
    for step in pipeline.steps:
        service.observe(step.key, 1 * MS, 1, elements)
    path_ns = Priced.of(pipeline, service, 1, elements).span_ns  # no whole run measured yet: the path
    assert path_ns > 0
    service.observe(entry.name, path_ns + 3 * MS, 1, elements)
    assert Priced.of(pipeline, service, 1, elements).span_ns == path_ns + 3 * MS


def test_a_pipeline_whose_runs_vary_is_priced_at_what_its_runs_rarely_exceed() -> None:
    """Priced at the average of runs that vary, half the requests whose deadline falls
    just past it would be admitted, then expire; the bound keeps their spread in hand."""
    from support import ENGINES, REPO_ROOT

    from edged.models.pipeline_manifest import discover_pipelines
    from edged.models.repository import discover
    from edged.serve.lanes.priced import Priced

    models = discover(ENGINES, "onnxruntime")
    manifest = REPO_ROOT / "docs" / "examples" / "demo-ensemble" / "pipeline.toml"
    (entry,) = discover_pipelines([manifest], models, print)
    assert entry.pipeline is not None
    service, elements = ServiceTimes(), 3 * 64 * 64
    for step in entry.pipeline.steps:
        service.observe(step.key, MS // 10, 1, elements)
    runs = [2 * MS, 4 * MS] * 30  # the whole runs: 2 or 4 ms, never more
    for run_ns in runs:
        service.observe_run(entry.name, run_ns, 1, elements)
    average = service.charge_ns(entry.name, 1, elements)
    assert 2 * MS < average < 4 * MS
    priced = Priced.of(entry.pipeline, service, 1, elements)
    assert priced.bound_ns >= max(runs)
    assert service.prices()[entry.name]["bound_over_price"] > 1
    # Admitted only where its dearer runs fit, and its bound not counted twice.
    assert admit(lane(), backlog_of(), priced.span_ns, 3 * MS, bound_ns=priced.bound_ns) is not None
    assert admit(lane(), backlog_of(), priced.span_ns, priced.bound_ns, bound_ns=priced.bound_ns) is None


def test_a_pipelines_bound_is_what_its_runs_rarely_pass_whatever_their_tail() -> None:
    """Runs with a long tail (mostly 1 ms, one in twenty 3 ms) vary little on average: a
    mean and a few mean deviations priced them below the tail, and one in twenty admitted
    at that price expired. The bound is their 99th percentile."""
    service = ServiceTimes()
    for i in range(200):
        service.observe_run("p", (3 if i % 20 == 0 else 1) * MS, 1)
    assert service.bound_ns("p", 1) >= 3 * MS


def test_one_stalled_run_does_not_price_a_pipeline_out_of_every_deadline() -> None:
    """A run stalled 100 times over (a box swapping) moves the bound by a fraction of its
    price at most: the pipeline stays admissible, and its next runs pull the bound back."""
    service = ServiceTimes()
    for _ in range(20):
        service.observe_run("p", 1 * MS, 1)
    service.observe_run("p", 100 * MS, 1)
    assert service.bound_ns("p", 1) < 10 * service.charge_ns("p", 1)


def test_a_bound_no_admitted_run_refreshes_does_not_stand_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two slow runs among a few set the bound at MAX_OVER_PRICE; every request with a shorter
    deadline was shed after that, none admitted to replace them, for ever (a review's probe:
    0 of 820 admitted over a minute, the price itself long recovered). A run counts for
    RUN_KEPT_NS at most, and re-timings, which come while every request is shed, count."""
    monkeypatch.setattr(pricing, "RUN_KEPT_NS", 50 * MS)
    service = ServiceTimes()
    for over in (1, 1, 1, 1, 1, 40, 40):
        service.observe_run("p", over * MS, 1)
    assert service.prices()["p"]["bound_over_price"] == pricing.MAX_OVER_PRICE
    time.sleep(0.1)  # twice RUN_KEPT_NS
    for _ in range(2):  # re-timings, a second apart where it serves
        service.observe_run("p", 1 * MS, 1)
    assert service.prices()["p"]["bound_over_price"] < 1.5, service.prices()


def test_a_pipelines_re_timing_counts_toward_its_bound() -> None:
    """Warm-up's runs do not (the first is cold); a re-timing's do: they alone come while
    the bound sheds every request."""
    from support import ENGINES, REPO_ROOT

    from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
    from edged.models.pipeline_manifest import discover_pipelines
    from edged.models.repository import discover
    from edged.serve.lanes.steps import Stepper
    from edged.serve.lanes.warming import load_and_warm

    models = discover(ENGINES, "onnxruntime")
    manifest = REPO_ROOT / "docs" / "examples" / "demo-ensemble" / "pipeline.toml"
    (entry,) = discover_pipelines([manifest], models, print)
    service, backend = ServiceTimes(), OnnxRuntimeCpu()
    runners = {model.name: load_and_warm(backend, model, lane(), service) for model in models}
    stepper = Stepper(runners, service, 1)
    try:
        stepper.timed(entry, entry.samples[0].inputs())
        assert "bound_over_price" not in service.prices()[entry.name]
        stepper.timed(entry, entry.samples[0].inputs(), bounding=True)
        assert "bound_over_price" in service.prices()[entry.name]
    finally:
        stepper.close()
        for runner in runners.values():
            runner.close()


def test_a_lane_starts_work_after_idle_at_its_share_of_a_core() -> None:
    """Where other processes keep the box busy, a niced worker gets a tenth of a core:
    admission must start a burst from that, not from a core to itself."""
    share = [0.1]
    backlog = Backlog(workers=2, share=lambda: share[0])
    backlog.add(1_000_000)
    assert backlog.pace == 0.2
    backlog.finish(1_000_000)
    share[0] = 1.0
    backlog.add(1_000_000)  # not idle a second yet: the pace it had stands
    assert backlog.pace == 0.2


def test_a_lane_that_answered_nothing_for_a_while_still_gets_a_decision() -> None:
    """A lane starved for a whole sample shows a pace of nothing done: admission still
    decides (it divides by the pace) and sheds with a retry hint, and the pace stays
    above zero, so work admitted later can measure it again."""
    backlog = backlog_of(5 * MS)
    later_ns = time.monotonic_ns() + 50 * MS  # a sample under way, well past LIVE_MIN_NS, with nothing answered
    outlook = backlog.outlook(later_ns, (0, 0))
    assert outlook.pace == PACE_FLOOR * 1.0
    shed = admit(lane(deadline_ms=100.0), backlog, 1 * MS, 100 * MS, outlook=outlook)
    assert shed is not None and shed.reason == "deadline" and math.isfinite(shed.retry_after_ms)


def test_admissions_constants_each_say_why() -> None:
    """Admission's constants sit in one table (edged.serve.admission), each below a comment with its reason."""
    source = Path(admission.__file__).read_text().splitlines()
    constants = [i for i, line in enumerate(source) if re.match(r"[A-Z][A-Z0-9_]* = ", line)]
    assert len(constants) >= 10
    unexplained = [source[i] for i in constants if not source[i - 1].startswith("# ")]
    assert not unexplained, unexplained


def test_a_call_in_flight_on_a_slowed_lane_is_done_at_its_pace_not_by_the_wall() -> None:
    """On a busy box a 3.5 ms call took 35 ms: 10 ms into it, a lane going at a tenth of its
    ideal pace has done about 1 ms of it, and some 25 ms of it are still ahead of a new request.
    Credited by the wall, the call looked finished, and a request due in 20 ms was admitted."""
    backlog = Backlog(workers=1, share=lambda: 0.1)
    backlog.add(int(3.5 * MS))
    calls = OpenCalls()
    now_ns = time.monotonic_ns()
    calls.begin([Job((None, 0, []), 1, None, {}, (), now_ns, now_ns, int(3.5 * MS))], now_ns - 10 * MS)
    in_flight = calls.progress(now_ns, backlog.pace)
    assert in_flight == (1 * MS, int(3.5 * MS))
    outlook = backlog.outlook(now_ns, in_flight, watched=False)
    shed = admit(lane(), backlog, cost_ns=1 * MS, budget_ns=20 * MS, outlook=outlook)
    assert shed is not None and shed.reason == "deadline", shed
    # At its ideal pace the same call is done: the request fits.
    assert (
        admit(lane(), backlog, cost_ns=1 * MS, budget_ns=20 * MS, outlook=Outlook(1.0, done_ns=int(3.5 * MS))) is None
    )
