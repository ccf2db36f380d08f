"""runtime_worker: claims AI jobs, calls the model, reports results (reference §1, §3, §5)."""

__version__ = "0.1.0"
