"""Lanes in-process, on the real ONNX Runtime backend and the demo models.

The backend is wrapped only to count (and, in some tests, to fail or to hold) what
reaches it: the counting is how a test proves that shed or expired work was never
run, and the gate is how a test orders events without racing a clock.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from support import REPO_ROOT, decoded, raised_on_thread
from support.backends import POISON, CountingBackend
from support.transport import Replies

from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.config.classes import ClassConfig
from edged.daemon.stopping import stop_lanes
from edged.models.repository import ModelEntry, discover
from edged.serve.admission import Shed
from edged.serve.lanes import lane as lane_module
from edged.serve.lanes.batching import Job, fill
from edged.serve.lanes.inline_cap import DEADLINE_KEPT_NS, LoopDeadlines
from edged.serve.lanes.lane import Lane
from edged.serve.lanes.warming import WARMUP_RUNS
from edged.serve.pending import PendingBytes
from edged.wire.codec import Status, decode_reply, encode_request

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def models() -> dict[str, ModelEntry]:
    return {m.name: m for m in discover(ROOT / "engines", "onnxruntime")}


REPLIES = Replies()  # the module's lanes answer here, each reply labelled by its route's number


def make_lane(klass: ClassConfig, models: dict[str, ModelEntry]) -> tuple[Lane, CountingBackend, queue.Queue]:
    """A started lane, owned by the calling thread (its loop, here)."""
    backend = CountingBackend()
    lane = Lane(klass, list(models.values()), backend)
    lane.start()
    lane.own()
    backend.counting = True  # warm-up runs are not what the tests count
    return lane, backend, REPLIES.queue


def job(model: ModelEntry, x: np.ndarray, route: int, deadline_ms: float = 1000.0) -> Job:
    now = time.monotonic_ns()
    name = model.signature.inputs[0].name
    inputs, deadline_ns = {name: x}, now + int(deadline_ms * 1e6)
    rows = model.signature.rows(inputs)
    return Job(REPLIES.route(route), route, model, inputs, model.signature.output_names, now, deadline_ns, 0, rows=rows)


def collect(replies: queue.Queue, count: int) -> dict[int, object]:
    got = {}
    for _ in range(count):
        route, frames = replies.get(timeout=10)
        assert route not in got, f"request {route} answered twice"
        got[route] = decode_reply([bytes(f) for f in frames])
    assert replies.empty()
    return got


def reference(model: str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(ROOT / "engines" / model / "model.onnx"))
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_expired_job_is_answered_and_never_run(models):
    lane, backend, replies = make_lane(ClassConfig("t", order=0), models)
    try:
        x = np.ones((1, 64), np.float32)
        lane.enqueue(job(models["mlp-light"], x, route=1, deadline_ms=-1.0))
        lane.enqueue(job(models["mlp-light"], x, route=2))
        got = collect(replies, 2)
    finally:
        lane.crew.stop(2.0)
    assert got[1].status is Status.DEADLINE_EXCEEDED
    assert "not run" in got[1].error
    assert got[2].status is Status.OK
    assert backend.rows == 1
    assert lane.stats.expired == 1 and lane.backlog.depth == 0


def test_bulk_batches_what_waits_up_to_max_batch_rows_and_each_reply_gets_its_own_rows(models):
    klass = ClassConfig("bulk", order=0, max_batch=8, batch_wait_us=20_000)
    lane, backend, replies = make_lane(klass, models)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1 + i % 3, 64)).astype(np.float32) for i in range(16)]
    try:
        for i, x in enumerate(xs):
            lane.enqueue(job(models["mlp-light"], x, route=i))
        got = collect(replies, len(xs))
    finally:
        lane.crew.stop(2.0)
    assert len(backend.calls) < len(xs), f"no batching happened: {backend.calls}"
    # max_batch counts rows, as a GPU runner's buffers do, not requests.
    assert max(backend.calls) <= klass.max_batch, backend.calls
    for i, x in enumerate(xs):
        assert got[i].status is Status.OK
        np.testing.assert_allclose(got[i].outputs["scores"], reference("mlp-light", x), rtol=1e-5, atol=1e-5)


def test_latency_class_takes_what_is_queued_and_never_waits_for_more(models):
    """A latency class batches only what already waits: a job alone is run alone, at
    once, however large max_batch is."""
    klass = ClassConfig("realtime", order=0, max_batch=8, batch_wait_us=0)
    lane, backend, replies = make_lane(klass, models)
    heavy, image = models["cnn-heavy"], np.zeros((1, 3, 64, 64), np.float32)
    try:
        # The worker is held inside the first call while two more jobs queue behind it.
        backend.gate.clear()
        lane.enqueue(job(heavy, image, route=1))
        assert backend.entered.wait(10), "the first job never reached the backend"
        lane.enqueue(job(heavy, image, route=2))
        lane.enqueue(job(heavy, image, route=3))
        backend.gate.set()
        got = collect(replies, 3)
        assert backend.calls == [1, 2], f"the two queued jobs should share one call: {backend.calls}"
        # A job that finds nothing queued is not held for company: it is answered even
        # though nothing else ever arrives (a worker waiting to fill the batch never would).
        lane.enqueue(job(heavy, image, route=4))
        got.update(collect(replies, 1))
    finally:
        backend.gate.set()
        lane.crew.stop(2.0)
    assert all(reply.status is Status.OK for reply in got.values())
    assert backend.calls == [1, 2, 1]


def test_a_failing_request_gets_internal_and_its_batch_neighbours_their_answers(models):
    klass = ClassConfig("bulk", order=0, max_batch=8, batch_wait_us=50_000)
    lane, _, replies = make_lane(klass, models)
    xs = [np.full((1, 64), float(i), np.float32) for i in range(6)]
    xs[3] = np.full((1, 64), POISON, np.float32)
    try:
        for i, x in enumerate(xs):
            lane.enqueue(job(models["mlp-light"], x, route=i))
        got = collect(replies, len(xs))
    finally:
        lane.crew.stop(2.0)
    assert got[3].status is Status.INTERNAL and "poisoned row" in got[3].error
    for i in (0, 1, 2, 4, 5):
        assert got[i].status is Status.OK
        np.testing.assert_allclose(got[i].outputs["scores"], reference("mlp-light", xs[i]), rtol=1e-5, atol=1e-5)
    assert lane.stats.failed == 1 and lane.stats.completed == 5


# Not a list: unstacking it raises before the job is claimed; a list of no array: encoding
# the reply raises after.
@pytest.mark.parametrize(
    ("broken", "error"),
    [
        (0, "the backend failed on this request: object of type 'int' has no len()"),
        ([], "the backend failed on this request: it returned 0 outputs for the 1 asked (scores)"),
        ([None], "the daemon failed on this request"),
    ],
    ids=["not-a-list", "too-few", "not-an-array"],
)
def test_a_runner_that_returns_no_outputs_costs_its_request_internal_and_the_worker_serves_on(models, broken, error):
    """A runner's bug (what it returns is not one array per output asked) is answered
    INTERNAL once, never OK with an output missing; the worker lives, holds no open call
    and serves the next job."""
    lane, backend, replies = make_lane(ClassConfig("t", order=0, workers=1), models)
    model, x = models["mlp-light"], np.full((1, 64), 0.5, np.float32)
    try:
        backend.broken = broken
        lane.enqueue(job(model, x, route=1))
        got = collect(replies, 1)
        backend.broken = None
        lane.enqueue(job(model, x, route=2))
        got.update(collect(replies, 1))
    finally:
        lane.crew.stop(2.0)
    assert got[1].status is Status.INTERNAL and got[1].error.startswith(error), got[1].error
    assert got[2].status is Status.OK
    np.testing.assert_allclose(got[2].outputs["scores"], reference("mlp-light", x), atol=1e-5)
    now_ns = time.monotonic_ns()
    assert lane.backlog.depth == 0 and lane.crew.calls.oldest_ns(now_ns) == now_ns
    assert lane.stats.failed == 1 and lane.stats.completed == 1


def test_a_batched_call_whose_outputs_lack_rows_is_run_again_one_job_at_a_time(models, caplog):
    """A batched call answering fewer rows than it was given would hand a job another's rows:
    its jobs run again one call each, and each gets its own answer."""
    klass = ClassConfig("bulk", order=1, workers=1, max_batch=8, batch_wait_us=0)
    lane, backend, replies = make_lane(klass, models)
    model = models["mlp-light"]
    rows = {route: np.full((1, 64), route / 10, np.float32) for route in (1, 2, 3)}
    backend.truncated = 1  # a call of more rows answers one
    try:
        backend.gate.clear()  # the first job holds the worker while the others queue behind it
        lane.enqueue(job(model, rows[1], route=1))
        assert backend.entered.wait(10)
        for route in (2, 3):
            lane.enqueue(job(model, rows[route], route=route))
        backend.gate.set()
        got = collect(replies, 3)
    finally:
        lane.crew.stop(2.0)
    assert backend.calls == [1, 2, 1, 1]
    assert "a batched call of mlp-light failed; its 2 jobs run alone: it returned {'scores': 1} rows" in caplog.text
    for route, x in rows.items():
        assert got[route].status is Status.OK
        np.testing.assert_allclose(got[route].outputs["scores"], reference("mlp-light", x), atol=1e-5)


def test_a_re_timing_the_backend_fails_leaves_the_price_the_backlog_empty_and_the_worker_serving(models):
    """Re-timing runs the warm-up sample; a backend failing then (a transient device error)
    keeps the old price, takes the re-timing off the backlog, and the worker serves on."""
    lane, backend, replies = make_lane(ClassConfig("t", order=0, workers=1), models)
    model, x = models["mlp-light"], np.full((1, 64), 0.5, np.float32)
    price_ns = lane.service.estimate_ns(model.name)
    try:
        backend.failing = True
        lane._remeasure(model, time.monotonic_ns())
        end = time.monotonic() + 10
        while lane.backlog.depth and time.monotonic() < end:
            time.sleep(0.001)
        assert lane.backlog.depth == 0, "the failed re-timing stayed on the backlog"
        assert lane.service.estimate_ns(model.name) == price_ns
        backend.failing = False
        lane.enqueue(job(model, x, route=1))
        got = collect(replies, 1)
    finally:
        lane.crew.stop(2.0)
    assert got[1].status is Status.OK


def test_reject_queued_answers_unavailable_without_running(models):
    klass = ClassConfig("t", order=0)
    lane, backend, replies = make_lane(klass, models)
    heavy = models["cnn-heavy"]
    try:
        # A slow first job holds the only worker while the rest queue up behind it.
        lane.enqueue(job(heavy, np.zeros((64, 3, 64, 64), np.float32), route=0))
        end = time.monotonic() + 10
        while not backend.calls and time.monotonic() < end:
            time.sleep(0.001)
        for i in range(1, 6):
            lane.enqueue(job(heavy, np.zeros((1, 3, 64, 64), np.float32), route=i))
        # Queued again once answered (a stop takes back what a worker held, which may be so): not counted.
        answered = job(heavy, np.zeros((1, 3, 64, 64), np.float32), route=6)
        lane.enqueue(answered)
        answered.answered = True
        rejected = lane.crew.reject_queued("shutting down")
        got = collect(replies, 6)
    finally:
        lane.crew.stop(5.0)
    unavailable = [r for r in got.values() if r.status is Status.UNAVAILABLE]
    assert len(unavailable) == rejected == 5
    assert backend.rows == 64


def test_lane_start_reports_a_model_that_cannot_load(models, tmp_path):
    broken = tmp_path / "model.onnx"
    broken.write_bytes(b"not an onnx file")
    entry = models["mlp-light"]
    bad = replace(entry, variant=replace(entry.variant, path=broken))
    lane = Lane(ClassConfig("t", order=0), [bad], OnnxRuntimeCpu())
    with pytest.raises(Exception, match=r"(?i)protobuf|invalid|load"):
        lane.start()


class ThreadRecordingBackend:
    """The real ONNX Runtime backend; each runner records the class it was loaded for
    and the threads that called it. Stands in for a GPU runtime's per-thread state."""

    def __init__(self) -> None:
        self.runners: list[ThreadRecordingRunner] = []
        self._real = OnnxRuntimeCpu()

    def load(self, model: ModelEntry, lane: ClassConfig) -> ThreadRecordingRunner:
        runner = ThreadRecordingRunner(model.name, lane.cuda_graph, self._real.load(model, lane))
        self.runners.append(runner)
        return runner


