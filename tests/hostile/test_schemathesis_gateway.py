"""Property-based fuzzing of every gateway route from its own OpenAPI document.

schemathesis fuzzes the gateway's OpenAPI document (built from the app; a test
checks it equals the live ``/openapi.json``) against the live gateway (real
job_service and credential_service behind it, see ``conftest.py``; the
document is built offline because schemathesis' lazy fixture loader does not
work with pytest 9) and generates requests for
every ``/v1``, ``/admin`` and ``/internal/runtime`` operation (the two event
streams included, read up to their first event), valid and invalid,
sent with valid credentials for the route's area. Every answer must

* never be a 5xx,
* have a status the document lists for the operation,
* match the documented schema of that status (the ``ErrorBody`` for errors),
* have the documented content type and headers.

Path ids are drawn half the time from rows that exist (the seeded material
and jobs), so the "found" branches run too. The shim's declared
``X-Runtime-Instance-Id`` header is fuzzed like any parameter (the test adds only
the credentials); a valid one is half the time the instance holding the seeded
leases.

Profile: default 6 examples per operation, no coverage phase (CI);
``HOSTILE_PROFILE=long`` runs 40 examples plus schemathesis' coverage phase
(boundary values; ~8 min); ``HOSTILE_MAX_EXAMPLES=n`` overrides the count.
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.core.parameters import ParameterLocation

from tests.hostile.conftest import INSTANCE, Stack

LONG = os.environ.get("HOSTILE_PROFILE") == "long"
MAX_EXAMPLES = int(os.environ.get("HOSTILE_MAX_EXAMPLES", 40 if LONG else 6))

#: schemathesis checks that judge the API against its document. Left out:
#: ``positive_data_acceptance`` (a schema-valid request may still be refused by
#: business rules: a random job id is 404, a terminal job's cancel 409…) and
#: the stateful/auth-probing checks that need a second credential set
#: (``ignored_auth`` is covered by tests/unit/api_gateway/test_auth.py).
CHECKS = {
    "not_a_server_error": True,
    "status_code_conformance": True,
    "content_type_conformance": True,
    "response_headers_conformance": True,
    "response_schema_conformance": True,
    "negative_data_rejection": True,
    "positive_data_acceptance": False,
    "missing_required_header": True,
    "unsupported_method": True,
    "ignored_auth": False,
    "use_after_free": False,
    "ensure_resource_availability": False,
}


def _config(checks: dict[str, bool] = CHECKS, *, security: bool = False) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": 20261130,
            "max-stream-events": 1,
            # Credentials are the test's own (valid) headers; auth refusals are
            # tests/unit/api_gateway/test_auth.py's job.
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "database": "none",
                "with-security-parameters": security,
            },
            "checks": {name: {"enabled": on} for name, on in checks.items()},
            "phases": {"coverage": {"enabled": LONG}},
        }
    )


def _document() -> dict[str, Any]:
    """The gateway's OpenAPI document, built offline (equal to the served one, see below)."""
    from api_gateway.app import create_app
    from api_gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(RUNTIME_SERVICE_TOKEN="x", JWT_SECRET="y"))
    return app.openapi()


DOCUMENT = _document()
#: Ids that exist in the live stack, filled in by :func:`_existing_ids`.
EXISTING: dict[str, list[str]] = {}

