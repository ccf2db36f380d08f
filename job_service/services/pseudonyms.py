"""The one-way pseudonym an erased user's kept rows go under (reference §9.2 ``DELETE /v1/me``).

A keyed HMAC, not a plain hash: with a hash anyone could hash candidate user ids
and find whose rows they are; without the key, a pseudonym names nobody. The same
user id always gets the same pseudonym (so the daily quota still counts an erased
user's jobs of the day when the id comes back), and a pseudonym cannot be turned
back into the id.
"""

from __future__ import annotations

import hashlib
import hmac

from job_service.settings import JobServiceSettings
from job_service.store.statements import PSEUDONYM_PREFIX


def pseudonym_key(settings: JobServiceSettings) -> bytes:
    """The HMAC key of :func:`pseudonym`: ``ERASURE_PSEUDONYM_KEY``, else one derived
    from ``RUNTIME_SERVICE_TOKEN`` (never a constant)."""
    if settings.ERASURE_PSEUDONYM_KEY:
        return settings.ERASURE_PSEUDONYM_KEY.encode()
    return hmac.new(
        settings.RUNTIME_SERVICE_TOKEN.encode(), b"airuntime erasure pseudonym", hashlib.sha256
    ).digest()


def pseudonym(key: bytes, user_id: str) -> str:
    """The pseudonym of ``user_id``: ``erased-`` + 56 hex digits of
    HMAC-SHA256(key, user id) (63 characters, fits an id column)."""
    digest = hmac.new(key, user_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return PSEUDONYM_PREFIX + digest[:56]
