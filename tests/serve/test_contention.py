"""edged.serve.contention: the box's other load, sampled by its one owner, and the
share of a core it leaves a thread at each niceness."""

from __future__ import annotations

import threading

import pytest

from edged.serve.contention import Contention


def test_a_thread_gets_its_weights_part_of_a_busy_core() -> None:
    contention = Contention()
    assert contention.share(0) == 1.0 and contention.share(10) == 1.0  # nothing else runs
    contention.others = 1.0
    assert contention.share(0) == pytest.approx(0.5)
    assert contention.share(10) == pytest.approx(0.097, abs=0.002)  # the kernel: 110 against 1024
    contention.others = 0.5
    assert contention.share(10) == pytest.approx(0.5 + 0.5 * 0.097, abs=0.002)


def test_only_the_thread_that_made_it_samples_it() -> None:
    contention = Contention()
    errors: list[BaseException] = []

    def sample() -> None:
        try:
            contention.sample()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=sample, name="a-loop")
    thread.start()
    thread.join()
    assert len(errors) == 1 and "'a-loop'" in str(errors[0])
    contention.sample()  # its owner may