#: The event streams (reference §9.1) do not end while their job lives (the per-user
#: one never does): schemathesis reads a ``text/event-stream`` answer up to
#: ``max-stream-events`` events or the request timeout (:data:`STREAM_TIMEOUT`), then
#: judges what it read; their refusals are ``application/json`` like every other.
STREAMS = r"/events$"
#: Seconds a fuzzed call of an event stream is read for when no event comes.
STREAM_TIMEOUT = 2.0
schema = schemathesis.openapi.from_dict(DOCUMENT, config=_config()).include(
    path_regex=r"^/(v1|admin|internal)/"
)
#: Longest ``waitSeconds`` a fuzzed GET may hold for (a valid value is capped so
#: a run stays short; an invalid one is kept, it makes the case negative).
MAX_FUZZED_WAIT = 1


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
    """Half the time, swap a generated id for one that exists.

    Only a value that is itself a valid id is swapped: in a negative case the
    invalid id must stay what makes the case negative.
    """
    if not path_parameters:
        return st.just(path_parameters)
    choices = [
        st.one_of(st.just(path_parameters[name]), st.sampled_from(ids)).map(
            lambda v, n=name: (n, v)
        )
        for name, ids in EXISTING.items()
        if ids and _valid_id(path_parameters.get(name))
    ]
    if not choices:
        return st.just(path_parameters)
    return st.tuples(*choices).map(lambda pairs: {**path_parameters, **dict(pairs)})


