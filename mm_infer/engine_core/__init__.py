"""The engine core in its own process: the server prepares and streams, the core schedules, runs and samples."""

from mm_infer.engine_core.backend import CoreProcessBackend
from mm_infer.engine_core.core_client import CoreStartupError

__all__ = ["CoreProcessBackend", "CoreStartupError"]
