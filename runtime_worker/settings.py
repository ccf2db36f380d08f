"""Worker settings from the environment (reference §7).

Names are exactly the contract's. :meth:`WorkerSettings.check` is called at start
and refuses a configuration that cannot keep its leases (case L2).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping

from pydantic import Field, SecretStr

from airuntime_common import jobtypes
from airuntime_common.egress import EgressSettings
from airuntime_common.model_providers import (
    DEFAULT_API_KEY_ENV,
    ModelProvidersSettings,
    platform_keys_from,
)
from airuntime_common.settings import DAY, CommonSettings, ListenAddress, MissingSetting
from runtime_worker.providers.body import DEFAULT_MAX_RESPONSE_BYTES


def default_instance_id() -> str:
    """``<hostname>-<pid>-<random hex>``: unique per process, stable for its life."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class InvalidSettings(MissingSetting):
    """A setting has a value the worker refuses to start with (exits with the message)."""


class WorkerSettings(EgressSettings, ModelProvidersSettings, CommonSettings):
    """Every variable the worker reads (``USER_BASE_URLS``, ``USER_BASE_URL_PORTS`` and
    ``EGRESS_ALLOW_CIDRS`` are :class:`~airuntime_common.egress.EgressSettings`'s, as
    credential_service's).

    Attributes:
        POLL_INTERVAL_MS: sleep between claims when nothing was found (ms).
        WORKER_CONCURRENCY: jobs executed at once.
        HEARTBEAT_INTERVAL_SECONDS: period of the batched lease heartbeat (s); at most
            ``LOCK_LEASE_SECONDS / 3`` (reference §7).
        LOCK_LEASE_SECONDS: the lease job_service grants (s); only used for the check above.
        RUNTIME_WORKER_LISTEN: listen address of the status gRPC server (port 0 = any).
        RUNTIME_WORKER_ADVERTISE_ADDR: address reported to job_service as ``status_address``;
            derived from the hostname and the bound port when empty.
        RUNTIME_INSTANCE_ID: this process's id (``x-runtime-instance-id``).
        DEEPSEEK_API_KEY: the default provider's platform key. A provider whose platform
            key is in this worker's environment (its ``apiKeyEnv``, as the seed's
            deployment gives the runtime ``DEEPSEEK_API_KEY``) runs its platform-key
            attempts on that key without a ResolveCredential round trip (the claim
            names the provider; the lease is the worker's own claim); without it, the
            attempt resolves its key. User keys always resolve.
        WORKER_CAPABILITIES: comma list of job types this worker takes; unset: every
            registered job type (:mod:`airuntime_common.jobtypes`).
        LONG_POLL_WAIT_MS: ``wait_ms`` of ClaimJobs (0..20000, ms).
        SHUTDOWN_GRACE_SECONDS: time in-flight jobs get to finish on SIGTERM/Drain (s).
        MODEL_CALL_MAX_SECONDS: overall cap of one model call incl. body read (s).
        MODEL_MAX_RESPONSE_BYTES: most bytes of one model answer's body (bytes, decoded;
            default 8 MiB, 1 KiB..1 GiB): a longer answer is ``TEMPORARY_PROVIDER_ERROR``
            and is not read further (reference §9.4), so a worker holds at most
            ``WORKER_CONCURRENCY`` × this in answer bodies.
        RPC_TIMEOUT_SECONDS: deadline of one internal gRPC call (s).
        RPC_RETRY_SECONDS: how long idempotent internal calls retry on UNAVAILABLE (s).
        WORKER_METRICS_PORT: Prometheus port, 0 = off.
    """

    POLL_INTERVAL_MS: int = Field(default=1000, ge=1, le=DAY * 1000)
    WORKER_CONCURRENCY: int = Field(default=8, ge=1, le=500)
    HEARTBEAT_INTERVAL_SECONDS: float = Field(default=20.0, gt=0, le=DAY)
    LOCK_LEASE_SECONDS: float = Field(default=60.0, gt=0, le=DAY)
    RUNTIME_WORKER_LISTEN: ListenAddress = "[::]:50053"
    RUNTIME_WORKER_ADVERTISE_ADDR: str = ""
    RUNTIME_INSTANCE_ID: str = Field(default_factory=default_instance_id)
    DEEPSEEK_API_KEY: SecretStr | None = None
    WORKER_CAPABILITIES: str | None = None
    LONG_POLL_WAIT_MS: int = Field(default=10000, ge=0, le=20000)
    SHUTDOWN_GRACE_SECONDS: float = Field(default=20.0, ge=0, le=DAY)
    MODEL_CALL_MAX_SECONDS: float = Field(default=110.0, gt=0, le=DAY)
    MODEL_MAX_RESPONSE_BYTES: int = Field(
        default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024, le=1024 * 1024 * 1024
    )
    RPC_TIMEOUT_SECONDS: float = Field(default=10.0, gt=0, le=DAY)
    RPC_RETRY_SECONDS: float = Field(default=30.0, ge=0, le=DAY)
    WORKER_METRICS_PORT: int = Field(default=9103, ge=0, le=65535)

    def platform_keys(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The platform keys this worker holds, by provider name: each provider whose
        ``apiKeyEnv`` is set in its environment (``DEEPSEEK_API_KEY`` is this settings'
        value). A provider whose key only credential_service holds (or its stand-in key,
        ``ALLOW_PLATFORM_KEY_STANDIN``) is resolved per attempt."""
        source = dict(os.environ if env is None else env)
        source.pop(DEFAULT_API_KEY_ENV, None)
        if self.DEEPSEEK_API_KEY is not None:
            source[DEFAULT_API_KEY_ENV] = self.DEEPSEEK_API_KEY.get_secret_value()
        return platform_keys_from(self.providers(), source)

    @property
    def capabilities(self) -> list[str]:
        """``WORKER_CAPABILITIES`` as a list of job types (order kept, duplicates dropped)."""
        if self.WORKER_CAPABILITIES is None:
            return list(jobtypes.names())
        out: list[str] = []
        for part in self.WORKER_CAPABILITIES.split(","):
            name = part.strip()
            if name and name not in out:
                out.append(name)
        return out

    def check(self) -> None:
        """Refuse to start on an unsafe or meaningless configuration (reference §7, case L2).

        Raises:
            MissingSetting: ``RUNTIME_SERVICE_TOKEN`` is empty.
            InvalidSettings: heartbeat interval above a third of the lease, unknown or
                empty capabilities.
        """
        if not self.RUNTIME_SERVICE_TOKEN:
            raise MissingSetting(
                "refusing to start: RUNTIME_SERVICE_TOKEN is required (reference §7)"
            )
        if self.HEARTBEAT_INTERVAL_SECONDS * 3 > self.LOCK_LEASE_SECONDS + 1e-9:
            raise InvalidSettings(
                "refusing to start: HEARTBEAT_INTERVAL_SECONDS="
                f"{self.HEARTBEAT_INTERVAL_SECONDS:g} is above a third of "
                f"LOCK_LEASE_SECONDS={self.LOCK_LEASE_SECONDS:g} (reference §7)"
            )
        caps = self.capabilities
        unknown = [c for c in caps if jobtypes.find(c) is None]
        if not caps or unknown:
            raise InvalidSettings(
                f"refusing to start: WORKER_CAPABILITIES has unknown job types {unknown} "
                f"or none; allowed: {', '.join(jobtypes.names())}"
            )
