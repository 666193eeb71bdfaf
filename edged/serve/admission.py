"""Admission: admit a request to its class's queue, or shed it at once.

Pure decisions over a lane's live figures (prices: edged.serve.pricing; backlog and pace: here);
nothing here blocks, sleeps or sends. A shed is a value (a reason, a retry hint), not an exception.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from edged.config.classes import ClassConfig

# Admission's constants, each a judgement with its reason. A lane's pace is the priced work it answers per ns
# while it holds work, sampled over spells (Backlog); its trust is how much work ahead it admits at that pace.

# Kept in hand: 1/5 of the work ahead and of the request's own run, for a long queue's estimate errs by a share of
# its length, and a job admitted with no slack then expires.
QUEUE_SLACK_DIVISOR = 5
# A pace sample spans this much busy time: several calls of any model, and short enough to follow a change of load.
PACE_WINDOW_NS = 50_000_000
# ... or a shorter busy spell of at least this: under it, one call's jitter would be the whole sample.
PACE_MIN_NS = 1_000_000
# A sample's weight in the pace: one crowded spell moves it halfway, not all the way.
PACE_WEIGHT = 0.5
# Idle this long, the pace starts over from Backlog.starting_pace: an old sample says little of the box now.
PACE_STALE_NS = 1_000_000_000
# The pace never falls below this share of the ideal: admission divides by it, and a lane starved through one
# sample must still admit the work that measures it again.
PACE_FLOOR = 0.01
# The sample under way counts once this long: before, a worker still waking, or waiting for the GIL behind a
# loop reading a burst, looks like a lane stopped.
LIVE_MIN_NS = 10_000_000
# A watched lane trusts its pace for this much work ahead at least, once a call has come back in its spell ...
TRUST_MIN_NS = 20_000_000
# ... plus this many times its unbroken busy spell: a burst is read and admitted within a few ms, before any
# sample shows what reading it does to the lane.
TRUST_RATIO = 4
# Its own work ahead past the trusted counts this many times over: a long deadline still admits a long queue,
# a short one only what the lane has earned.
UNPROVEN_FACTOR = 4


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str  # "queue_full", "deadline" or "bytes": the stats counter it lands in
    message: str
    retry_after_ms: float
    beyond_one_run: bool = False  # the deadline is shorter than the model's own run


class Outlook(NamedTuple):
    """What a lane can promise now: its pace, how much work ahead (ns at that pace) it trusts
    the pace for, and how much of its backlog the calls in flight have done. A tuple: one per arrival."""

    pace: float
    trusted_ns: float = math.inf
    done_ns: int = 0


class Backlog:
    """A lane's accepted, unanswered work: count, estimated work, and pace (measured, since
    whatever else takes the lane's cores slows it).

    Owned by a Lane. `Lane.offer` adds (the class's loop); whoever answers a job (the loop
    inline, a worker, the watchdog, the shutdown) takes it away; all under `_lock`. Readers
    on any thread see whole values. `depth`, `work_ns` and `pace` are written here alone;
    plain attributes, not properties, because every arrival reads them.
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
        self._share = share  # each worker's share of a core now (edged.serve.contention)
        # Priced ns of work the lane answers per ns while it has work (its workers' count, ideally).
        self.pace = self._ideal
        self._measured = False  # whether the pace is a sample's, or the guess (unmeasured, or stale)
        self._watched = watched  # see PACE_STALE_NS
        self._spell_ns = 0  # when the current sample began
        self._busy_since_ns = 0  # when the lane last went from idle to holding work
        self._answered_ns = 0  # priced work answered since then
        # Time spent yielding to higher classes (lanes.precedence): not the lane's own; admit() counts it apart.
        self._yielded_ns = 0
        self._yielding_since_ns = 0  # while a worker waits: since when
        self._last_ns = 0  # when the last job was answered

    def add(self, cost_ns: int) -> None:
        with self._lock:
            if not self.depth:
                now_ns = time.monotonic_ns()
                if now_ns - self._last_ns > PACE_STALE_NS:
                    self.pace, self._measured = self.starting_pace, False
                self._new_spell(now_ns)
                self._busy_since_ns = now_ns
            self.depth += 1
            self.work_ns += cost_ns

    def finish(self, cost_ns: int, ran: bool = True) -> None:
        """A job is answered; `ran`: its work was done. An unrun job (expired, refused at a stop, its
        call lost) does not count toward the pace: counted, a burst's expiries made bulk's pace 1.6 times
        its ideal."""
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
                    # A watched lane's first sample replaces the guess whole: averaged with it, a lane
                    # starved through its first window looks half the guess. Elsewhere, taken whole, one
                    # short, crowded spell made a top lane shed its next requests.
                    weight = 1.0 if self._watched and not self._measured else PACE_WEIGHT
                    sample = self._answered_ns / own_ns
                    self.pace = max((1 - weight) * self.pace + weight * sample, self._ideal * PACE_FLOOR)
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

    def outlook(self, now_ns: int, in_flight: tuple[int, int], watched: bool = True, above_ns: int = 0) -> Outlook:
        """The lane's outlook (its loop, per arrival); `in_flight`: OpenCalls.progress. A `watched`
        lane's pace is the current sample's when slower than the average, so a starved lane is
        seen while it lasts; another's is its average, fully trusted. `above_ns`: the higher
        classes' work this lane waits for. Lock-free: a sample restarting meanwhile reads too
        high, which the average bounds."""
        done_ns, in_hand_ns = in_flight
        if not self.depth or not watched:
            return Outlook(self.pace, done_ns=done_ns)
        trusted_ns = TRUST_MIN_NS + TRUST_RATIO * (now_ns - self._busy_since_ns)
        elapsed_ns, live_ns = self._own_ns(now_ns), self._answered_ns + in_hand_ns
        if elapsed_ns < LIVE_MIN_NS or (not live_ns and elapsed_ns < LIVE_MIN_NS + above_ns):
            # Too early to judge this spell: no work ahead is trusted. Nothing done in it is explained, for as long
            # as the higher classes' work takes, by waiting for that work (a niced worker on a busy box may not have
            # said yet that it yields); past that, the lane is starved.
            return Outlook(self.pace, 0, done_ns)
        live = live_ns / elapsed_ns
        # Calls credited as done are a guess until one comes back (a 3.5 ms call took 35 ms on a busy box).
        trusted_ns = trusted_ns if self._last_ns > self._busy_since_ns else 0
        return Outlook(max(min(self.pace, live), self._ideal * PACE_FLOOR), trusted_ns, done_ns)

    @property
    def average_job_ns(self) -> float:
        """The estimated work of the average job held (0 with none)."""
        return self.work_ns / max(self.depth, 1)

    @property
    def starting_pace(self) -> float:
        """The pace after an idle spell: the workers' count times each one's share of a core now."""
        return self._ideal * (self._share() if self._share else 1.0)


