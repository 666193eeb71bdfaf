"""Admission: admit a request to its class's queue, or shed it at once.

Pure decisions over a lane's live figures (its prices: edged.serve.pricing; its
backlog and pace: here); nothing here blocks, sleeps or sends. A shed is a value with
a reason and a retry hint, not an exception.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from edged.config.classes import ClassConfig

# Admission keeps 1/this of the queued work ahead, and of the request's own price, in
# hand (20%), or for its own price, the bound its runs measured where that is more
# (a pipeline's: ServiceTimes.bound_ns, what its runs rarely pass): see admit().
QUEUE_SLACK_DIVISOR = 5


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str  # "queue_full", "deadline" or "bytes": the stats counter it lands in
    message: str
    retry_after_ms: float
    beyond_one_run: bool = False  # the deadline is shorter than the model's own run


# A lane's pace: the priced work it answers per ns of wall time while it holds work,
# sampled over PACE_WINDOW_NS (or a shorter busy spell, of at least PACE_MIN_NS), each
# sample weighing PACE_WEIGHT in the average. After PACE_STALE_NS idle, it starts over
# from a guess (Backlog.starting_pace: the ideal, at the share of a core the box's other
# load leaves). On a watched lane (ClassConfig.gives_way) its first sample then
# replaces the guess whole: averaged with it, a lane starved through its first window
# would look half as fast as the guess in the next. Elsewhere it is averaged: a top
# lane's first sample of a short, crowded spell, taken whole, shed its next requests.
PACE_WINDOW_NS = 50_000_000
PACE_MIN_NS = 1_000_000
PACE_WEIGHT = 0.5
PACE_STALE_NS = 1_000_000_000
# The sample under way counts once it is this long: over less, a worker still waking, or
# waiting for the GIL behind a loop reading many requests, looks like a lane stopped.
LIVE_MIN_NS = 10_000_000
# How far ahead a lane's pace is trusted: TRUST_RATIO times as long as the lane has been
# busy without a break, and TRUST_MIN_NS in any case, once its sample under way has
# LIVE_MIN_NS of its own time and one of its calls has come back (nothing before: on a
# busy box a 3.5 ms call took 35 ms and more); its own work ahead beyond that counts
# UNPROVEN_FACTOR times over. A burst is read and admitted within a few ms,
# before any sample can show what reading it does to the lane (on two cores, niced bulk
# workers beside a socket loop reading one were seen to take 70-130 ms over a 2 ms
# call; bench/burst.py, 2026-11-25): admitted at the ideal pace, a third of such a burst
# expired in the queue. A
# long deadline still admits a long queue; a short one, only what the lane has earned.
TRUST_RATIO = 4
TRUST_MIN_NS = 20_000_000
UNPROVEN_FACTOR = 4


class Outlook(NamedTuple):
    """What a lane can promise now: the pace its work ahead goes at, how much of that
    work (in ns at that pace) it trusts the pace for (see TRUST_RATIO), and how much of
    its backlog the calls in flight have done already. A tuple: one is made for every
    arrival."""

    pace: float
    trusted_ns: float = math.inf
    done_ns: int = 0


class Backlog:
    """What a lane has accepted and not yet answered: a count, its estimated work, and
    the pace at which the lane gets through such work.

    Owned by a Lane. `Lane.offer` adds (the class's loop); whoever answers a job takes
    it away (the loop for a job it ran inline, else a worker, the watchdog or the
    shutdown): every change under `_lock`. `depth`, `work_ns` and `pace` are single
    fields, so a reader on any thread sees a value some moment held, never a torn one;
    `depth` and `work_ns` are plain attributes, read on every arrival (a property is a
    call there), and written here alone.

    The pace is measured, not assumed: whatever else takes the lane's cores (the
    higher classes it yields to, the loops reading a burst, another process)
    slows it, and admission divides the work ahead by it.
    """

    def __init__(
        self,
        workers: int = 1,
        on_empty: Callable[[], None] | None = None,
        watched: bool = False,
        share: Callable[[], float] | None = None,
    ) -> None:
        self.depth = 0
        self.work_ns = 0
        self._lock = threading.Lock()
        self._on_empty = on_empty  # told each time the last job is answered
        self._ideal = float(workers)  # each worker getting through a priced ns in a ns
        # The share of a core each worker gets now, by the box's other load (edged.serve.contention):
        # what the pace starts from after an idle spell.
        self._share = share
        self._pace = self._ideal
        self._measured = False  # whether the pace is a sample's, or the guess (unmeasured, or stale)
        self._watched = watched  # see PACE_STALE_NS
        self._spell_ns = 0  # when the current sample began
        self._busy_since_ns = 0  # when the lane last went from idle to holding work
        self._answered_ns = 0  # priced work answered since then
        # Time its workers spent waiting for higher classes since then (edged.serve.lanes.precedence):
        # not the lane's own time, for admission counts that work apart (`above_ns`).
        self._yielded_ns = 0
        self._yielding_since_ns = 0  # while a worker waits: since when
        self._last_ns = 0  # when the last job was answered

    def add(self, cost_ns: int) -> None:
        with self._lock:
            if not self.depth:
                now_ns = time.monotonic_ns()
                if now_ns - self._last_ns > PACE_STALE_NS:
                    self._pace, self._measured = self.starting_pace, False
                self._new_spell(now_ns)
                self._busy_since_ns = now_ns
            self.depth += 1
            self.work_ns += cost_ns

    def finish(self, cost_ns: int, ran: bool = True) -> None:
        """A job is answered; `ran`: its work was done. A job answered unrun (expired,
        refused at a stop, its call lost) leaves the backlog without counting toward the
        pace: counted, one burst's expiries made bulk's pace 1.6 times its ideal, and 12
        of the 13 requests admitted on it expired."""
        now_ns = time.monotonic_ns()
        with self._lock:
            self.depth -= 1
            self.work_ns -= cost_ns
            if ran:
                self._answered_ns += cost_ns
            self._last_ns = now_ns
            spell_ns = now_ns - self._spell_ns
            emptied = self.depth == 0
            if spell_ns >= PACE_WINDOW_NS or (emptied and spell_ns >= PACE_MIN_NS):
                own_ns = self._own_ns(now_ns)
                if own_ns >= PACE_MIN_NS:
                    weight = 1.0 if self._watched and not self._measured else PACE_WEIGHT
                    sample = self._answered_ns / own_ns
                    self._pace = max((1 - weight) * self._pace + weight * sample, self._ideal / 100)
                    self._measured = True
                self._new_spell(now_ns)
        if emptied and self._on_empty is not None:
            self._on_empty()

    def yielding(self, waiting: bool) -> None:
        """A worker starts (or ends) waiting for the higher classes' work."""
        now_ns = time.monotonic_ns()
        with self._lock:
            if waiting:
                self._yielding_since_ns = now_ns
            elif self._yielding_since_ns:
                self._yielded_ns += now_ns - max(self._yielding_since_ns, self._spell_ns)
                self._yielding_since_ns = 0

    def _new_spell(self, now_ns: int) -> None:
        self._spell_ns, self._answered_ns, self._yielded_ns = now_ns, 0, 0

    def _own_ns(self, now_ns: int) -> int:
        """The current sample's time so far, less what its workers spent yielding."""
        waiting_ns = now_ns - max(self._yielding_since_ns, self._spell_ns) if self._yielding_since_ns else 0
        return now_ns - self._spell_ns - self._yielded_ns - waiting_ns

    def outlook(self, now_ns: int, in_flight: tuple[int, int], watched: bool = True) -> Outlook:
        """The lane's outlook now (its loop, on each arrival), from its calls
        `in_flight` (OpenCalls.progress: the part of their work done, and the whole).

        Its pace: the average, or the current sample's own when that is slower: the work
        answered in it plus the calls under way (`in_hand_ns`, credited whole, as if
        they returned this instant), over its time so far. A lane starved of the CPU
        answers next to nothing for tens of ms, and admission must see that while it
        lasts, not when the sample closes. How far ahead: see TRUST_RATIO. Both only
        for a lane `watched` (see Lane.offer); another has its average, trusted in full.
        Both count the lane's own time: not what its workers spent waiting for the higher
        classes' work, which admission counts apart.
        Read without the lock: a sample that restarts meanwhile gives a figure that is
        too high, which the average then bounds."""
        done_ns, in_hand_ns = in_flight
        if not self.depth or not watched:
            return Outlook(self._pace, done_ns=done_ns)
        trusted_ns = TRUST_MIN_NS + TRUST_RATIO * (now_ns - self._busy_since_ns)
        elapsed_ns = self._own_ns(now_ns)
        if elapsed_ns < LIVE_MIN_NS:
            # Nothing seen yet of this spell: no work ahead is trusted at its pace.
            return Outlook(self._pace, 0, done_ns)
        live = (self._answered_ns + in_hand_ns) / elapsed_ns
        # Calls in flight are credited as if done: until one has come back since the lane
        # took work, that is a guess, and nothing ahead is trusted on it.
        trusted_ns = trusted_ns if self._last_ns > self._busy_since_ns else 0
        return Outlook(max(min(self._pace, live), self._ideal / 100), trusted_ns, done_ns)

    @property
    def average_job_ns(self) -> float:
        """The estimated work of the average job held (0 with none)."""
        return self.work_ns / max(self.depth, 1)

    @property
    def starting_pace(self) -> float:
        """The pace the lane starts from after an idle spell: its workers' count, times the
        share of a core each gets beside the box's other load (edged.serve.contention)."""
        return self._ideal * (self._share() if self._share else 1.0)

    @property
    def pace(self) -> float:
        """Priced ns of work the lane answers per ns while it has work (its workers' count, ideally)."""
        return self._pace


