"""A job whose input is in a client's device memory (a CUDA IPC region) runs alone:
batching would stack its input with others' on the host, which a DeviceTensor is not on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from support.gpu import MLP

from edged.serve.lanes.batching import Job


def test_a_job_with_a_device_input_never_shares_a_call() -> None:
    job = Job(None, 1, MLP, {"x": np.zeros((1, 64), np.float32)}, ("scores",), 0, 0, 0)
    assert job.fits_with(replace(job, request_id=2))
    assert not replace(job, device=True).fits_with(job)
    assert not job.fits_with(replace(job, device=True))