class ThreadRecordingRunner:
    def __init__(self, model: str, cuda_graph: bool, runner) -> None:
        self.model, self.cuda_graph, self._runner = model, cuda_graph, runner
        self.threads: list[int] = []

    def run(self, inputs, output_names):
        self.threads.append(threading.get_ident())
        return self._runner.run(inputs, output_names)

    def close(self) -> None:
        self._runner.close()


def test_the_inline_runners_are_the_cheap_models_warmed_on_the_loop_thread_with_no_graph_thread_recording_backend(
    models,
):
    """A GPU runtime keeps handles per thread, and ONNX Runtime captures CUDA graphs in
    global mode: the loop's runners are loaded without a graph, one per model, and those
    of the models priced within inline_max_us are called on the loop's thread (this
    test's) when it takes the lane up; a worker's runners never are."""
    backend = ThreadRecordingBackend()
    klass = ClassConfig("realtime", order=0, inline_max_us=300, cuda_graph=True)
    lane = Lane(klass, list(models.values()), backend)
    loader = threading.Thread(target=lane.start)  # the daemon's loader thread
    loader.start()
    loader.join(60)
    try:
        lane.own()
    finally:
        lane.crew.stop(2.0)
    loop = threading.get_ident()
    workers = [r for r in backend.runners if r.cuda_graph]
    inline = {r.model: r for r in backend.runners if not r.cuda_graph}
    assert len(workers) == len(models) and set(inline) == set(models)
    assert loop not in inline["cnn-heavy"].threads  # priced over 300 us: not warmed on the loop
    assert all(loop not in r.threads for r in workers)
    # Warmed where loaded, then called once on the loop's thread, which alone calls it after.
    assert inline["mlp-light"].threads.count(loop) == 1 and inline["mlp-light"].threads[-1] == loop


