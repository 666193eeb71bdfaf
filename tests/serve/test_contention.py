"""edged.serve.contention: the box's other load, sampled by its one owner, and the
share of a core it leaves a thread at each niceness."""

from __future__ import annotations

import pytest
from support import raised_on_thread

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
    error = raised_on_thread(contention.sample, RuntimeError, "a-loop")
    assert error is not None and "'a-loop'" in str(error)
    contention.sample()  # its owner may
