"""The rules of credential_service (reference §5, §6, §9.4), independent of gRPC.

:class:`CredentialStore` stores, masks, checks, invalidates, rotates and resolves
users' model keys. Plaintext lives only in local variables here and in the
:class:`ResolvedKey` handed to the lease holder; it is never logged, never part of an
error message and never written to the database.

Providers (``MODEL_PROVIDERS``, reference §9.4): a platform-key job is resolved for the
provider its lease names (job_service chooses it when it grants the lease), with that
provider's base URL, platform key and model name; a user-key job for its key's
provider. A key is only ever handed out with its own provider's base URL, so it is
never sent to another provider.

Users' own base URLs (reference §10.5, ``USER_BASE_URLS``): a user key may be stored
with the user's own endpoint, checked by :mod:`airuntime_common.egress` before
anything is written (422 ``INVALID_BASE_URL``), and handed out with that key only,
flagged ``user_base_url`` so the worker checks it again before every call. A
platform key is never answered with a user's URL.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from airuntime_common.db import before_commit, retry_transient
from airuntime_common.egress import (
    RESOLVE_SECONDS,
    EgressRefused,
    ResolutionUnavailable,
    Resolver,
    Rule,
    check_base_url,
)
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.logs import redact_text
from airuntime_common.model_providers import ProviderConfig
from airuntime_common.timeutil import utcnow
from credential_service import metrics, repository
from credential_service.lease import LeaseInfo, LeaseVerifier
from credential_service.models import STATUS_INVALID, STATUS_VALID, ModelCredential
from credential_service.settings import CredentialSettings
from credential_service.vault import Keyring, Sealed, mask_key

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A job's model name when it names none (reference §2.2).
DEFAULT_MODEL_NAME = "deepseek-chat"
MIN_KEY_CHARS = 8
MAX_KEY_CHARS = 512
MAX_USER_ID_CHARS = 128
MAX_REASON_CHARS = 500
DEFAULT_BATCH = 100
MAX_BATCH = 1000


def _now() -> datetime:
    """Naive UTC now, as stored (record-keeping only; no lease arithmetic here)."""
    return utcnow().replace(tzinfo=None)


def new_credential_id() -> str:
    """A fresh opaque credential id (``cred_`` + 32 hex characters)."""
    return f"cred_{secrets.token_hex(16)}"


@dataclass(frozen=True)
class CredentialView:
    """The masked view of a stored key; never the plaintext.

    Attributes:
        created_at: naive UTC.
    """

    credential_id: str
    user_id: str
    provider: str
    masked_key: str
    status: str
    key_id: str
    created_at: datetime
    invalid_reason: str | None = None
    base_url: str | None = None

    @classmethod
    def of(cls, row: ModelCredential) -> CredentialView:
        """Build from a row (reads no secret column)."""
        return cls(
            credential_id=row.credential_id,
            user_id=row.user_id,
            provider=row.provider,
            masked_key=row.masked_key,
            status=row.status,
            key_id=row.key_id,
            created_at=row.created_at,
            invalid_reason=row.invalid_reason,
            base_url=row.base_url,
        )


@dataclass(frozen=True)
class CheckResult:
    """Whether a job with a key mode may be created.

    Attributes:
        usable: whether it may.
        credential_id: the user's key, for a user-key check.
        reason: why not, when not usable.
        providers: where such a job may run, in order of preference: for
            ``platform_key`` the providers with a platform key, for a user key its
            key's provider (reference §9.4).
    """

    usable: bool
    credential_id: str = ""
    reason: str = ""
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResolvedKey:
    """A key resolved for a lease holder; ``api_key`` is hidden from ``repr``.

    Attributes:
        user_base_url: ``base_url`` is the user's own (reference §10.5): the holder
            checks it again before every call.
    """

    api_key_mode: str
    credential_id: str
    model_provider: str
    model_name: str
    base_url: str
    api_key: str = field(repr=False)
    user_base_url: bool = False


@dataclass(frozen=True)
class RotationResult:
    """One rotation batch: rows moved, rows still on older keys, rows found undecryptable,
    and the older key ids still in use that are not configured (cannot be rotated)."""

    rotated: int
    remaining: int
    undecryptable: int = 0
    unknown_key_ids: tuple[str, ...] = ()
    examined: int = 0


def _validate_user_id(user_id: str) -> str:
    """The id exactly as given (never trimmed: ``" vic1"`` is not ``vic1``, as in
    job_service); empty or longer than :data:`MAX_USER_ID_CHARS` is INVALID_ARGUMENT."""
    if not user_id:
        raise invalid_argument("user_id is required", field="userId")
    if len(user_id) > MAX_USER_ID_CHARS:
        raise invalid_argument(
            f"user_id must be at most {MAX_USER_ID_CHARS} characters", field="userId"
        )
    return user_id


def _validate_api_key(api_key: str) -> str:
    """Strip and check an API key; messages never contain the key."""
    api_key = (api_key or "").strip()
    if not api_key:
        raise invalid_argument("apiKey is required", field="apiKey")
    if not (MIN_KEY_CHARS <= len(api_key) <= MAX_KEY_CHARS):
        raise invalid_argument(
            f"apiKey must be {MIN_KEY_CHARS}..{MAX_KEY_CHARS} characters", field="apiKey"
        )
    if not all(33 <= ord(c) <= 126 for c in api_key):
        raise invalid_argument("apiKey must be printable ASCII without spaces", field="apiKey")
    return api_key


class CredentialStore:
    """Domain operations of credential_service.

    Args:
        sessionmaker: one session per operation.
        keyring: the master keys (current first).
        settings: platform key, stand-in flag, base URL.
        verifier: asks job_service about leases (needed only by :meth:`resolve`).
        resolver: how a stored base URL's host is resolved (``(host, port)`` → address
            texts); None: the system resolver (tests give their own).
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        keyring: Keyring,
        settings: CredentialSettings,
        verifier: LeaseVerifier | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self._sm = sessionmaker
        self.keyring = keyring
        self._settings = settings
        self._verifier = verifier
        #: how a base URL's host is resolved when stored (None: the system resolver)
        self.resolver = resolver
        self._egress = settings.egress_policy()
        self.providers = settings.providers()
        self._platform_keys = settings.platform_keys()
        for p in self.providers:
            if p.name not in self._platform_keys:
                log.info(
                    "provider has no platform key%s",
                    " (the stand-in key is used)" if settings.ALLOW_PLATFORM_KEY_STANDIN else "",
                    extra={"fields": {"provider": p.name, "apiKeyEnv": p.apiKeyEnv}},
                )

    def platform_providers(self) -> list[str]:
        """The providers a platform-key attempt may run on (they have a platform key),
        in order of preference."""
        return [
            p.name
            for p in self.providers
            if self._settings.platform_key(p.name, self._platform_keys) is not None
        ]

    async def _write(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction on a new session, run again on a deadlock, a
        lock wait timeout, a Galera certification failure (all 1213/1205) or a
        connection lost before its COMMIT (a failover to another node, reference §9.6)."""

        async def once() -> T:
            async with self._sm() as session, session.begin():
                return await before_commit(fn, session)

        return await retry_transient(once)

    async def _read(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run the read-only ``fn`` on a new session, retried as :meth:`_write` is."""

        async def once() -> T:
            async with self._sm() as session:
                return await before_commit(fn, session)

        return await retry_transient(once)

    # --- user-facing key management -------------------------------------------------

    async def put(
        self, user_id: str, provider: str, api_key: str, base_url: str = ""
    ) -> CredentialView:
        """Store (or replace) the user's key: always a new credential id, status valid.

        Args:
            user_id: owner.
            provider: a configured provider's name (``MODEL_PROVIDERS``; case and
                surrounding blanks ignored); empty means the first configured one.
            api_key: the plaintext key, 8..512 printable ASCII characters.
            base_url: the user's own endpoint for this key (reference §10.5), or empty:
                the provider's. Stored normalized, after every rule of
                :func:`airuntime_common.egress.check_base_url` passed (its host resolved
                now, with the system resolver).

        Raises:
            AppError: ``INVALID_ARGUMENT`` for a bad user id, an unconfigured provider,
                a bad key, or a base URL while ``USER_BASE_URLS`` is off;
                ``INVALID_BASE_URL`` (``details.rule``) for a base URL that breaks a
                rule. Nothing is stored then.
        """
        user_id = _validate_user_id(user_id)
        provider = (provider or "").strip().lower() or self.providers.first.name
        if self.providers.get(provider) is None:
            raise invalid_argument(
                f"provider must be one of {', '.join(self.providers.names)}", field="provider"
            )
        api_key = _validate_api_key(api_key)
        masked = mask_key(api_key)
        url = await self._checked_base_url(base_url) if base_url else ""

        async def tx(session: AsyncSession) -> ModelCredential:
            credential_id = new_credential_id()
            sealed = self.keyring.encrypt(
                api_key, user_id=user_id, credential_id=credential_id, base_url=url
            )
            now = _now()
            row = ModelCredential(
                credential_id=credential_id,
                user_id=user_id,
                provider=provider,
                key_id=sealed.key_id,
                nonce=sealed.nonce,
                ciphertext=sealed.ciphertext,
                masked_key=masked,
                status=STATUS_VALID,
                invalid_reason=None,
                base_url=url or None,
                created_at=now,
                updated_at=now,
            )
            await repository.replace(session, row)
            return row

        for attempt in range(1, 6):
            try:
                row = await self._write(tx)
                break
            except IntegrityError:  # a concurrent put for the same user won the insert
                if attempt == 5:
                    raise AppError(
                        ErrorCode.UNAVAILABLE, "concurrent updates of this credential; try again"
                    ) from None
        log.info(
            "credential stored",
            extra={
                "fields": {
                    "userId": user_id,
                    "credentialId": row.credential_id,
                    "userBaseUrl": bool(url),
                }
            },
        )
        return CredentialView.of(row)

    async def _checked_base_url(self, base_url: str) -> str:
        """The normalized base URL, once every rule passed (reference §10.5).

        Raises:
            AppError: ``INVALID_ARGUMENT`` while ``USER_BASE_URLS`` is off,
                ``INVALID_BASE_URL`` with ``details.rule`` for a broken rule (a host that
                cannot be resolved now included).
        """
        if not self._settings.USER_BASE_URLS:
            raise invalid_argument(
                "baseUrl is not accepted: user base URLs are turned off (USER_BASE_URLS)",
                field="baseUrl",
            )
        try:
            async with asyncio.timeout(RESOLVE_SECONDS):
                target = await check_base_url(base_url, self._egress, resolver=self.resolver)
        except EgressRefused as exc:
            raise _refused(exc.rule, exc.message) from None
        except (ResolutionUnavailable, TimeoutError) as exc:
            why = str(exc) or f"the host was not resolved within {RESOLVE_SECONDS:g}s"
            raise _refused(Rule.UNRESOLVABLE, f"{why}; try again") from None
        return target.base.url

    async def get(self, user_id: str) -> CredentialView:
        """The masked view of the user's key.

        Raises:
            AppError: ``NOT_FOUND`` when the user has none.
        """
        user_id = _validate_user_id(user_id)
        row = await self._read(lambda session: repository.get_by_user(session, user_id))
        if row is None:
            raise AppError(ErrorCode.NOT_FOUND, "no model credential stored for this user")
        return CredentialView.of(row)

    async def delete(self, user_id: str) -> None:
        """Delete the user's key.

        Raises:
            AppError: ``NOT_FOUND`` when the user has none.
        """
        user_id = _validate_user_id(user_id)
        if not await self._write(lambda session: repository.delete_by_user(session, user_id)):
            raise AppError(ErrorCode.NOT_FOUND, "no model credential stored for this user")
        log.info("credential deleted", extra={"fields": {"userId": user_id}})

    async def erase(self, user_id: str) -> int:
        """Delete every credential row of the user, valid or not (reference §9.2 ``DELETE
        /v1/me``); idempotent: a user with none answers 0.

        Raises:
            AppError: ``INVALID_ARGUMENT`` for a missing or malformed user id.
        """
        user_id = _validate_user_id(user_id)
        removed = await self._write(lambda session: repository.delete_by_user(session, user_id))
        log.info("credentials erased", extra={"fields": {"removed": removed}})
        return int(removed)

    async def check(self, user_id: str, api_key_mode: str) -> CheckResult:
        """Whether a job with ``api_key_mode`` may be created for the user (reference §5, §6).

        ``platform_key``: usable iff some provider has a platform key (or the dev
        stand-in is allowed); ``providers`` names them. ``user_deepseek_key``: usable iff
        the user's key is valid, opens with the configured master keys and its provider
        is configured; ``providers`` names that provider.
        """
        if api_key_mode == "platform_key":
            usable = self.platform_providers()
            if not usable:
                names = [p.apiKeyEnv for p in self.providers if p.apiKeyEnv]
                return CheckResult(
                    False,
                    "",
                    "no platform key is configured"
                    + (f" ({', '.join(names)})" if names else " (no provider names apiKeyEnv)"),
                )
            return CheckResult(True, providers=tuple(usable))
        if api_key_mode != "user_deepseek_key":
            raise invalid_argument("apiKeyMode is not supported", field="apiKeyMode")
        user_id = _validate_user_id(user_id)
        row = await self._read(lambda session: repository.get_by_user(session, user_id))
        if row is None:
            return CheckResult(False, "", "the user has no stored model key")
        if row.status != STATUS_VALID:
            return CheckResult(False, row.credential_id, "the stored model key was marked invalid")
        if self.providers.get(row.provider) is None:
            return CheckResult(
                False,
                row.credential_id,
                f"the stored model key's provider {row.provider!r} is not configured",
            )
        if row.base_url and not self._settings.USER_BASE_URLS:
            return CheckResult(
                False,
                row.credential_id,
                "the stored model key has a base URL and user base URLs are turned off "
                "(USER_BASE_URLS): store the key again without baseUrl",
            )
        try:
            self.keyring.decrypt(
                Sealed(row.key_id, row.nonce, row.ciphertext),
                user_id=row.user_id,
                credential_id=row.credential_id,
                base_url=row.base_url or "",
            )
        except AppError:
            return CheckResult(False, row.credential_id, "the stored model key cannot be decrypted")
        return CheckResult(True, row.credential_id, "", (row.provider,))

    async def mark_invalid(self, credential_id: str, reason: str) -> None:
        """Mark a key the model rejected as invalid (idempotent; reference §6).

        Raises:
            AppError: ``NOT_FOUND`` for an unknown credential id (e.g. already replaced).
        """
        if not credential_id:  # taken exactly, as stored
            raise invalid_argument("credential_id is required", field="credentialId")
        text = redact_text((reason or "").strip())[:MAX_REASON_CHARS] or "rejected by the provider"

        if not await self._write(
            lambda session: repository.mark_invalid(session, credential_id, text, _now())
        ):
            raise AppError(ErrorCode.NOT_FOUND, "no such credential")
        log.info("credential marked invalid", extra={"fields": {"credentialId": credential_id}})

    # --- rotation ------------------------------------------------------------------------

    async def rotate_batch(self, batch_size: int = 0) -> RotationResult:
        """Re-encrypt up to ``batch_size`` rows not on the current key (resumable, reference §6).

        Each row is read, resealed with a fresh nonce under the current key and written
        back only if it still holds the ciphertext that was read, so it is safe while
        serving and while other rotations run. A row whose ciphertext fails
        authentication is flagged ``invalid``/``undecryptable`` and skipped from then on.
        Rows sealed by a key id that is not configured are left alone and counted in
        ``remaining`` (with the key id in ``unknown_key_ids``).

        Args:
            batch_size: rows per call; 0 means 100, capped at 1000.
        """
        if batch_size < 0:
            raise invalid_argument("batch_size must be >= 0", field="batchSize")
        limit = min(batch_size or DEFAULT_BATCH, MAX_BATCH)
        current = self.keyring.current_kid
        old_known = [k for k in self.keyring.key_ids if k != current]

        async def tx(session: AsyncSession) -> tuple[int, int, int]:
            rotated = undecryptable = 0
            rows = await repository.rotation_candidates(session, old_known, limit)
            now = _now()
            for row in rows:
                old = Sealed(row.key_id, bytes(row.nonce), bytes(row.ciphertext))
                try:
                    new = self.keyring.reseal(
                        old,
                        user_id=row.user_id,
                        credential_id=row.credential_id,
                        base_url=row.base_url or "",
                    )
                except AppError:
                    if await repository.mark_undecryptable(
                        session, credential_id=row.credential_id, old_nonce=old.nonce, now=now
                    ):
                        undecryptable += 1
                    continue
                if await repository.store_resealed(
                    session,
                    credential_id=row.credential_id,
                    old_key_id=old.key_id,
                    old_nonce=old.nonce,
                    key_id=new.key_id,
                    nonce=new.nonce,
                    ciphertext=new.ciphertext,
                    now=now,
                ):
                    rotated += 1
            return rotated, undecryptable, len(rows)

        async def counted(session: AsyncSession) -> tuple[int, dict[str, int]]:
            return (
                await repository.count_not_on(session, current),
                await repository.key_id_counts(session),
            )

        rotated, undecryptable, examined = await self._write(tx)
        remaining, counts = await self._read(counted)
        unknown = tuple(sorted(k for k in counts if not self.keyring.has(k)))
        metrics.ROTATED.inc(rotated)
        metrics.UNDECRYPTABLE.inc(undecryptable)
        if undecryptable:
            log.warning(
                "credentials found undecryptable during rotation",
                extra={"fields": {"count": undecryptable}},
            )
        log.info(
            "rotation batch",
            extra={
                "fields": {
                    "rotated": rotated,
                    "remaining": remaining,
                    "currentKeyId": current,
                    "unknownKeyIds": list(unknown),
                }
            },
        )
        return RotationResult(rotated, remaining, undecryptable, unknown, examined)

    # --- resolve for the lease holder --------------------------------------------------

    async def resolve(
        self,
        job_id: str,
        attempt_no: int,
        runtime_instance_id: str | None,
        request_id: str | None = None,
    ) -> ResolvedKey:
        """The key of a leased job, for its lease holder only (reference §3, §6, §9.4).

        A platform-key job gets the platform key of the provider its lease names
        (``modelProvider``; a lease naming none: the first configured provider that
        serves its model and has a platform key), a user-key job the user's current
        key, whichever key the job recorded at create (a key stored since replaces it:
        reference §9.4, case P5), with its key's provider. Either way the answer carries
        that provider's name, base URL and model name for the job's ``modelName``; a
        user key stored with its own base URL is answered with that URL instead,
        flagged ``user_base_url`` (reference §10.5; a platform key never is).

        Args:
            job_id, attempt_no: the lease; with ``runtime_instance_id`` the fencing token.
            runtime_instance_id: from ``x-runtime-instance-id``.
            request_id: propagated to job_service.

        Raises:
            AppError: ``INVALID_ARGUMENT`` (no instance id), ``LOCK_NOT_HELD`` /
                ``JOB_NOT_FOUND`` (from job_service), ``UNAVAILABLE`` (job_service
                unreachable), ``INVALID_CREDENTIAL`` with ``details.reason``:
                ``no_platform_key``, ``unknown_provider`` (the lease names a provider
                not configured), ``model_not_served`` (the provider's ``models`` lack the
                job's model), ``no_credential`` (the user has no key),
                ``credential_invalid`` (the model refused it), ``provider_not_configured``
                (the user's key is for a provider no longer configured), or the vault's
                reason for a key that cannot be decrypted; ``EGRESS_BLOCKED``
                (``user_base_urls_off``): the user's key has a base URL and
                ``USER_BASE_URLS`` is off (reference §10.5).
        """
        if not runtime_instance_id:
            raise invalid_argument(
                "x-runtime-instance-id metadata is required", field="x-runtime-instance-id"
            )
        if self._verifier is None:
            raise AppError(ErrorCode.UNAVAILABLE, "lease verification is not configured")
        mode = "unknown"
        try:
            lease = await self._verifier.verify(job_id, runtime_instance_id, attempt_no, request_id)
            mode = lease.api_key_mode
            resolved = await self._key_for(lease)
        except AppError as exc:
            metrics.RESOLVES.labels(mode, exc.code).inc()
            log.info(
                "resolve refused",
                extra={
                    "fields": {
                        "jobId": job_id,
                        "attemptNo": attempt_no,
                        "errorCode": exc.code,
                        "reason": (exc.details or {}).get("reason"),
                    }
                },
            )
            raise
        metrics.RESOLVES.labels(mode, "ok").inc()
        log.info(
            "credential resolved",
            extra={
                "fields": {
                    "jobId": job_id,
                    "attemptNo": attempt_no,
                    "apiKeyMode": mode,
                    "credentialId": resolved.credential_id or None,
                    "modelProvider": resolved.model_provider,
                    "modelName": resolved.model_name,
                }
            },
        )
        return resolved

    async def _key_for(self, lease: LeaseInfo) -> ResolvedKey:
        """The key, provider and model of a verified lease (see :meth:`resolve`)."""
        job_model = lease.model_name or DEFAULT_MODEL_NAME
        if lease.api_key_mode == "platform_key":
            provider = self._platform_provider(lease.model_provider, job_model)
            key = self._settings.platform_key(provider.name, self._platform_keys)
            if key is None:
                raise AppError(
                    ErrorCode.INVALID_CREDENTIAL,
                    f"provider {provider.name!r} has no platform key",
                    {"reason": "no_platform_key", "provider": provider.name},
                )
            return _answer(lease, "", key, provider, _served_model(provider, job_model))
        if lease.api_key_mode != "user_deepseek_key":
            raise AppError(ErrorCode.INVALID_CREDENTIAL, "unsupported api key mode")
        row = await self._read(lambda session: repository.get_by_user(session, lease.user_id))
        if row is None:
            raise AppError(
                ErrorCode.INVALID_CREDENTIAL,
                "the job's user has no stored model key",
                {"reason": "no_credential"},
            )
        # the user's current key, whichever the job recorded at create (case P5)
        if row.status == STATUS_INVALID:
            raise AppError(
                ErrorCode.INVALID_CREDENTIAL,
                "the stored model key was marked invalid",
                {"reason": "credential_invalid", "credentialId": row.credential_id},
            )
        own = self.providers.get(row.provider)
        if own is None:
            raise AppError(
                ErrorCode.INVALID_CREDENTIAL,
                f"the stored model key's provider {row.provider!r} is not configured",
                {"reason": "provider_not_configured", "credentialId": row.credential_id},
            )
        model = _served_model(own, job_model)
        if row.base_url and not self._settings.USER_BASE_URLS:
            raise AppError(
                ErrorCode.EGRESS_BLOCKED,
                "the stored model key's base URL is not used: user base URLs are turned "
                "off (USER_BASE_URLS)",
                {"reason": "user_base_urls_off", "credentialId": row.credential_id},
            )
        plaintext = self.keyring.decrypt(
            Sealed(row.key_id, bytes(row.nonce), bytes(row.ciphertext)),
            user_id=row.user_id,
            credential_id=row.credential_id,
            base_url=row.base_url or "",
        )
        answer = _answer(lease, row.credential_id, plaintext, own, model)
        if row.base_url:  # the user's own endpoint, for this user's key only
            return replace(answer, base_url=row.base_url, user_base_url=True)
        return answer

    def _platform_provider(self, named: str, job_model: str) -> ProviderConfig:
        """The provider of a platform-key lease: the one it names, or (naming none)
        the first that serves ``job_model`` with a platform key."""
        if named:
            chosen = self.providers.get(named)
            if chosen is None:
                raise AppError(
                    ErrorCode.INVALID_CREDENTIAL,
                    f"the job's provider {named[:64]!r} is not configured (MODEL_PROVIDERS)",
                    {"reason": "unknown_provider", "provider": named[:64]},
                )
            return chosen
        for provider in self.providers.serving(job_model):
            if self._settings.platform_key(provider.name, self._platform_keys) is not None:
                return provider
        raise AppError(
            ErrorCode.INVALID_CREDENTIAL,
            f"no provider serving {job_model!r} has a platform key",
            {"reason": "no_platform_key"},
        )


def _refused(rule: str, message: str) -> AppError:
    """422 ``INVALID_BASE_URL`` naming the rule (reference §10.5, §10.6)."""
    return AppError(
        ErrorCode.INVALID_BASE_URL,
        f"baseUrl refused ({rule}): {message}",
        {"field": "baseUrl", "rule": str(rule)},
    )


def _served_model(provider: ProviderConfig, job_model: str) -> str:
    """The provider's name for the job's model.

    Raises:
        AppError: ``INVALID_CREDENTIAL`` (``model_not_served``) when its ``models``
            do not list it.
    """
    model = provider.model_for(job_model)
    if model is None:
        raise AppError(
            ErrorCode.INVALID_CREDENTIAL,
            f"provider {provider.name!r} serves no model for {job_model!r} (MODEL_PROVIDERS)",
            {"reason": "model_not_served", "provider": provider.name, "modelName": job_model},
        )
    return model


def _answer(
    lease: LeaseInfo, credential_id: str, api_key: str, provider: ProviderConfig, model: str
) -> ResolvedKey:
    return ResolvedKey(
        api_key_mode=lease.api_key_mode,
        credential_id=credential_id,
        model_provider=provider.name,
        model_name=model,
        base_url=provider.baseUrl,
        api_key=api_key,
    )