def test_a_request_that_fails_on_the_inline_path_gets_internal_and_the_next_one_its_answer(models):
    """The loop's own call fails for one request: that request gets INTERNAL with the
    backend's error, exactly once, and the lane is idle and serves the next one inline."""
    klass = ClassConfig("realtime", order=0, inline_max_us=300)
    lane, _, replies = make_lane(klass, {"mlp-light": models["mlp-light"]})
    model = models["mlp-light"]
    try:
        for route, value in ((1, POISON), (2, 0.5)):
            x = np.full((1, 64), value, np.float32)
            frames = encode_request(route, model="mlp-light", klass="realtime", deadline_ms=1000.0, inputs={"x": x})
            request = decoded(frames)
            measured = model.signature.measure(request)
            lane.offer(REPLIES.route(route), request, model, *measured, time.monotonic_ns(), inline_ns=300_000)
        got = collect(replies, 2)
    finally:
        lane.crew.stop(2.0)
    assert got[1].status is Status.INTERNAL and "poisoned row" in got[1].error
    assert got[2].status is Status.OK
    expected = reference("mlp-light", np.full((1, 64), 0.5, np.float32))
    np.testing.assert_allclose(got[2].outputs["scores"], expected, atol=1e-5)
    assert lane.stats.inline == 2 and lane.backlog.depth == 0
    assert lane.stats.failed == 1 and lane.stats.completed == 1


