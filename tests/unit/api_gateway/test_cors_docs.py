"""CORS and docs that work with no internet (reference §9.3).

Over the real gateway app with fake backends: browser preflights and simple
requests from listed and unlisted origins, and ``/docs`` and ``/redoc`` loading
every script and stylesheet from the gateway itself.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import grpc
import httpx
import pytest

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.settings import InvalidSetting, load
from api_gateway import cors
from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings

from .conftest import OWNER, Backends, bearer, make_token, settings

USER = bearer(make_token(OWNER, "user", exp_in=86400))
APP_ORIGIN = "https://app.example"
BASE = "http://gateway.test"


@pytest.fixture
async def cors_client(backends: Backends) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway with ``CORS_ORIGINS`` set to two origins, on the fakes."""
    job = grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}")
    cred = grpc.aio.insecure_channel(f"127.0.0.1:{backends.credential_server.port}")
    app = create_app(
        settings(CORS_ORIGINS=f"{APP_ORIGIN}, http://localhost:5173", MAX_BODY_BYTES=1000),
        job_channel=job,
        credential_channel=cred,
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
        yield c
    await job.close()
    await cred.close()


def _preflight(origin: str, method: str = "POST", request_headers: str = "") -> dict[str, str]:
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if request_headers:
        h["Access-Control-Request-Headers"] = request_headers
    return h


def _cors_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower().startswith("access-control-")}


def _listed(value: str) -> set[str]:
    return {v.strip().lower() for v in value.split(",")}


# ---------------------------------------------------------------- CORS


