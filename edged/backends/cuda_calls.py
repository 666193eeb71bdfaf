"""Every CUDA call edged makes goes through here: cuda-python's runtime and driver
modules, imported only when first asked for (the CPU daemon never needs them), and the
check that turns a failed call into a CudaError naming the call and CUDA's own error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

INSTALL_HINT = "install with pip install -e '.[gpu]'"


class CudaError(RuntimeError):
    """A CUDA call that failed; the message names the call and CUDA's error."""


def runtime() -> Any:
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise CudaError(f"cuda-python (cuda.bindings) is not installed: {INSTALL_HINT}") from None
    return runtime


def check(call: str, result: tuple[Any, ...]) -> Any:
    """Unpack a cuda-python runtime result tuple (status, *values), raising on a failed status."""
    rt = runtime()
    return _unpack(
        call, result, rt.cudaError_t.cudaSuccess, lambda s: (rt.cudaGetErrorName(s), rt.cudaGetErrorString(s))
    )


def driver_api() -> Any:
    """cuda-python's driver API (`cuda.bindings.driver`), for what the runtime API lacks
    (green contexts, stream memory operations); it runs in the runtime's primary context."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CudaError(f"cuda-python (cuda.bindings) is not installed: {INSTALL_HINT}") from None
    return driver


def check_driver(call: str, result: tuple[Any, ...]) -> Any:
    """Unpack a driver API result tuple (status, *values) as `check` does a runtime one."""
    driver = driver_api()
    return _unpack(
        call, result, driver.CUresult.CUDA_SUCCESS, lambda s: (driver.cuGetErrorName(s), driver.cuGetErrorString(s))
    )


def _unpack(call: str, result: tuple[Any, ...], success: Any, explain: Callable[[Any], tuple[Any, Any]]) -> Any:
    """The values of a (status, *values) result, or CudaError naming the call and CUDA's
    error; `explain(status)` gives the error's name and text results, asked only on failure."""
    status, *values = result
    if status != success:
        (_, name), (_, text) = explain(status)
        raise CudaError(f"{call} failed: {_text(name, status)}: {_text(text, status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _text(value: Any, status: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or status)
