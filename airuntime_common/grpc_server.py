"""gRPC server bootstrap shared by job_service, credential_service and runtime_worker.

Every server gets: the internal-token interceptor (``x-internal-api-key``,
compared in constant time; health and reflection stay open so probes and
``grpcurl list`` work), request-id propagation into the log context, the
standard health service and server reflection (reference §1), optional TLS,
OpenTelemetry server spans when the process has tracing (reference §9.5, see
:mod:`airuntime_common.tracing`), and a graceful stop on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Histogram

from airuntime_common import metadata
from airuntime_common import tracing as _tracing
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.logs import bind, log_context
from airuntime_common.settings import MissingSetting

log = logging.getLogger(__name__)

#: Methods reachable without the service token.
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

MAX_MESSAGE_BYTES = 8 * 1024 * 1024

#: Server-side time of every unary call past the health and reflection services, by
#: method and the status code it answered (``CANCELLED`` when the caller went away
#: first), refusals included (the default registry: job_service's and
#: credential_service's ``/metrics``).
RPC_SECONDS = Histogram(
    "airt_grpc_server_handling_seconds",
    "Time a unary gRPC call spent in this server's handler, by method and status code",
    ["method", "code"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 25),
)


def _status_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The status code an ended call answers, as its name (``OK`` when none was set)."""
    code = context.code()
    if code is None:
        return "OK"
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))


def method_label(full_method: str) -> str:
    """``/pkg.Service/Method`` → ``Service/Method`` (the metrics' ``method`` label)."""
    service, _, method = full_method.lstrip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{method}"


class InternalAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without the right ``x-internal-api-key`` (UNAUTHENTICATED).

    Also binds ``requestId`` and ``runtimeInstanceId`` from metadata into the
    log context of the call.

    Args:
        token: the internal service token.
        traced: the server has the OpenTelemetry interceptor (in front of this one):
            each call's final status is then put on its server span.
    """

    def __init__(self, token: str, *, traced: bool = False) -> None:
        self._token = token.encode()
        self._traced = traced

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method or ""
        if method.startswith(OPEN_PREFIXES):
            return await continuation(details)
        md = {m.key: m.value for m in (details.invocation_metadata or ())}
        given = md.get(metadata.INTERNAL_API_KEY, "")
        given_b = given.encode() if isinstance(given, str) else bytes(given)
        handler = await continuation(details)
        if not hmac.compare_digest(given_b, self._token):
            return _with_context(
                _refuse(
                    AppError(ErrorCode.UNAUTHENTICATED, "missing or wrong x-internal-api-key"),
                    handler,
                ),
                method_label(method),
                self._traced,
            )
        request_id = md.get(metadata.REQUEST_ID) or uuid.uuid4().hex
        instance_id = md.get(metadata.RUNTIME_INSTANCE_ID)
        return _with_context(
            handler,
            method_label(method),
            self._traced,
            requestId=request_id,
            runtimeInstanceId=instance_id,
        )


def _refuse(err: AppError, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler refusing every call with ``err``, of the arity of the method's own
    ``handler`` (a stream is refused as a stream)."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await abort(context, err)

    async def deny_stream(
        _requests: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await abort(context, err)
        yield  # unreachable: abort raises

    if handler is not None and handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(deny_stream)
    return grpc.unary_unary_rpc_method_handler(deny)


class _Undecodable:
    """Stands in for a request whose bytes did not parse as the method's message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _undecodable(request: _Undecodable) -> AppError:
    """The INVALID_ARGUMENT (reference §4) answering a request whose bytes did not parse."""
    return AppError(
        ErrorCode.INVALID_ARGUMENT,
        "request is not a valid protobuf message for this method",
        {"reason": request.reason},
    )