def admit(
    klass: ClassConfig,
    backlog: Backlog,
    cost_ns: int,
    budget_ns: int,
    above_ns: int = 0,
    outlook: Outlook | None = None,
    bound_ns: int = 0,
) -> Shed | None:
    """None to admit; a Shed when the queue is full or the deadline cannot be met. `above_ns`:
    the higher classes' work this one yields to; `outlook`: None for the average pace, fully
    trusted; `bound_ns`: what the request's own run rarely passes, where measured (a pipeline's)."""
    depth = backlog.depth
    if depth >= klass.queue_capacity:
        # A slot frees when the average job ahead finishes on one of the workers.
        per_job_ns = backlog.average_job_ns
        return Shed(
            "queue_full",
            f"class {klass.name!r} has {depth} requests waiting or running, its capacity "
            f"(classes.{klass.name}.queue_capacity = {klass.queue_capacity})",
            retry_hint_ms(per_job_ns / klass.workers),
        )
    outlook = outlook or Outlook(backlog.pace)
    lane_ns = max(backlog.work_ns - outlook.done_ns, 0) / outlook.pace
    if lane_ns > outlook.trusted_ns:
        lane_ns = outlook.trusted_ns + (lane_ns - outlook.trusted_ns) * UNPROVEN_FACTOR
    queued_ns = int(lane_ns) + above_ns
    # An estimate of a long queue errs by a share of its length: keep that share in hand.
    ahead_ns = queued_ns + queued_ns // QUEUE_SLACK_DIVISOR
    # Behind work its own run goes at the lane's pace too, or on a busy box it expires in its run. Not on an
    # idle lane: only a run re-measures the pace, and a lane slowed once would shed all until that went stale.
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
    """A retry hint in ms for a wait in ns, at least 0.1: a 0 would invite an immediate, doomed retry."""
    return max(round(ns / 1e6 + 0.05, 1), 0.1)