def test_an_inline_call_that_returns_too_few_outputs_is_answered_internal_not_ok(models):
    """On the loop's own runner too, a call that returns fewer outputs than asked gets INTERNAL
    saying so; the lane is left idle."""
    lane, backend, replies = make_lane(ClassConfig("realtime", order=0, inline_max_us=300), models)
    model = models["mlp-light"]
    x = np.full((1, 64), 0.5, np.float32)
    request = decoded(encode_request(1, model="mlp-light", deadline_ms=1000.0, inputs={"x": x}))
    try:
        backend.broken = []
        lane.offer(
            REPLIES.route(1), request, model, *model.signature.measure(request), time.monotonic_ns(), inline_ns=300_000
        )
        got = collect(replies, 1)
    finally:
        lane.crew.stop(2.0)
    assert got[1].status is Status.INTERNAL and "returned 0 outputs for the 1 asked" in got[1].error
    assert lane.stats.inline == 1 and lane.backlog.depth == 0


@pytest.mark.parametrize("where", ["before-the-call", "after-the-answer"])
def test_a_bug_around_an_inline_call_answers_its_request_once_and_leaves_the_lane_idle(models, monkeypatch, where):
    """A bug on the loop's own path (here put in the figures before the call, or in the price's
    update after the answer) costs its request one reply, INTERNAL or the OK already sent, never
    a second one or none, and never leaves the job on the backlog."""
    lane, _, replies = make_lane(ClassConfig("realtime", order=0, inline_max_us=300), models)
    model, x = models["mlp-light"], np.full((1, 64), 0.5, np.float32)

    def bug(*_args: object) -> None:
        raise RuntimeError("a bug put here by the test")

    target = lane.stats if where == "before-the-call" else lane.service
    monkeypatch.setattr(target, "call" if where == "before-the-call" else "observe", bug)
    request = decoded(encode_request(1, model="mlp-light", deadline_ms=1000.0, inputs={"x": x}))
    try:
        lane.offer(
            REPLIES.route(1), request, model, *model.signature.measure(request), time.monotonic_ns(), inline_ns=300_000
        )
        got = collect(replies, 1)
    finally:
        lane.crew.stop(2.0)
    expected = Status.INTERNAL if where == "before-the-call" else Status.OK
    assert got[1].status is expected and lane.backlog.depth == 0


