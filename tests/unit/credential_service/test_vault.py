"""The AES-256-GCM keyring: round trip, nonces, associated data, failures (reference §6)."""

from __future__ import annotations

import base64
import os
from dataclasses import replace

import pytest

from airuntime_common.errors import AppError, ErrorCode
from credential_service.vault import (
    Keyring,
    KeyringError,
    Sealed,
    associated_data,
    mask_key,
    parse_keys,
)

from .conftest import make_key

SECRET = "sk-0123456789abcdef0123456789abcdef"


def keyring(*kids: str) -> Keyring:
    return Keyring.from_env_value(",".join(make_key(k) for k in kids))


def test_round_trip_and_key_id() -> None:
    ring = keyring("k1")
    sealed = ring.encrypt(SECRET, user_id="u1", credential_id="c1")
    assert sealed.key_id == "k1"
    assert len(sealed.nonce) == 12
    assert SECRET.encode() not in sealed.ciphertext
    assert ring.decrypt(sealed, user_id="u1", credential_id="c1") == SECRET


def test_fresh_nonce_every_encryption() -> None:
    ring = keyring("k1")
    seals = [ring.encrypt(SECRET, user_id="u1", credential_id="c1") for _ in range(200)]
    assert len({s.nonce for s in seals}) == 200
    assert len({s.ciphertext for s in seals}) == 200


def _code(exc: pytest.ExceptionInfo[AppError]) -> tuple[str, str]:
    assert exc.value.code == ErrorCode.INVALID_CREDENTIAL
    assert SECRET not in str(exc.value) and SECRET not in repr(exc.value.details)
    return exc.value.code, (exc.value.details or {})["reason"]


@pytest.mark.parametrize("position", [0, 5, -1])
def test_tampered_ciphertext_is_invalid_credential(position: int) -> None:
    ring = keyring("k1")
    sealed = ring.encrypt(SECRET, user_id="u1", credential_id="c1")
    data = bytearray(sealed.ciphertext)
    data[position] ^= 0x01
    with pytest.raises(AppError) as exc:
        ring.decrypt(replace(sealed, ciphertext=bytes(data)), user_id="u1", credential_id="c1")
    assert _code(exc)[1] == "authentication_failed"


def test_tampered_nonce_is_invalid_credential() -> None:
    ring = keyring("k1")
    sealed = ring.encrypt(SECRET, user_id="u1", credential_id="c1")
    with pytest.raises(AppError) as exc:
        ring.decrypt(replace(sealed, nonce=os.urandom(12)), user_id="u1", credential_id="c1")
    _code(exc)
    with pytest.raises(AppError) as exc:
        ring.decrypt(replace(sealed, nonce=b"short"), user_id="u1", credential_id="c1")
    assert _code(exc)[1] == "malformed"


@pytest.mark.parametrize(
    ("user_id", "credential_id"), [("u2", "c1"), ("u1", "c2"), ("u1c", "1"), ("", "")]
)
def test_associated_data_binds_user_and_credential(user_id: str, credential_id: str) -> None:
    ring = keyring("k1")
    sealed = ring.encrypt(SECRET, user_id="u1", credential_id="c1")
    with pytest.raises(AppError) as exc:
        ring.decrypt(sealed, user_id=user_id, credential_id=credential_id)
    assert _code(exc)[1] == "authentication_failed"


def test_associated_data_binds_key_id() -> None:
    """Relabelling a row with another configured key id does not open it."""
    ring = keyring("k1", "k2")
    sealed = ring.encrypt(SECRET, user_id="u1", credential_id="c1")
    with pytest.raises(AppError) as exc:
        ring.decrypt(replace(sealed, key_id="k2"), user_id="u1", credential_id="c1")
    _code(exc)


def test_associated_data_is_unambiguous() -> None:
    assert associated_data("a|b", "c", "k") != associated_data("a", "b|c", "k")
    assert associated_data('a","b', "c", "k") != associated_data("a", 'b","c', "k")


def test_unknown_key_id_is_invalid_credential() -> None:
    sealed = keyring("old").encrypt(SECRET, user_id="u1", credential_id="c1")
    with pytest.raises(AppError) as exc:
        keyring("new").decrypt(sealed, user_id="u1", credential_id="c1")
    assert _code(exc)[1] == "unknown_key_id"


def test_same_kid_other_key_is_invalid_credential() -> None:
    sealed = keyring("k1").encrypt(SECRET, user_id="u1", credential_id="c1")
    with pytest.raises(AppError) as exc:
        keyring("k1").decrypt(sealed, user_id="u1", credential_id="c1")
    assert _code(exc)[1] == "authentication_failed"


def test_reseal_moves_to_current_key() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    sealed = Keyring([("k1", k1)]).encrypt(SECRET, user_id="u1", credential_id="c1")
    both = Keyring([("k2", k2), ("k1", k1)])
    moved = both.reseal(sealed, user_id="u1", credential_id="c1")
    assert moved.key_id == "k2" and moved.nonce != sealed.nonce
    assert both.decrypt(moved, user_id="u1", credential_id="c1") == SECRET
    assert Keyring([("k2", k2)]).decrypt(moved, user_id="u1", credential_id="c1") == SECRET


def test_parse_keys_accepts_standard_and_urlsafe_base64() -> None:
    raw = os.urandom(32)
    std = base64.b64encode(raw).decode()
    url = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    keys = parse_keys(f"a:{std}, b:{url}")
    assert keys == [("a", raw), ("b", raw)]
    assert Keyring(keys).current_kid == "a"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("", "is required"),
        ("   ", "is required"),
        ("nokid", "entry #1 is not of the form"),
        (":" + base64.b64encode(b"x" * 32).decode(), "entry #1 is not of the form"),
        ("k1:" + base64.b64encode(b"x" * 16).decode(), "must decode to 32 bytes"),
        ("k1:not*base64!", "is not valid base64"),
        ("k1:", "is not valid base64"),
        ("bad kid:" + base64.b64encode(b"x" * 32).decode(), "invalid key id"),
    ],
)
def test_parse_keys_refuses_malformed_values(value: str, needle: str) -> None:
    with pytest.raises(KeyringError) as exc:
        parse_keys(value)
    message = str(exc.value)
    assert "CREDENTIAL_ENCRYPTION_KEYS" in message
    assert needle in message
    # no key material in the message
    _, _, encoded = value.partition(":")
    if len(encoded) > 4:
        assert encoded not in message


def test_parse_keys_refuses_duplicate_kid() -> None:
    with pytest.raises(KeyringError, match="more than once"):
        parse_keys(f"{make_key('k1')},{make_key('k1')}")


def test_malformed_entry_without_colon_never_echoed() -> None:
    secretish = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(KeyringError) as exc:
        parse_keys(f"{make_key('k1')},{secretish}")
    assert secretish not in str(exc.value)
    assert "entry #2" in str(exc.value)


def test_keyring_repr_has_no_key_material() -> None:
    entry = make_key("k1")
    ring = Keyring.from_env_value(entry)
    assert entry.split(":")[1] not in repr(ring)
    assert "k1" in repr(ring)


@pytest.mark.parametrize(
    ("key", "mask"),
    [
        ("sk-0123456789abcd", "sk-****abcd"),
        (SECRET, "sk-****cdef"),
        ("sk-short1", "sk-****"),
    ],
)
def test_mask_key(key: str, mask: str) -> None:
    assert mask_key(key) == mask
    assert key not in mask_key(key)


def test_sealed_is_plain_data() -> None:
    s = Sealed("k", b"n" * 12, b"c" * 20)
    assert s.key_id == "k"