async def test_a_preflight_from_a_listed_origin_is_allowed(
    cors_client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await cors_client.options(
        "/v1/ai/jobs",
        headers=_preflight(APP_ORIGIN, "POST", "authorization, content-type, idempotency-key"),
    )
    assert 200 <= resp.status_code < 300, resp.text
    assert resp.headers["access-control-allow-origin"] == APP_ORIGIN
    assert {"get", "post", "put", "delete"} <= _listed(resp.headers["access-control-allow-methods"])
    allowed = _listed(resp.headers["access-control-allow-headers"])
    assert {"authorization", "content-type", "idempotency-key", "if-none-match"} <= allowed
    assert "access-control-allow-credentials" not in resp.headers
    assert "origin" in resp.headers["vary"].lower()
    assert not backends.job.calls
    other = await cors_client.options(
        "/v1/me/model-credential", headers=_preflight("http://localhost:5173", "PUT")
    )
    assert other.headers["access-control-allow-origin"] == "http://localhost:5173"


async def test_answers_to_a_listed_origin_expose_the_headers_a_client_reads(
    cors_client: httpx.AsyncClient, backends: Backends
) -> None:
    """``ETag``, ``Idempotent-Replayed`` and ``Retry-After`` readable by a script, on
    success and on errors, the gateway's own refusals (413) included."""
    ok = await cors_client.get("/v1/ai/jobs", headers={**USER, "Origin": APP_ORIGIN})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == APP_ORIGIN
    exposed = _listed(ok.headers["access-control-expose-headers"])
    assert {"etag", "idempotent-replayed", "retry-after", "x-request-id"} <= exposed
    backends.job.errors["CreateJob"] = AppError(ErrorCode.QUOTA_EXCEEDED, "no more", None)
    refused = await cors_client.post(
        "/v1/ai/jobs",
        json={"jobType": "learning_state_analysis", "targetType": "user"},
        headers={**USER, "Origin": APP_ORIGIN},
    )
    assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()
    assert refused.headers["access-control-allow-origin"] == APP_ORIGIN
    too_big = await cors_client.post(
        "/v1/materials",
        json={"title": "t", "content": "x" * 2000},
        headers={**USER, "Origin": APP_ORIGIN},
    )
    assert too_big.status_code == 413
    assert too_big.headers["access-control-allow-origin"] == APP_ORIGIN


async def test_an_unlisted_origin_gets_no_cors_header_at_all(
    cors_client: httpx.AsyncClient, backends: Backends
) -> None:
    """Answered as with CORS off: its preflight is the API's 405 with ``Allow``, its
    requests carry no ``Access-Control-*`` header; ``Vary: Origin`` keeps caches honest."""
    evil = "https://evil.example"
    pre = await cors_client.options(
        "/v1/ai/jobs", headers=_preflight(evil, "POST", "authorization")
    )
    assert pre.status_code == 405, pre.text
    assert pre.json()["code"] == "METHOD_NOT_ALLOWED" and pre.headers["allow"] == "GET, POST"
    got = await cors_client.get("/v1/ai/jobs", headers={**USER, "Origin": evil})
    assert got.status_code == 200
    for resp in (pre, got):
        assert _cors_headers(resp) == {}, resp.headers
        assert "origin" in resp.headers["vary"].lower()
    # an origin that only differs by a trailing slash or its case of scheme is not listed
    for near in (APP_ORIGIN + "/", "https://app.example.evil", "http://app.example"):
        resp = await cors_client.get("/v1/ai/jobs", headers={**USER, "Origin": near})
        assert _cors_headers(resp) == {}, near


async def test_no_origin_no_cors_headers_but_vary(cors_client: httpx.AsyncClient) -> None:
    resp = await cors_client.get("/healthz")
    assert _cors_headers(resp) == {} and "origin" in resp.headers["vary"].lower()


async def test_a_refused_preflight_from_a_listed_origin_is_a_spec_error(
    cors_client: httpx.AsyncClient,
) -> None:
    for preflight in (
        _preflight(APP_ORIGIN, "PATCH"),
        _preflight(APP_ORIGIN, "POST", "authorization, x-internal-api-key"),
    ):
        resp = await cors_client.options("/v1/ai/jobs", headers=preflight)
        assert resp.status_code == 400, resp.text
        body = resp.json()
        assert body["code"] == "INVALID_ARGUMENT"
        assert body["message"].startswith("CORS preflight refused (Disallowed CORS")
        assert body["details"]["allowMethods"] == list(cors.ALLOW_METHODS)
        assert resp.headers["access-control-allow-origin"] == APP_ORIGIN


async def test_cors_is_off_by_default(client: httpx.AsyncClient) -> None:
    pre = await client.options("/v1/ai/jobs", headers=_preflight(APP_ORIGIN))
    assert pre.status_code == 405 and _cors_headers(pre) == {}
    got = await client.get("/v1/ai/jobs", headers={**USER, "Origin": APP_ORIGIN})
    assert got.status_code == 200 and _cors_headers(got) == {}


@pytest.mark.parametrize(
    "value",
    ["https://one.test/", "two.test", "https://three.test/path", "ftp://four.test"],
)
def test_a_cors_origin_that_can_never_match_refuses_the_start(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CORS_ORIGINS", f"https://ok.example,{value}")
    with pytest.raises(InvalidSetting) as refused:
        load(GatewaySettings, "api_gateway")
    assert "CORS_ORIGINS" in str(refused.value)
    assert value not in str(refused.value)  # the rule, never the value


@pytest.mark.parametrize(
    ("value", "origins"),
    [
        ("", []),
        (" , ", []),
        ("*", ["*"]),
        (
            "HTTPS://App.Example:8443, http://localhost:5173",
            ["https://app.example:8443", "http://localhost:5173"],
        ),
    ],
)
def test_cors_origins_are_read_as_browsers_send_them(value: str, origins: list[str]) -> None:
    assert settings(CORS_ORIGINS=value).cors_origins == origins


# ---------------------------------------------------------------- docs with no internet


class _Assets(HTMLParser):
    """Every URL a page loads: script sources, stylesheets and icons."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.urls.append(str(a["src"]))
        if tag == "link" and a.get("href"):
            self.urls.append(str(a["href"]))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_load_everything_from_the_gateway(
    client: httpx.AsyncClient, page: str
) -> None:
    """reference §9.3: every script, stylesheet and icon of the page is served by the
    gateway (same origin, 200), nothing from a CDN or a font service, and the
    Swagger UI is one that renders the OpenAPI 3.1 document FastAPI writes."""
    resp = await client.get(page)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    parser = _Assets()
    parser.feed(resp.text)
    assert len(parser.urls) >= 2, parser.urls
    kinds: set[str] = set()
    for url in parser.urls:
        absolute = urljoin(str(resp.url), url)
        assert urlsplit(absolute).netloc == urlsplit(str(resp.url)).netloc, url
        asset = await client.get(absolute)
        assert asset.status_code == 200, (url, asset.status_code)
        kinds.add(asset.headers["content-type"].split(";")[0])
        assert asset.content, url
    assert "text/css" in kinds or page == "/redoc"
    assert any("javascript" in k for k in kinds), kinds
    # no other origin named anywhere the browser would fetch from
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", resp.text), resp.text
    assert "fonts.googleapis" not in resp.text
    spec_url = re.search(r"""(?:url|spec-url)\s*[:=]\s*['"]([^'"]+)['"]""", resp.text)
    assert spec_url and spec_url.group(1) == "/openapi.json", resp.text
    document = (await client.get(spec_url.group(1))).json()
    assert document["openapi"].startswith("3.1")


async def test_swagger_ui_is_a_version_that_reads_openapi_3_1(client: httpx.AsyncClient) -> None:
    page = (await client.get("/docs")).text
    assert '"validatorUrl": null' in page  # no call to the public validator service
    js = next(u for u in _urls(page) if u.endswith(".js"))
    bundle = (await client.get(js)).text
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.', bundle)
    assert version and int(version.group(1)) >= 5, "Swagger UI 5 renders OpenAPI 3.1"


def _urls(page: str) -> list[str]:
    parser = _Assets()
    parser.feed(page)
    return parser.urls


async def test_an_unknown_asset_is_a_404(client: httpx.AsyncClient) -> None:
    resp = await client.get("/docs/assets/../../api_gateway/settings.py")
    assert resp.status_code == 404
    assert resp.json()["code"] == "NOT_FOUND"


async def test_the_assets_answer_405_with_allow(client: httpx.AsyncClient) -> None:
    resp = await client.post("/docs/assets/swagger-ui.css", json={})
    assert (resp.status_code, resp.json()["code"]) == (405, "METHOD_NOT_ALLOWED")
    assert resp.headers["Allow"] == "GET, HEAD"