def test_an_output_the_wire_cannot_carry_is_answered_internal_with_its_dtype(models):
    """A float64 output takes neither the fast encoder nor the checked one: one INTERNAL
    reply says why; a float32 one is OK."""
    from edged.serve.answers import _reply_frames

    ran = job(models["mlp-light"], np.zeros((1, 64), np.float32), route=1)
    frames, ok = _reply_frames(ran, 1, 2, 3, {"scores": np.zeros((1, 10), np.float64)}, None)
    reply = decode_reply([bytes(f) for f in frames])
    assert not ok and reply.status is Status.INTERNAL and "float64" in reply.error
    frames, ok = _reply_frames(ran, 1, 2, 3, {"scores": np.zeros((1, 10), np.float32)}, None)
    assert ok and decode_reply([bytes(f) for f in frames]).status is Status.OK


def test_a_shed_is_decided_from_the_header_and_the_payload_is_looked_at_only_once_admitted(models, monkeypatch):
    """Shedding at wire speed: the lane's admission reads the header's sizes, and only a
    request it admits has its payload viewed as arrays."""
    lane, _, replies = make_lane(ClassConfig("t", order=0), {"mlp-light": models["mlp-light"]})
    model = models["mlp-light"]
    viewed: list[object] = []
    real_views = lane_module.tensor_views
    monkeypatch.setattr(lane_module, "tensor_views", lambda request: viewed.append(request.id) or real_views(request))
    x = np.ones((1, 64), np.float32)
    try:
        for route, deadline_ms in ((1, 1e-6), (2, 1000.0)):
            request = decoded(encode_request(route, model="mlp-light", deadline_ms=deadline_ms, inputs={"x": x}))
            measured = model.signature.measure(request)
            outcome = lane.offer(REPLIES.route(route), request, model, *measured, time.monotonic_ns())
            assert isinstance(outcome, Shed) == (route == 1), outcome
        got = collect(replies, 1)
    finally:
        lane.crew.stop(2.0)
    assert viewed == [2] and got[2].status is Status.OK


