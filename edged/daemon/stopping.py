"""The lanes' part of a stop (the steering thread, once the drain is over or cut short):
every request they hold is answered, one way or another, before the loops close."""

from __future__ import annotations

import logging
import time

from edged.serve.lanes.lane import Lane
from edged.serve.lanes.worker import SHUTTING_DOWN

log = logging.getLogger("edged")


def stop_lanes(lanes: list[Lane], end: float) -> int:
    """Answer the queued UNAVAILABLE, let the calls under way return until `end` (a
    time.monotonic), answer INTERNAL those that did not; how many were answered UNAVAILABLE."""
    unanswered = sum(lane.crew.reject_queued(SHUTTING_DOWN) for lane in lanes)
    # A call already inside the backend cannot be cut short: wait for its reply,
    # so that nothing admitted goes unanswered (systemd's TimeoutStopSec is the backstop).
    for lane in lanes:
        lane.crew.stop(timeout_s=max(end - time.monotonic(), 0.0))
    for lane in lanes:
        lane.crew.close_calls()
    message = "the daemon stopped before this backend call returned"
    cut_short = sum(lane.crew.answer_open_calls(message) for lane in lanes)
    unanswered += sum(lane.crew.reject_queued(SHUTTING_DOWN) for lane in lanes)
    if cut_short:
        log.error("%d requests were still inside the backend at exit: answered INTERNAL", cut_short)
    return unanswered