def admit(
    klass: ClassConfig,
    backlog: Backlog,
    cost_ns: int,
    budget_ns: int,
    above_ns: int = 0,
    outlook: Outlook | None = None,
    bound_ns: int = 0,
) -> Shed | None:
    """None to admit; a Shed when the queue is full or the deadline cannot be met.
    `above_ns` is the work of higher classes that this one waits for (it yields);
    `outlook` what the lane can promise now (`Backlog.outlook`; if None, its average
    pace, trusted without limit, with nothing in flight done); `bound_ns` what the
    request's own run rarely passes, where its runs measured it (a pipeline's)."""
    depth = backlog.depth
    if depth >= klass.queue_capacity:
        # One slot frees when the average job ahead finishes on one of the workers.
        per_job_ns = backlog.average_job_ns
        return Shed(
            "queue_full",
            f"class {klass.name!r} has {depth} requests waiting or running, its capacity "
            f"(classes.{klass.name}.queue_capacity = {klass.queue_capacity})",
            retry_hint_ms(per_job_ns / klass.workers),
        )
    outlook = outlook or Outlook(backlog.pace)
    own_ns = max(backlog.work_ns - outlook.done_ns, 0) / outlook.pace
    if own_ns > outlook.trusted_ns:
        own_ns = outlook.trusted_ns + (own_ns - outlook.trusted_ns) * UNPROVEN_FACTOR
    queued_ns = int(own_ns) + above_ns
    # The estimate of a long queue errs by a share of its length, and a job admitted with
    # no slack then expires: admission keeps that share in hand.
    ahead_ns = queued_ns + queued_ns // QUEUE_SLACK_DIVISOR
    # Behind work, its own run goes at the pace too (one worker's share, never faster than
    # its price): at its price, a burst on a busy box (bulk at a tenth of a core, a 3.6 ms
    # call taking 45 ms) admitted requests that expired in their own run. Not on an idle
    # lane: only a run can measure its pace again, and realtime, slowed once, shed every
    # request until that pace went stale (59 of 190 in 1.2 s, bench/isolation_compare.py).
    run_ns = int(cost_ns * max(klass.workers / outlook.pace, 1.0)) if depth else cost_ns
    # Its run's share in hand, or its measured bound: both would count its spread twice.
    own_ns = max(run_ns + run_ns // QUEUE_SLACK_DIVISOR, bound_ns)
    if ahead_ns + own_ns > budget_ns:
        if own_ns > budget_ns:
            message = (
                f"class {klass.name!r} cannot meet the deadline: the model alone takes about {run_ns / 1e6:.3f} ms "
                f"({own_ns / 1e6:.3f} with what is kept in hand), more than the {max(budget_ns, 0) / 1e6:.3f} ms "
                "left; a retry needs a longer deadline"
            )
        else:
            message = (
                f"class {klass.name!r} cannot meet the deadline: about {ahead_ns / 1e6:.3f} ms of work is ahead "
                f"of this request and {max(budget_ns, 0) / 1e6:.3f} ms are left"
            )
        return Shed(
            "deadline", message, retry_hint_ms(ahead_ns + own_ns - budget_ns), beyond_one_run=own_ns > budget_ns
        )
    return None


def retry_hint_ms(ns: float) -> float:
    """A retry hint from a wait in ns."""
    # Rounded up to 0.1 ms: a retry hint of 0 would invite an immediate, doomed retry.
    return max(round(ns / 1e6 + 0.05, 1), 0.1)
