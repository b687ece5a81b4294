"""One BLAS thread for small matrix work, with a cached threadpool controller.

Simulated devices do many small BLAS calls in a row; threading each of them
only adds contention (measured 5x slower on 2 cores). ``threadpool_limits``
rescans the loaded libraries on every call (~7 ms), which is a large share of
a many-round run over small devices, so the controller is built once.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from threadpoolctl import ThreadpoolController

__all__ = ["one_blas_thread", "controller"]

_CONTROLLER: ThreadpoolController | None = None


def controller() -> ThreadpoolController:
    """The process's threadpool controller (built on first use)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER


def one_blas_thread() -> AbstractContextManager:
    """Context manager: BLAS libraries limited to one thread inside."""
    return controller().limit(limits=1, user_api="blas")