def test_a_request_whose_payload_fails_to_view_gives_its_bytes_back(models, monkeypatch):
    """The bytes budget is held once admission admits, before the payload is viewed: a view
    that raises (the caller answers that request) must not leave the peer's bytes held, or
    a client is shed for bytes it no longer has pending."""
    pending = PendingBytes()
    model = models["mlp-light"]
    lane = Lane(ClassConfig("t", order=0), [model], CountingBackend(), pending=pending)
    lane.start()
    lane.own()

    def fail(request: object) -> None:
        raise ValueError("a payload that cannot be viewed")

    monkeypatch.setattr(lane_module, "tensor_views", fail)
    request = decoded(encode_request(1, model="mlp-light", inputs={"x": np.ones((1, 64), np.float32)}))
    try:
        with pytest.raises(ValueError, match="cannot be viewed"):
            lane.offer(REPLIES.route(1), request, model, *model.signature.measure(request), time.monotonic_ns())
    finally:
        lane.crew.stop(2.0)
    assert pending.total == 0
    assert lane.stats.admitted == 0 and lane.backlog.depth == 0


def test_a_lane_admits_on_its_owner_loop_alone(models):
    """Admission state has one writer: the class's loop, which took the lane up (`own`).
    An offer from any other thread raises, as asyncio's loop checks its thread."""
    lane, _, _ = make_lane(ClassConfig("t", order=0), {"mlp-light": models["mlp-light"]})
    model = models["mlp-light"]
    request = decoded(encode_request(9, model="mlp-light", inputs={"x": np.ones((1, 64), np.float32)}))

    def offer() -> None:
        lane.offer(REPLIES.route(9), request, model, *model.signature.measure(request), time.monotonic_ns())

    error = raised_on_thread(offer, RuntimeError, "not-the-loop")
    lane.crew.stop(2.0)
    assert error is not None and "not on 'not-the-loop'" in str(error)
    assert lane.stats.received == 0 and REPLIES.queue.empty()


def test_the_inline_cap_left_out_follows_the_loops_measured_hand_off_within_a_share_of_the_deadline(models):
    """What a loop may run itself: a job its two hand-offs to a worker and back would slow
    by 2% (100 hand-offs, as the loop measures them), never past 1/10 of the shortest
    deadline among the requests its loop reads (the class's own, or for the loop of the
    shared endpoints, every class's, as read lately), and with requests behind it, a queue's
    worth of them within that deadline; as set where set; nothing for a class that waits to
    fill batches."""
    backend = CountingBackend()
    realtime = Lane(ClassConfig("realtime", order=0, deadline_ms=20.0, queue_capacity=32), [], backend)
    assert realtime.inline_cap.limit_ns(8_000) == 800_000  # a quick box: 0.8 ms
    assert realtime.inline_cap.limit_ns(5_000) == 500_000
    assert realtime.inline_cap.limit_ns(40_000) == 2_000_000  # a loaded one, bounded by 20 ms / 10
    assert realtime.inline_cap.limit_ns(0) == 0  # nothing measured yet: nothing inline
    # With requests behind it on its socket, unread while it runs: a queue of 32 such in one deadline.
    assert realtime.inline_cap.limit_ns(40_000, behind=True) == 20_000_000 // 32
    standard = Lane(ClassConfig("standard", order=1, deadline_ms=200.0), [], backend)
    assert standard.inline_cap.limit_ns(400_000) == 20_000_000
    # Its loop read realtime's requests lately (LoopDeadlines), on the shared endpoints.
    assert standard.inline_cap.limit_ns(400_000, read_ms=20.0) == 2_000_000
    assert standard.inline_cap.limit_ns(400_000, behind=True, read_ms=20.0) == 20_000_000 // 64
    # Only long deadlines read lately: never past what its own class's deadline allows.
    assert realtime.inline_cap.limit_ns(40_000, behind=True, read_ms=3_600_000.0) == 20_000_000 // 32
    fixed = Lane(ClassConfig("standard", order=1, inline_max_us=300), [], backend)
    assert fixed.inline_cap.limit_ns(40_000) == 300_000
    bulk = Lane(ClassConfig("bulk", order=2, deadline_ms=5000.0, batch_wait_us=500), [], backend)
    assert bulk.inline_cap.limit_ns(40_000) == 0


