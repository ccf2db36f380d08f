"""The headers the OpenAPI document declares, and the shim reading them (reference §9.3).

The two tokens are security schemes, ``Idempotency-Key`` and
``X-Runtime-Instance-Id`` header parameters; a client that sends what the document
declares is served, over the real gateway app with fake backends.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api_gateway import headers
from api_gateway.app import create_app

from .conftest import SERVICE_TOKEN, Backends, settings

# ---------------------------------------------------------------- declared headers


def _document() -> dict[str, Any]:
    return create_app(settings()).openapi()


def _header_params(operation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "header"}


def _operations(document: dict[str, Any], prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, ops in document["paths"].items()
        if path.startswith(prefix)
        for method, op in ops.items()
    ]


def test_the_document_declares_every_header_the_shim_reads() -> None:
    """``x-internal-api-key`` as a header security scheme and ``X-Runtime-Instance-Id``
    as a header parameter (required but on health) of every shim operation."""
    document = _document()
    schemes = document["components"]["securitySchemes"]
    token = schemes[headers.SERVICE_TOKEN_SCHEME]
    assert (token["type"], token["in"], token["name"]) == ("apiKey", "header", "x-internal-api-key")
    shim = _operations(document, "/internal/runtime/")
    assert len(shim) >= 12
    for method, path, op in shim:
        assert op["security"] == [{headers.SERVICE_TOKEN_SCHEME: []}], (method, path)
        instance = _header_params(op).get("X-Runtime-Instance-Id")
        assert instance is not None, (method, path)
        assert instance["required"] is (path != "/internal/runtime/health"), (method, path)
        assert instance["schema"]["maxLength"] == 128


def test_the_document_declares_the_bearer_and_the_idempotency_key() -> None:
    document = _document()
    bearer_scheme = document["components"]["securitySchemes"][headers.BEARER_SCHEME]
    assert (bearer_scheme["type"], bearer_scheme["scheme"]) == ("http", "bearer")
    for prefix in ("/v1/", "/admin/ai/"):
        for method, path, op in _operations(document, prefix):
            assert op["security"] == [{headers.BEARER_SCHEME: []}], (method, path)
    for path in ("/v1/ai/jobs", "/admin/ai/jobs"):
        op = document["paths"][path]["post"]
        key = _header_params(op)["Idempotency-Key"]
        assert key["required"] is False
        assert op["responses"]["200"]["headers"]["Idempotent-Replayed"]["required"] is True


def test_every_operation_id_is_its_handlers_name_in_camel_case() -> None:
    """Generated clients name their functions after these: ``getAiJob``, not
    FastAPI's ``get_ai_job_v1_ai_jobs__jobId__get``; unique across the document."""
    ids = {(method, path): op["operationId"] for method, path, op in _operations(_document(), "/")}
    assert len(set(ids.values())) == len(ids)
    assert ids[("GET", "/v1/ai/jobs/{jobId}")] == "getAiJob"
    assert ids[("POST", "/v1/materials")] == "createMaterial"
    assert ids[("DELETE", "/v1/me")] == "eraseMe"
    assert ids[("GET", "/admin/ai/jobs/{jobId}")] == "adminGetJob"
    assert ids[("POST", "/internal/runtime/jobs/{jobId}/heartbeat")] == "heartbeat"
    for operation_id in ids.values():
        assert operation_id.isalnum() and operation_id[0].islower(), operation_id


def test_every_429_and_503_declares_retry_after() -> None:
    document = _document()
    seen = 0
    for _method, _path, op in _operations(document, "/"):
        for status in ("429", "503"):
            if status in op["responses"]:
                seen += 1
                assert op["responses"][status]["headers"]["Retry-After"]["required"] is True
    assert seen >= 60


def test_the_waiting_headers_declare_the_same_way() -> None:
    """``If-None-Match`` and ``Last-Event-ID`` (reference §9.1) become header parameters of
    any route that takes them, like the ones above."""
    app = FastAPI()

    @app.get("/probe")
    async def probe(
        if_none_match: headers.IfNoneMatchHeader = None,
        last_event_id: headers.LastEventIdHeader = None,
    ) -> dict[str, Any]:
        return {"ifNoneMatch": if_none_match, "lastEventId": last_event_id}

    params = _header_params(app.openapi()["paths"]["/probe"]["get"])
    assert set(params) == {"If-None-Match", "Last-Event-ID"}
    assert not any(p["required"] for p in params.values())


