"""The gateway's OpenAPI document, as FastAPI builds it with one correction
(reference §9.3: the document states what the server takes).

A parameter of an operation is never ``null``: an optional header or query
parameter is one a client leaves out (``required: false``). FastAPI declares an
optional ``str | None`` parameter as ``anyOf: [<its schema>, {"type": "null"}]``,
which a client generator or a fuzzer reads as "null may be sent": sent as a
header, that is the text ``null``, which the parameter's own schema (an event id,
a printable key) may refuse. :func:`install` keeps the parameter's own schema only.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

_NULL = {"type": "null"}


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without a ``{"type": "null"}`` arm of its ``anyOf`` (a lone other arm
    replaces the ``anyOf``, keeping the parameter's title and description)."""
    arms = schema.get("anyOf")
    if not isinstance(arms, list) or _NULL not in arms:
        return schema
    rest = [arm for arm in arms if arm != _NULL]
    others = {k: v for k, v in schema.items() if k != "anyOf"}
    if len(rest) == 1:
        return {**rest[0], **others}
    return {**others, "anyOf": rest}


def drop_null_parameters(document: dict[str, Any]) -> None:
    """Make every optional parameter of ``document`` non-nullable, in place."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if not parameter.get("required") and "schema" in parameter:
                    parameter["schema"] = _without_null(parameter["schema"])


def install(app: FastAPI) -> None:
    """Serve ``app``'s document with :func:`drop_null_parameters` applied (once: the
    document is built on first use and kept, as FastAPI does)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            drop_null_parameters(build())
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