def test_a_loops_shortest_deadline_read_lasts_a_while_then_follows_what_it_reads_now() -> None:
    """A loop that read realtime's deadline keeps it for its inline cap 10 to 20 s (the span of
    DEADLINE_KEPT_NS it was read in, and the next), then follows the deadlines it reads, until
    a shorter one comes."""
    span = DEADLINE_KEPT_NS
    deadlines = LoopDeadlines()
    deadlines.read(20.0, 0)  # as a loop of the shared endpoints takes up its lanes
    deadlines.read(200.0, span // 2)
    assert deadlines.shortest_ms == 20.0
    deadlines.read(200.0, span + span * 99 // 100)  # the next span, late in it: the first still counts
    assert deadlines.shortest_ms == 20.0
    deadlines.read(200.0, 2 * span)  # 20 s on: it no longer does, however late the last span began
    assert deadlines.shortest_ms == 200.0
    deadlines.read(1000.0, 2 * span + 1)  # a longer one in the same span: the shortest stands
    assert deadlines.shortest_ms == 200.0
    deadlines.read(5.0, 2 * span + 2)
    assert deadlines.shortest_ms == 5.0
    deadlines.read(1000.0, 3 * span)
    assert deadlines.shortest_ms == 5.0
    deadlines.read(2.0, 3 * span + 1)
    deadlines.read(1000.0, 5 * span)  # a whole span unread: what it reads now, alone
    assert deadlines.shortest_ms == 1000.0


def test_a_batch_wait_ends_even_when_its_deadline_passes_inside_the_queue(models: dict[str, ModelEntry]) -> None:
    """CPython 3.11's SimpleQueue.get(timeout=...) blocks until the next put when its deadline
    passes inside the call, after it found the queue's lock free (a niced worker preempted
    there, on a busy box). A bulk worker then sat in its batch wait holding an admitted job,
    the lane looked stopped, admission shed all that came, and no put ever woke it. A batch
    wait of 1 us, 20,000 times on an empty queue whose lock is free, must end every time."""
    jobs: queue.SimpleQueue[object] = queue.SimpleQueue()
    first = job(models["mlp-light"], np.zeros((1, 64), np.float32), route=0)
    done = threading.Event()

    def batches() -> None:
        for _ in range(20_000):
            jobs.put(first)
            jobs.get()
            fill([first], jobs, max_batch=16, wait_us=1, max_rows=16)
        done.set()

    threading.Thread(target=batches, daemon=True).start()
    assert done.wait(60), "a batch wait never ended"


class FirstTwoCallsHeld:
    """The real backend, whose first two calls once `armed` each wait for their own gate."""

    def __init__(self) -> None:
        self.real = OnnxRuntimeCpu()
        self.armed = False
        self.calls = 0
        self.gates = [threading.Event(), threading.Event()]
        self.entered = [threading.Event(), threading.Event()]

    def load(self, model: ModelEntry, lane: ClassConfig) -> object:
        real, owner = self.real.load(model, lane), self

        class Runner:
            def run(self, inputs, output_names):
                if owner.armed and owner.calls < 2:
                    call = owner.calls
                    owner.calls += 1
                    owner.entered[call].set()
                    assert owner.gates[call].wait(timeout=30), "the test never opened the gate"
                return real.run(inputs, output_names)

            def close(self) -> None:
                real.close()

        return Runner()


def hung_with_one_held_back(models: dict[str, ModelEntry]) -> tuple[Lane, FirstTwoCallsHeld]:
    """A lane whose worker is inside request 72's call, which hangs, holding 73 (another
    model) back from that call's batch; 71 was answered OK before."""
    backend = FirstTwoCallsHeld()
    klass = ClassConfig("held", order=0, max_batch=8, batch_wait_us=0, inline_max_us=0, stuck_after_ms=100)
    lane = Lane(klass, [models["mlp-light"], models["cnn-heavy"]], backend)
    lane.start()
    lane.own()
    backend.armed = True
    light, heavy = models["mlp-light"], models["cnn-heavy"]
    x, image = np.ones((1, 64), np.float32), np.zeros((1, 3, 64, 64), np.float32)
    lane.enqueue(job(light, x, 71))
    assert backend.entered[0].wait(5)  # the worker is inside 71's call
    lane.enqueue(job(light, x, 72))
    lane.enqueue(job(heavy, image, 73))  # queued behind 72, not of its batch
    backend.gates[0].set()
    assert backend.entered[1].wait(5)  # 72's call hangs, 73 held back
    assert collect(REPLIES.queue, 1)[71].status is Status.OK
    return lane, backend


def test_a_job_held_back_from_a_hung_batch_runs_at_once_on_the_worker_that_replaces_it(models):
    """The watchdog answers 72 and replaces the worker, and 73 runs on the replacement while
    72's call still hangs (before: the worker given up on dropped 73; then it kept 73 until
    the hung call returned, which may be never)."""
    lane, backend = hung_with_one_held_back(models)
    time.sleep(0.2)
    lane.crew.check_stuck(time.monotonic_ns())
    got = collect(REPLIES.queue, 2)
    assert {route: reply.status for route, reply in got.items()} == {72: Status.INTERNAL, 73: Status.OK}
    backend.gates[1].set()
    lane.crew.stop(5.0)
    assert REPLIES.queue.empty(), "a request was answered twice"
    assert lane.backlog.depth == 0


def test_a_stop_beside_a_hung_batch_answers_the_job_held_back_from_it_unavailable(models):
    """The stop's grace runs out with 72's call hung: 72 is answered INTERNAL and 73, which
    the stuck worker held back, UNAVAILABLE (before: never answered)."""
    lane, backend = hung_with_one_held_back(models)
    assert stop_lanes([lane], time.monotonic() + 0.2) == 1
    got = collect(REPLIES.queue, 2)
    assert {route: reply.status for route, reply in got.items()} == {72: Status.INTERNAL, 73: Status.UNAVAILABLE}
    backend.gates[1].set()
    assert lane.backlog.depth == 0


def test_a_hung_re_timing_is_watched_its_worker_replaced_and_its_charge_settled_once(models):
    """A re-timing is a backend call like any: hung, the watchdog replaces its worker, which
    serves at once, and takes its charge off the backlog; the call's late return settles
    nothing twice (before: not watched, the lane's one worker gone for as long as it hung)."""
    backend = FirstTwoCallsHeld()
    backend.gates[1].set()  # only the re-timing's first call hangs
    klass = ClassConfig("retime", order=0, workers=1, inline_max_us=0, stuck_after_ms=100)
    lane = Lane(klass, [models["mlp-light"]], backend)
    lane.start()
    lane.own()
    backend.armed = True
    model = models["mlp-light"]
    lane._remeasure(model, time.monotonic_ns())
    # Charged the calls it makes (before: one), so that arrivals meanwhile queue behind all of them.
    assert lane.backlog.work_ns == (WARMUP_RUNS - 1) * lane.service.estimate_ns(model.name)
    assert lane.backlog.depth == 1 and backend.entered[0].wait(5)
    hung = next(thread for thread in threading.enumerate() if thread.name == "lane-retime-0")
    time.sleep(0.2)
    lane.crew.check_stuck(time.monotonic_ns())
    assert lane.backlog.depth == 0
    lane.enqueue(job(model, np.ones((1, 64), np.float32), 81))
    assert collect(REPLIES.queue, 1)[81].status is Status.OK
    backend.gates[0].set()
    hung.join(5)
    assert not hung.is_alive() and lane.backlog.depth == 0 and lane.backlog.work_ns == 0
    lane.crew.stop(5.0)
