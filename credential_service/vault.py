"""The AES-256-GCM keyring that seals users' model keys at rest (reference §6).

* A fresh 96-bit random nonce for every encryption.
* Associated data binds a ciphertext to its user id, credential id and key id, so a
  ciphertext copied to another row (or relabelled with another key id) fails to open;
  and to the user's own base URL when the row has one (reference §10.5), so a URL
  changed in the database makes the key unusable rather than sending it elsewhere.
* The key id is stored on every row; the first configured key is the current one and
  every configured key can still decrypt, which is what makes rotation possible.
* Every failure to open — tampering, wrong associated data, an unknown key id, a
  malformed nonce — is ``AppError(INVALID_CREDENTIAL)``, never a crash, and no message
  ever contains key material or plaintext.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from airuntime_common.errors import AppError, ErrorCode

NONCE_BYTES = 12
KEY_BYTES = 32
ENV_NAME = "CREDENTIAL_ENCRYPTION_KEYS"
_KID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_AD_DOMAIN = "zhixi.airuntime.credential.v1/ai_model_credentials"


class KeyringError(ValueError):
    """``CREDENTIAL_ENCRYPTION_KEYS`` is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class Sealed:
    """One encrypted value as stored: the key id, the 12-byte nonce and ciphertext+tag."""

    key_id: str
    nonce: bytes
    ciphertext: bytes


def parse_keys(raw: str) -> list[tuple[str, bytes]]:
    """Parse ``kid:base64key[,kid:base64key…]`` (first is current).

    Args:
        raw: the variable's value; standard or URL-safe base64, each key 32 bytes.

    Returns:
        ``[(kid, key_bytes), …]`` in configured order.

    Raises:
        KeyringError: empty value, an entry without ``kid:``, a bad kid, bad base64,
            a key that is not 32 bytes, or a repeated kid. Messages name the variable and
            the entry's position (and kid), never key material.
    """
    if not raw or not raw.strip():
        raise KeyringError(f"{ENV_NAME} is required (kid:base64key[,kid:base64key...])")
    out: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for position, entry in enumerate(raw.split(","), start=1):
        entry = entry.strip()
        kid, sep, encoded = entry.partition(":")
        kid = kid.strip()
        if not sep or not kid:
            raise KeyringError(f"{ENV_NAME}: entry #{position} is not of the form kid:base64key")
        if not _KID_RE.match(kid):
            raise KeyringError(
                f"{ENV_NAME}: entry #{position} has an invalid key id "
                "(1-64 characters of A-Z a-z 0-9 _ . -)"
            )
        if kid in seen:
            raise KeyringError(f"{ENV_NAME}: key id {kid!r} appears more than once")
        key = _decode_key(encoded.strip())
        if key is None:
            raise KeyringError(f"{ENV_NAME}: key {kid!r} (entry #{position}) is not valid base64")
        if len(key) != KEY_BYTES:
            raise KeyringError(
                f"{ENV_NAME}: key {kid!r} (entry #{position}) must decode to {KEY_BYTES} bytes"
            )
        seen.add(kid)
        out.append((kid, key))
    return out


