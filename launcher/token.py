"""Mint a user or admin JWT for local use (docs/walkthrough.md, curl, the demo).

``python -m launcher.token --sub u1 --role admin [--plan pro] [--ttl 3600]``
prints an HS256 token signed with ``JWT_SECRET`` (from the environment, an
``--env-file``, or the launcher's ``var/dev-secrets.env``), with claims
``sub``, ``role``, ``iat``, ``exp`` (reference §3.1), ``plan`` when given and
``iss`` when ``JWT_ISSUER`` is set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import jwt

from launcher.devsecrets import DEV_SECRETS_FILE, read_env_file

ROLES = ("user", "admin")


class TokenError(RuntimeError):
    """No JWT secret could be found."""


def mint_token(
    secret: str,
    *,
    sub: str,
    role: str = "user",
    plan: str | None = None,
    ttl_seconds: int = 3600,
    issuer: str | None = None,
    now: float | None = None,
) -> str:
    """An HS256 JWT for the public API.

    Args:
        secret: ``JWT_SECRET``.
        sub: the user id.
        role: ``"user"`` or ``"admin"``.
        plan: optional plan name (quota lookup in ``PLAN_DAILY_JOB_QUOTAS``).
        ttl_seconds: lifetime in seconds (``exp = now + ttl``).
        issuer: ``iss`` claim, when ``JWT_ISSUER`` is configured.
        now: UNIX seconds to issue at (tests); default the current time.

    Raises:
        ValueError: an unknown role, an empty sub or a non-positive ttl.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if not sub:
        raise ValueError("sub must not be empty")
    if ttl_seconds <= 0:
        raise ValueError("ttl must be positive")
    issued = int(now if now is not None else time.time())
    claims: dict[str, object] = {
        "sub": sub,
        "role": role,
        "iat": issued,
        "exp": issued + ttl_seconds,
    }
    if plan:
        claims["plan"] = plan
    if issuer:
        claims["iss"] = issuer
    return jwt.encode(claims, secret, algorithm="HS256")


def find_jwt_settings(
    env: Mapping[str, str],
    *,
    var_dir: str | os.PathLike[str] = "var",
    env_file: Path | None = None,
) -> tuple[str, str | None]:
    """``(JWT_SECRET, JWT_ISSUER or None)``: environment first, then ``env_file``,
    then ``<var_dir>/dev-secrets.env``.

    Raises:
        TokenError: no secret anywhere.
    """
    sources: list[Mapping[str, str]] = [env]
    if env_file is not None:
        sources.append(read_env_file(env_file))
    sources.append(read_env_file(Path(var_dir) / DEV_SECRETS_FILE))
    secret = next((s["JWT_SECRET"] for s in sources if s.get("JWT_SECRET")), None)
    if not secret:
        raise TokenError(
            f"JWT_SECRET is not set and {Path(var_dir) / DEV_SECRETS_FILE} has none; "
            "start `python -m launcher` once or export JWT_SECRET"
        )
    issuer = next((s["JWT_ISSUER"] for s in sources if s.get("JWT_ISSUER")), None)
    return secret, issuer


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m launcher.token``; prints the token."""
    parser = argparse.ArgumentParser(
        prog="python -m launcher.token", description="Mint an HS256 JWT for the public API."
    )
    parser.add_argument("--sub", required=True, help="user id (claim sub)")
    parser.add_argument("--role", choices=ROLES, default="user")
    parser.add_argument("--plan", help="plan name (claim plan), for per-plan quotas")
    parser.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds (3600)")
    parser.add_argument("--env-file", type=Path, help="KEY=VALUE file with JWT_SECRET")
    parser.add_argument(
        "--var-dir",
        default=os.environ.get("AIRUNTIME_VAR_DIR", "var"),
        help="the launcher's var dir (default ./var)",
    )
    args = parser.parse_args(argv)
    try:
        secret, issuer = find_jwt_settings(os.environ, var_dir=args.var_dir, env_file=args.env_file)
        token = mint_token(
            secret,
            sub=args.sub,
            role=args.role,
            plan=args.plan,
            ttl_seconds=args.ttl,
            issuer=issuer,
        )
    except (TokenError, ValueError) as exc:
        print(f"launcher.token: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
