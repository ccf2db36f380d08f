"""The OpenAPI document states what the server enforces (reference §3.1, §9.3; case N5).

For every header parameter of every operation, and for the text fields the
services hold to rules of their own (a title, a knowledge point's name and a
material's content are stripped and must not be left empty; a model key is 8..512
printable ASCII characters; a knowledge point names 1..500 blocks), values on both
sides of each declared limit are sent to the live stack (real gateway, job_service
and credential_service, ``conftest.py``). The document's own schema of the
parameter or field is the judge: a value it takes must not be refused for that
parameter or field, a value it refuses must be refused (400 ``INVALID_ARGUMENT``
naming it). A generated client and a fuzzer then agree with the server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.hostile.conftest import Stack
from tests.hostile.test_rest_hostile import ROUTES
from tests.hostile.test_schemathesis_gateway import DOCUMENT, STREAMS

#: Header values on both sides of every limit a header may have (sendable as
#: latin-1 field values: HTTP carries no other text).
HEADER_PROBES = [
    "",
    " ",
    "k",
    " k",
    "k ",
    "k k",
    "k\tk",
    "k\x01k",
    "\x7f",
    "é",
    "null",
    "0",
    "7",
    "-1",
    "1.5",
    "9" * 18,
    "9" * 19,
    "a" * 128,
    "a" * 129,
    "a" * 200,
    "a" * 201,
    "~!@#$%^&*()",
]
#: Texts on both sides of "not blank" and of the length limits.
TEXT_PROBES = [
    "",
    " ",
    "\t\n",
    "\u3000",
    "\x1c\x1d",
    "\u2028 ",
    "\u200b",
    "a",
    " a ",
    "#",
    "---",
    "> ",
    "[a]: https://example.com",
    "é",
    "x" * 500,
    "x" * 501,
    " " + "x" * 498 + " ",
]
KEY_PROBES = [
    "",
    "short",
    "sk-1234",
    "sk-12345",
    " sk-12345678\n",
    "\tsk-12345678",
    "sk 12345678",
    "sk-1234567é",
    "\u3000sk-12345678",
    "\x1csk-12345678",
    "k" * 512,
    "k" * 513,
    " " + "k" * 511,
]


def _blamed(resp: httpx.Response) -> set[str]:
    """The parameters and fields a 400 names (``details.field`` or ``details.fields``)."""
    if resp.status_code != 400:
        return set()
    details = resp.json().get("details") or {}
    names = {str(f.get("field")) for f in details.get("fields", [])}
    if "field" in details:
        names.add(str(details["field"]))
    return names


def _judge(schema: dict[str, Any], value: Any) -> bool:
    return bool(Draft202012Validator(schema).is_valid(value))


def _sample(template: str, stack: Stack) -> str:
    ids = {"jobId": stack.seed.job_ids[0], "materialId": stack.seed.material_id}
    return re.sub(r"\{([^}]+)\}", lambda m: ids.get(m.group(1), "x"), template)


def _body(method: str, template: str, stack: Stack) -> Any:
    pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$")
    for route in ROUTES:
        if route.method == method and pattern.match(route.path):
            return route.body(stack)
    return None


def _header_cases() -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    for template, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            for param in operation.get("parameters", []):
                if param["in"] == "header":
                    yield method.upper(), template, param["name"], param["schema"]


HEADER_CASES = list(_header_cases())


def test_the_header_cases_cover_every_header_the_api_reads() -> None:
    names = {name for _, _, name, _ in HEADER_CASES}
    assert names == {"Idempotency-Key", "If-None-Match", "Last-Event-ID", "X-Runtime-Instance-Id"}


def _send(
    http: httpx.Client, stack: Stack, method: str, template: str, header: str, value: str
) -> httpx.Response:
    """One request with ``header: value`` (as latin-1 bytes, as HTTP carries text); an
    event stream that opens is closed at once (its status is read)."""
    path = _sample(template, stack)
    credentials = stack.headers_for(template)
    sent = httpx.Headers(
        [(k, v.encode()) for k, v in credentials.items() if k.lower() != header.lower()]
        + [(header, value.encode("latin-1"))]
    )
    if re.search(STREAMS, template):
        with http.stream(method, path, headers=sent) as resp:
            if resp.status_code != 200:
                resp.read()
            return resp
    return http.request(method, path, headers=sent, json=_body(method, template, stack))


def _job_version(http: httpx.Client, stack: Stack) -> int:
    resp = http.get(f"/v1/ai/jobs/{stack.seed.job_ids[0]}", headers=stack.user_headers())
    return int(resp.headers["ETag"].strip('"'))


@pytest.mark.parametrize(
    ("method", "template", "header", "schema"),
    HEADER_CASES,
    ids=[f"{m} {t} {h}" for m, t, h, _ in HEADER_CASES],
)
def test_a_header_is_taken_exactly_when_its_declared_schema_takes_it(
    stack: Stack, method: str, template: str, header: str, schema: dict[str, Any]
) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=10) as http:
        for value in HEADER_PROBES:
            valid = _judge(schema, value)
            if (
                valid
                and header == "Last-Event-ID"
                and template.startswith("/v1/ai/jobs/")
                and int(value) > _job_version(http, stack)
            ):
                continue  # above the job's version: 400 by reference §9.1 (no schema matter)
            try:
                resp = _send(http, stack, method, template, header, value)
            except httpx.LocalProtocolError:
                continue  # HTTP/1.1 cannot carry it (surrounding spaces, controls)
            assert resp.status_code < 500, (value, resp.status_code)
            blamed = header in _blamed(resp)
            assert blamed is not valid, (
                f"{header}={value!r}: the document {'takes' if valid else 'refuses'} it, "
                f"the server answered {resp.status_code} {resp.text[:200]}"
            )


def _field_schema(component: str, field: str) -> dict[str, Any]:
    schema: dict[str, Any] = DOCUMENT["components"]["schemas"][component]["properties"][field]
    return schema


TEXT_FIELDS = [
    ("POST", "/v1/materials", "MaterialCreate", "title", TEXT_PROBES),
    ("POST", "/v1/materials", "MaterialCreate", "content", TEXT_PROBES),
    ("POST", "/v1/knowledge-points", "KnowledgePointCreate", "name", TEXT_PROBES),
    ("PUT", "/v1/me/model-credential", "CredentialPut", "apiKey", KEY_PROBES),
]


@pytest.mark.parametrize(
    ("method", "path", "component", "field", "probes"),
    TEXT_FIELDS,
    ids=[f"{m} {p} {f}" for m, p, _, f, _ in TEXT_FIELDS],
)
def test_a_text_field_is_taken_exactly_when_its_declared_schema_takes_it(
    stack: Stack, method: str, path: str, component: str, field: str, probes: list[str]
) -> None:
    """The services' own rules (strip, then not empty; the key's characters) agree
    with the field's declared pattern and lengths."""
    schema = _field_schema(component, field)
    assert "pattern" in schema, (component, field)
    with httpx.Client(base_url=stack.base_url, timeout=10) as http:
        for value in probes:
            body = {**_body(method, path, stack), field: value}
            resp = http.request(method, path, json=body, headers=stack.user_headers())
            valid = _judge(schema, value)
            assert resp.status_code < 500, (value, resp.status_code)
            if valid:
                assert 200 <= resp.status_code < 300, (value, resp.status_code, resp.text[:200])
            else:
                assert field in _blamed(resp), (value, resp.status_code, resp.text[:200])


def test_a_knowledge_point_names_as_many_blocks_as_its_schema_says(stack: Stack) -> None:
    schema = _field_schema("KnowledgePointCreate", "blockIds")
    block = stack.seed.block_ids[0]
    with httpx.Client(base_url=stack.base_url, timeout=10) as http:
        for ids in ([], [block], [block, block], [block] * 500, [block] * 501):
            body = {**_body("POST", "/v1/knowledge-points", stack), "blockIds": ids}
            resp = http.post("/v1/knowledge-points", json=body, headers=stack.user_headers())
            if _judge(schema, ids):
                assert resp.status_code == 201, (len(ids), resp.text[:200])
            else:
                assert "blockIds" in _blamed(resp), (len(ids), resp.text[:200])
        omitted = {k: v for k, v in _body("POST", "/v1/knowledge-points", stack).items()}
        del omitted["blockIds"]
        resp = http.post("/v1/knowledge-points", json=omitted, headers=stack.user_headers())
        assert "blockIds" in _blamed(resp)
    assert "blockIds" in DOCUMENT["components"]["schemas"]["KnowledgePointCreate"]["required"]