def _safe_deserializer(
    deserialize: Callable[[bytes], Any] | None,
) -> Callable[[bytes], Any] | None:
    """Wrap a request deserializer so malformed bytes become :class:`_Undecodable`.

    Without it grpc answers a corrupt or too deeply nested message with
    ``UNKNOWN`` and the parser's exception text; the wrapped handler answers
    ``INVALID_ARGUMENT`` instead (reference §4).
    """
    if deserialize is None:
        return None

    def safe(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError, RecursionError, ...
            return _Undecodable(type(exc).__name__)

    return safe


def _with_context(
    handler: grpc.RpcMethodHandler | None, method: str, traced: bool, **fields: Any
) -> grpc.RpcMethodHandler:
    if handler is not None and handler.stream_stream is not None:
        return _stream_with_context(handler, method, **fields)
    if handler is None or handler.unary_unary is None:
        return handler
    inner = handler.unary_unary

    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.perf_counter()
        code: str | None = None
        token = bind(**fields)
        try:
            if isinstance(request, _Undecodable):
                await abort(context, _undecodable(request))
            return await inner(request, context)
        except asyncio.CancelledError:  # the caller went away (deadline, cancel)
            code = "CANCELLED"
            raise
        finally:
            final = code or _status_name(context)
            RPC_SECONDS.labels(method, final).observe(time.perf_counter() - started)
            if traced:
                _tracing.note_rpc_status(final)
            log_context.reset(token)

    return grpc.unary_unary_rpc_method_handler(
        wrapped,
        request_deserializer=_safe_deserializer(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


def _stream_with_context(
    handler: grpc.RpcMethodHandler, method: str, **fields: Any
) -> grpc.RpcMethodHandler:
    """A bidirectional stream with the call's log fields bound for its whole life (the
    tasks it starts inherit them) and a request that does not parse ending the stream
    ``INVALID_ARGUMENT``. The stream's own duration is not observed: the calls it
    carries observe theirs (e.g. ``RuntimeSession``)."""
    inner = handler.stream_stream

    async def checked(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async for request in requests:
            if isinstance(request, _Undecodable):
                await abort(context, _undecodable(request))
            yield request

    async def wrapped(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        token = bind(**fields)
        try:
            async for answer in inner(checked(requests, context), context):
                yield answer
        finally:
            log_context.reset(token)

    return grpc.stream_stream_rpc_method_handler(
        wrapped,
        request_deserializer=_safe_deserializer(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


def server_credentials(
    cert_file: str | None, key_file: str | None
) -> grpc.ServerCredentials | None:
    """TLS credentials from PEM files when both are configured, None when neither is (plaintext).

    Raises:
        MissingSetting: only one of ``GRPC_TLS_CERT_FILE`` / ``GRPC_TLS_KEY_FILE`` is set
            (a half-configured listener must not silently fall back to plaintext).
    """
    if not cert_file and not key_file:
        return None
    if not cert_file or not key_file:
        missing = "GRPC_TLS_CERT_FILE" if not cert_file else "GRPC_TLS_KEY_FILE"
        raise MissingSetting(
            f"refusing to start: {missing} is required when the other TLS file is set (reference §7)"
        )
    return grpc.ssl_server_credentials(
        [(Path(key_file).read_bytes(), Path(cert_file).read_bytes())]
    )


def load_service_descriptors(service_names: Iterable[str]) -> None:
    """Import ``<package>.service_pb2`` of each service so reflection can describe it.

    The generated ``*_pb2_grpc`` modules import only the request/response
    messages, so without this the service's file is missing from the default
    descriptor pool and ``grpcurl describe <Service>`` answers "Symbol not
    found" although ``grpcurl list`` shows the service. Names outside a
    ``zhixi.…`` package with a ``service_pb2`` module are left alone.
    """
    for name in service_names:
        package = name.rpartition(".")[0]
        if package.startswith("zhixi."):
            with contextlib.suppress(ImportError):
                importlib.import_module(f"{package}.service_pb2")


class CannotListen(SystemExit):
    """A gRPC server's address cannot be bound (taken, or no such host); exits with
    one line instead of a traceback."""


class GrpcServer:
    """A grpc.aio server with auth, health and reflection.

    Args:
        token: the internal service token (``RUNTIME_SERVICE_TOKEN``).
        address: listen address, e.g. ``"[::]:50051"``; port 0 picks a free port.
        service_names: full names of the services registered, for reflection and health.
        register: callback adding the servicers to the server.
        tls_cert_file, tls_key_file: optional PEM files for TLS.
        tracing: the service's tracing; None: the process's
            (:func:`airuntime_common.tracing.current`), if any. With tracing, every
            call but health and reflection gets a server span.

    Raises:
        CannotListen: ``address`` cannot be bound (a port in use, an unknown host).
    """

    def __init__(
        self,
        *,
        token: str,
        address: str,
        service_names: Iterable[str],
        register: Callable[[grpc.aio.Server], None],
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tracing: _tracing.Tracing | None = None,
    ) -> None:
        traced = tracing or _tracing.current()
        interceptors: list[Any] = [] if traced is None else traced.server_interceptors()
        # the span's interceptor first: a call the token refuses is traced too
        interceptors.append(InternalAuthInterceptor(token, traced=traced is not None))
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        register(self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        load_service_descriptors(self.service_names)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        creds = server_credentials(tls_cert_file, tls_key_file)
        try:
            if creds is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, creds)
        except RuntimeError as exc:  # grpc: "Failed to bind to address …"
            raise CannotListen(f"refusing to start: cannot listen on {address}: {exc}") from None

    async def start(self) -> None:
        """Start serving and mark every service SERVING."""
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        """Flip the health status of the overall server and every service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace: float = 5.0) -> None:
        """NOT_SERVING, then stop with ``grace`` seconds for in-flight RPCs."""
        await self.set_serving(False)
        await self.server.stop(grace)


def install_stop_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT (for a service's ``main``)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


#: Client service config: calls go round robin over every address the target
#: resolves to (gRPC's ``round_robin`` policy), so several replicas of a service
#: behind one target share the load; one address behaves as ``pick_first``.
ROUND_ROBIN_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


def insecure_or_tls_channel(
    target: str, ca_file: str | None = None, *, tracing: _tracing.Tracing | None = None
) -> grpc.aio.Channel:
    """One channel per backend: TLS when a CA file is configured, else plaintext.

    ``target`` is any gRPC target: ``host:port``, a DNS name with several
    addresses, or a list such as ``ipv4:127.0.0.1:50051,127.0.0.1:50061`` (the
    launcher's ``--job-services N``). Calls are spread round robin over every
    address (:data:`ROUND_ROBIN_SERVICE_CONFIG`); an address that is down is
    skipped until it answers again.

    With ``tracing`` (None: the process's, :func:`airuntime_common.tracing.current`)
    every call but health and reflection gets a client span and carries its
    ``traceparent``; without, the channel has no interceptor at all.
    """
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30000),
        ("grpc.service_config", ROUND_ROBIN_SERVICE_CONFIG),
    ]
    traced = tracing or _tracing.current()
    interceptors = None if traced is None else traced.client_interceptors()
    if ca_file:
        creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
        return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
