"""SM partitioning per class: a lane's kernels confined to a green context (CUDA 12.4+).

A class with `sm_count` gets its compute stream from a green context that holds that
many of the GPU's SMs (CUDA rounds up to its partition granularity: multiples of 8 on
Hopper), made through cuda.bindings.driver. The GPU runners use it exactly as they use
a plain priority stream: ONNX Runtime's CUDA provider takes it as
`user_compute_stream`, TensorRT enqueues on it. Bulk confined to, say, 100 of 132 SMs
leaves realtime SMs that bulk's kernels can never occupy.

Not run on a GPU. What the docs and sources say, and what is open:
- ONNX Runtime accepts any CUstream as its compute stream (`user_compute_stream`, an
  address; since 1.17 from Python), and launches its kernels and its cuBLAS/cuDNN
  work there.
- A green context's stream is an ordinary CUstream to the runtime API: kernels
  launched on it run on the context's SMs. PyTorch code runs on such streams this way
  (FlashInfer's green_ctx utilities hand them to torch as external streams).
- Open: whether memory that ONNX Runtime allocates in the primary context, and the
  cuBLAS/cuDNN handles it binds to the stream, work unchanged with a green context's
  stream; whether stream priorities still rank kernels inside a green context.
  bench/gpu_verify.sh is where a lent GPU answers these.
"""

from __future__ import annotations

from typing import Any

from edged.backends.cuda import CudaError, Stream
from edged.backends.cuda_calls import check_driver, driver_api


def _driver() -> Any:
    driver = driver_api()
    if not hasattr(driver, "cuGreenCtxCreate"):
        raise CudaError("classes.*.sm_count needs green contexts (CUDA 12.4 or newer in cuda-python and the driver)")
    return driver


def green_stream(sm_count: int, priority: int, device: int = 0) -> Stream:
    """A non-blocking stream, at `priority`, of a new green context holding at least
    `sm_count` SMs; closing the stream destroys the context."""
    driver = _driver()
    dev = check_driver("cuDeviceGet", driver.cuDeviceGet(device))
    sm_type = driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    every_sm = check_driver("cuDeviceGetDevResource", driver.cuDeviceGetDevResource(dev, sm_type))
    if sm_count > every_sm.sm.smCount:
        raise CudaError(f"sm_count {sm_count} is more than the {every_sm.sm.smCount} SMs of device {device}")
    groups, created, _rest = check_driver(
        "cuDevSmResourceSplitByCount", driver.cuDevSmResourceSplitByCount(1, every_sm, 0, sm_count)
    )
    if not created:
        raise CudaError(f"device {device} cannot give a partition of {sm_count} SMs")
    desc = check_driver("cuDevResourceGenerateDesc", driver.cuDevResourceGenerateDesc([groups[0]], 1))
    flags = driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
    context = check_driver("cuGreenCtxCreate", driver.cuGreenCtxCreate(desc, dev, flags))
    try:
        non_blocking = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
        handle = check_driver("cuGreenCtxStreamCreate", driver.cuGreenCtxStreamCreate(context, non_blocking, priority))
    except BaseException:
        driver.cuGreenCtxDestroy(context)
        raise

    def destroy() -> None:
        check_driver("cuGreenCtxDestroy", driver.cuGreenCtxDestroy(context))

    return Stream.adopt(handle, priority, destroy)
