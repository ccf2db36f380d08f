"""The public HTTP edge of AI Runtime (reference §3, §3.1): REST for users and admins and the
``/internal/runtime/*`` shim; every call goes to job_service / credential_service over gRPC."""