@schema.hook
def map_query(context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    """Cap a valid ``waitSeconds`` at :data:`MAX_FUZZED_WAIT`."""
    value = (query or {}).get("waitSeconds")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 60:
        return {**(query or {}), "waitSeconds": min(value, MAX_FUZZED_WAIT)}
    return query


@schema.hook
def filter_failure(context: Any, failure: Any, case: schemathesis.Case, response: Any) -> bool:
    """Drop "negative data accepted" when the only negation is an undeclared query key.

    OpenAPI query parameters have no ``additionalProperties``; like most HTTP
    APIs the gateway ignores query keys it does not know (``?_=cache-buster``).
    Declared query values stay strictly checked (FastAPI validates each).
    """
    if type(failure).__name__ != "AcceptedNegativeData" or case.meta is None:
        return True
    negative = {
        str(location)
        for location, info in case.meta.components.items()
        if info.mode.name == "NEGATIVE"
    }
    declared = {p.name for p in case.operation.query}
    undeclared = set(case.query or {}) - declared
    return not (undeclared and negative <= {str(ParameterLocation.QUERY)})


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 128


INSTANCE_HEADER = "X-Runtime-Instance-Id"


@schema.hook
def flatmap_headers(context: Any, headers: dict[str, Any] | None) -> Any:
    """Half the time, a valid generated instance id becomes the seeded lease holder's
    (an invalid one stays: it is what makes a negative case negative)."""
    value = (headers or {}).get(INSTANCE_HEADER)
    if not _valid_instance(value):
        return st.just(headers)
    return st.sampled_from([headers, {**(headers or {}), INSTANCE_HEADER: INSTANCE}])


def _valid_instance(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 1 <= len(value) <= 128
        and value.isascii()
        and value.isprintable()
        and value == value.strip()
    )


@pytest.fixture(autouse=True)
def _existing_ids(stack: Stack) -> None:
    EXISTING["jobId"] = list(stack.seed.job_ids)
    EXISTING["materialId"] = [stack.seed.material_id, stack.seed.other_material_id]


def test_fuzzed_document_is_the_served_one(stack: Stack) -> None:
    served = httpx.get(f"{stack.base_url}/openapi.json", timeout=10).json()
    assert served == DOCUMENT
    fuzzed = {(op.method.upper(), op.path) for op in _operations()}
    api_routes = {
        (method.upper(), path)
        for path, ops in served["paths"].items()
        for method in ops
        if path.startswith(("/v1/", "/admin/", "/internal/"))
    }
    assert fuzzed == api_routes
    assert len(api_routes) >= 35
    assert {("GET", "/v1/ai/jobs/{jobId}/events"), ("GET", "/v1/ai/events")} <= fuzzed


def _operations() -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


@schema.parametrize()
@hypothesis.settings(
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    max_examples=MAX_EXAMPLES,
)
def test_gateway_conforms_to_its_openapi(case: schemathesis.Case, stack: Stack) -> None:
    headers = dict(case.headers or {})
    credentials = stack.headers_for(case.path)
    if INSTANCE_HEADER in headers:  # a declared parameter: keep what was generated
        credentials.pop(INSTANCE_HEADER, None)
    headers.update(credentials)
    timeout = STREAM_TIMEOUT if re.search(STREAMS, case.path) else 30
    case.call_and_validate(base_url=stack.base_url, headers=headers, timeout=timeout)


# ---------------------------------------------------------------- every check on the streams

#: ``st run … --checks all`` on the two event streams, as a client without our seeded
#: ids would run it: every check schemathesis has, with its default expectations
#: (schema-valid requests accepted, credentials probed).
streams = schemathesis.openapi.from_dict(
    DOCUMENT, config=_config(dict.fromkeys(CHECKS, True), security=True)
).include(path_regex=STREAMS)


@streams.parametrize()
@hypothesis.settings(
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    max_examples=MAX_EXAMPLES,
)
def test_the_event_streams_pass_every_check(case: schemathesis.Case, stack: Stack) -> None:
    headers = {**(case.headers or {}), **stack.user_headers()}
    case.call_and_validate(base_url=stack.base_url, headers=headers, timeout=STREAM_TIMEOUT)


# ---------------------------------------------------------------- declared limits

#: The document states what the server enforces (reference §9.3): schema-valid data
#: is never refused *for a header or a field the document gives a pattern* (the
#: limits a generated client can check before it sends), and invalid data is refused.
#: A schema-valid request may still be refused for a business rule (an unknown page
#: token, a reading event without a block): such refusals name other fields.
limits = schemathesis.openapi.from_dict(
    DOCUMENT,
    config=_config(
        {name: name in ("positive_data_acceptance", "negative_data_rejection") for name in CHECKS}
    ),
).include(path_regex=r"^/(v1|admin|internal)/")
limits.hook(map_query)
limits.hook(flatmap_headers)


def _patterned_names(document: dict[str, Any]) -> set[str]:
    """Header parameters, and body fields whose schema has a ``pattern``."""
    names = {
        param["name"]
        for operations in document["paths"].values()
        for operation in operations.values()
        for param in operation.get("parameters", [])
        if param["in"] == "header"
    }
    for component in document["components"]["schemas"].values():
        for name, field in component.get("properties", {}).items():
            if "pattern" in field:
                names.add(name)
    return names


PATTERNED = _patterned_names(DOCUMENT)


def _blamed(response: Any) -> set[str]:
    try:
        details = response.json().get("details") or {}
    except ValueError:
        return set()
    names = {str(f.get("field")) for f in details.get("fields", [])}
    if "field" in details:
        names.add(str(details["field"]))
    return names


@limits.hook("filter_failure")
def keep_declared_limit_failures(
    context: Any, failure: Any, case: schemathesis.Case, response: Any
) -> bool:
    """Keep a refused schema-valid request only when the refusal names a patterned
    parameter or field; keep accepted invalid data as the main test does."""
    if type(failure).__name__ == "RejectedPositiveData":
        return bool(_blamed(response) & PATTERNED)
    return bool(filter_failure(context, failure, case, response))


def test_the_patterned_names_are_the_ones_the_services_check() -> None:
    assert {
        "Idempotency-Key",
        "X-Runtime-Instance-Id",
        "Last-Event-ID",
        "title",
        "content",
        "name",
        "apiKey",
    } <= PATTERNED


@limits.parametrize()
@hypothesis.settings(
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    max_examples=MAX_EXAMPLES,
)
def test_declared_limits_agree_with_the_server(case: schemathesis.Case, stack: Stack) -> None:
    headers = dict(case.headers or {})
    credentials = stack.headers_for(case.path)
    if INSTANCE_HEADER in headers:
        credentials.pop(INSTANCE_HEADER, None)
    headers.update(credentials)
    timeout = STREAM_TIMEOUT if re.search(STREAMS, case.path) else 30
    case.call_and_validate(base_url=stack.base_url, headers=headers, timeout=timeout)