async def test_a_client_sending_what_the_document_declares_is_served(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    """What a generated client does: for each shim operation, send the declared
    required headers and the security scheme's header, nothing else."""
    document = (await client.get("/openapi.json")).json()
    schemes = document["components"]["securitySchemes"]
    op = document["paths"]["/internal/runtime/jobs/{jobId}/heartbeat"]["post"]
    sent: dict[str, str] = {}
    for requirement in op["security"]:
        for name in requirement:
            sent[schemes[name]["name"]] = SERVICE_TOKEN
    for name, param in _header_params(op).items():
        if param["required"]:
            sent[name] = "generated-client-1"
    resp = await client.post(
        "/internal/runtime/jobs/job-1/heartbeat", json={"attemptNo": 1}, headers=sent
    )
    assert resp.status_code == 204, resp.text
    assert backends.job.last("Heartbeat").metadata["x-runtime-instance-id"] == "generated-client-1"


async def test_the_token_is_checked_before_the_instance_id(client: httpx.AsyncClient) -> None:
    """A declared, required header does not change the order of refusals: no token is
    401 whatever else is missing; the token without an instance id is 400 naming it."""
    no_token = await client.post("/internal/runtime/jobs/poll", json={"capabilities": []})
    assert no_token.status_code == 401 and no_token.json()["code"] == "UNAUTHENTICATED"
    no_instance = await client.post(
        "/internal/runtime/jobs/poll",
        json={"capabilities": ["quiz_generation"]},
        headers={"x-internal-api-key": SERVICE_TOKEN},
    )
    assert no_instance.status_code == 400
    fields = no_instance.json()["details"]["fields"]
    assert [(f["field"], f["in"]) for f in fields] == [("X-Runtime-Instance-Id", "header")]


def test_the_gateway_reads_no_header_it_does_not_declare() -> None:
    """Routes and dependencies read headers only through declared parameters (the
    middleware's transport headers aside): no ``request.headers`` lookup in them."""
    from pathlib import Path

    import api_gateway

    root = Path(api_gateway.__file__).parent
    for path in [root / "deps.py", root / "jobs.py", *sorted((root / "routes").glob("*.py"))]:
        assert "request.headers" not in path.read_text(), path


@pytest.mark.parametrize(
    ("value", "status"),
    [(None, 200), ("worker-9", 200), ("", 400), ("w" * 129, 400), ("wörker", 400)],
)
async def test_health_checks_an_instance_id_when_one_is_sent(
    client: httpx.AsyncClient, backends: Backends, value: str | None, status: int
) -> None:
    """Optional on health, as the document says, and held to its documented rules
    when present (a blank one is not taken for none)."""
    sent = httpx.Headers({"x-internal-api-key": SERVICE_TOKEN})
    if value is not None:
        sent["X-Runtime-Instance-Id"] = value.encode("utf-8").decode("latin-1")
    resp = await client.get("/internal/runtime/health", headers=sent)
    assert resp.status_code == status, resp.text
    if status == 400:
        fields = resp.json()["details"]["fields"]
        assert [(f["field"], f["in"]) for f in fields] == [("X-Runtime-Instance-Id", "header")]
        assert not backends.job.calls
    else:
        md = backends.job.last("GetRuntimeHealth").metadata
        assert md.get("x-runtime-instance-id") == value


def test_the_document_declares_waiting_for_a_job() -> None:
    """reference §9.1 as a generated client sees it: ``waitSeconds`` (0..60) and
    ``If-None-Match`` on the job's GET with its ETag and 304; ``Last-Event-ID``, a
    ``text/event-stream`` answer, 204 (the job stream) and 429 on both streams."""
    paths = _document()["paths"]
    get = paths["/v1/ai/jobs/{jobId}"]["get"]
    wait = next(p for p in get["parameters"] if p["name"] == "waitSeconds")
    assert wait["in"] == "query" and not wait.get("required", False)
    assert (wait["schema"]["minimum"], wait["schema"]["maximum"]) == (0, 60)
    assert wait["schema"]["default"] == 0
    assert "If-None-Match" in _header_params(get)
    assert "ETag" in get["responses"]["200"]["headers"]
    assert "ETag" in get["responses"]["304"]["headers"]
    assert "content" not in get["responses"]["304"]
    for path, end in (("/v1/ai/jobs/{jobId}/events", True), ("/v1/ai/events", False)):
        op = paths[path]["get"]
        assert "Last-Event-ID" in _header_params(op), path
        assert "text/event-stream" in op["responses"]["200"]["content"], path
        assert ("204" in op["responses"]) is end, path
        assert "Retry-After" in op["responses"]["429"]["headers"], path


def test_every_error_answer_is_declared_as_the_json_error_body() -> None:
    """Every 4xx and 5xx of every operation is ``application/json`` with ``ErrorBody``,
    as the gateway sends them, whatever the operation's success media type: the two
    event streams declare ``text/event-stream`` for their 200 only (reference §4, §9.1;
    case N3)."""
    document = _document()
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    checked = 0
    for method, path, op in _operations(document, "/"):
        for status, answer in op["responses"].items():
            if status[0] in "45":
                assert answer.get("content") == {"application/json": {"schema": error_body}}, (
                    method,
                    path,
                    status,
                )
                checked += 1
    assert checked > 400
    for path in ("/v1/ai/jobs/{jobId}/events", "/v1/ai/events"):
        ok = document["paths"][path]["get"]["responses"]["200"]
        assert set(ok["content"]) == {"text/event-stream"}, path


def test_not_blank_is_exactly_what_strip_keeps() -> None:
    """The document's "not blank" pattern and the services' ``str.strip()`` agree on
    every code point, in Python's ``re`` and in pydantic's regex alike."""
    import re
    import sys
    from typing import Annotated

    from pydantic import Field as PydanticField
    from pydantic import TypeAdapter, ValidationError

    from api_gateway.schemas import NOT_BLANK

    every = "".join(chr(p) for p in range(sys.maxunicode + 1) if not 0xD800 <= p < 0xE000)
    kept = set(re.findall(NOT_BLANK, every))
    assert kept == {c for c in every if not c.isspace()}
    adapter = TypeAdapter(Annotated[str, PydanticField(pattern=NOT_BLANK)])
    for char in [c for c in map(chr, range(0x3001)) if c.isspace()] + ["a", "\u200b", "\x00"]:
        try:
            adapter.validate_python(f" {char} ")
            taken = True
        except ValidationError:
            taken = False
        assert taken is (not char.isspace()), hex(ord(char))


def test_no_parameter_is_declared_nullable() -> None:
    """An optional parameter is one a client leaves out: its schema is its value's
    own (a fuzzer would otherwise send the header ``Last-Event-ID: null``)."""
    document = _document()
    optional = 0
    for method, path, op in _operations(document, "/"):
        for param in op.get("parameters", []):
            assert "null" not in str(param["schema"]), (method, path, param["name"])
            optional += not param.get("required", False)
    assert optional >= 20
