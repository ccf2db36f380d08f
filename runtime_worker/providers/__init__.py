"""Model providers behind one interface (reference §5)."""

from runtime_worker.providers.base import (
    ModelError,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Usage,
)

__all__ = ["ModelError", "ModelProvider", "ModelRequest", "ModelResponse", "Usage"]
