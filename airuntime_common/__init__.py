"""Shared building blocks of the AI Runtime services.

Settings base, error codes (reference §4), enum mapping between the contract's strings
and the protobuf enums, gRPC server bootstrap and interceptors, database
engine helpers, canonical JSON, time helpers, structured logging and
OpenTelemetry tracing (:mod:`airuntime_common.tracing`).
A service imports this package and the generated stubs in ``zhixi``, never
another service's internals.
"""

__version__ = "0.1.0"