def _decode_key(encoded: str) -> bytes | None:
    """Standard or URL-safe base64 (padding optional) → bytes, or None when malformed."""
    if not encoded:
        return None
    normalized = encoded.replace("-", "+").replace("_", "/")
    normalized += "=" * (-len(normalized) % 4)
    try:
        return base64.b64decode(normalized.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None


def associated_data(user_id: str, credential_id: str, key_id: str, base_url: str = "") -> bytes:
    """The associated data binding a ciphertext to its row (unambiguous JSON array, UTF-8).

    ``base_url`` (the row's own endpoint, reference §10.5) is appended only when there
    is one, so rows without one keep the associated data they were sealed with.
    """
    parts = [_AD_DOMAIN, user_id, credential_id, key_id]
    if base_url:
        parts.append(base_url)
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _undecryptable(credential_id: str, reason: str) -> AppError:
    return AppError(
        ErrorCode.INVALID_CREDENTIAL,
        "the stored credential cannot be decrypted",
        {"credentialId": credential_id, "reason": reason},
    )


class Keyring:
    """Master keys by key id; the first one encrypts, all of them decrypt.

    Args:
        keys: ``[(kid, 32-byte key), …]``, current first (see :func:`parse_keys`).
    """

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyringError(f"{ENV_NAME} is required")
        self._ciphers = {kid: AESGCM(key) for kid, key in keys}
        self.current_kid = keys[0][0]

    @classmethod
    def from_env_value(cls, raw: str) -> Keyring:
        """Build from the raw ``CREDENTIAL_ENCRYPTION_KEYS`` value.

        Raises:
            KeyringError: see :func:`parse_keys`.
        """
        return cls(parse_keys(raw))

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every configured key id, current first."""
        return tuple(self._ciphers)

    def has(self, key_id: str) -> bool:
        """Whether ``key_id`` is configured (so its rows can be decrypted)."""
        return key_id in self._ciphers

    def __repr__(self) -> str:  # never show key material
        return f"Keyring(current={self.current_kid!r}, key_ids={list(self._ciphers)!r})"

    def encrypt(
        self, plaintext: str, *, user_id: str, credential_id: str, base_url: str = ""
    ) -> Sealed:
        """Seal ``plaintext`` under the current key with a fresh random 96-bit nonce.

        Args:
            plaintext: the user's API key.
            user_id, credential_id: the row the ciphertext belongs to (bound as AD).
            base_url: the row's own endpoint, if any (bound as AD too).

        Returns:
            The :class:`Sealed` triple to store.
        """
        kid = self.current_kid
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = self._ciphers[kid].encrypt(
            nonce,
            plaintext.encode("utf-8"),
            associated_data(user_id, credential_id, kid, base_url),
        )
        return Sealed(kid, nonce, ciphertext)

    def decrypt(
        self, sealed: Sealed, *, user_id: str, credential_id: str, base_url: str = ""
    ) -> str:
        """Open a stored ciphertext for the row ``(user_id, credential_id, base_url)``.

        Raises:
            AppError: ``INVALID_CREDENTIAL`` with ``details.reason`` one of
                ``unknown_key_id``, ``malformed``, ``authentication_failed``.
        """
        cipher = self._ciphers.get(sealed.key_id)
        if cipher is None:
            raise _undecryptable(credential_id, "unknown_key_id")
        if len(sealed.nonce) != NONCE_BYTES or len(sealed.ciphertext) < 16:
            raise _undecryptable(credential_id, "malformed")
        try:
            raw = cipher.decrypt(
                bytes(sealed.nonce),
                bytes(sealed.ciphertext),
                associated_data(user_id, credential_id, sealed.key_id, base_url),
            )
            return raw.decode("utf-8")
        except (InvalidTag, ValueError):
            raise _undecryptable(credential_id, "authentication_failed") from None

    def reseal(
        self, sealed: Sealed, *, user_id: str, credential_id: str, base_url: str = ""
    ) -> Sealed:
        """Decrypt with the row's key and encrypt again under the current key (rotation).

        Raises:
            AppError: ``INVALID_CREDENTIAL`` when the row cannot be opened.
        """
        row = {"user_id": user_id, "credential_id": credential_id, "base_url": base_url}
        return self.encrypt(self.decrypt(sealed, **row), **row)


def mask_key(api_key: str) -> str:
    """The masked view stored at write time: first 3 characters, ``****``, last 4.

    Keys shorter than 12 characters show only their first 3 characters, so a mask
    never reveals most of a short key. E.g. ``sk-0123456789abcd`` → ``sk-****abcd``.
    """
    if len(api_key) >= 12:
        return f"{api_key[:3]}****{api_key[-4:]}"
    return f"{api_key[:3]}****"
