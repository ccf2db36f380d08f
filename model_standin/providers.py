"""Several providers at once: one stand-in per provider, each on its own port
(reference §9.4, case P6).

Each :class:`~model_standin.server.StandIn` keeps its own faults, statistics and
record of the keys and models it was sent, so a test or the demo can make one
provider fail while another answers, and check that no key reached another
provider.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from model_standin.server import StandIn


@dataclass(frozen=True)
class ProviderSpec:
    """One provider a stand-in plays: its name, port and the models it serves.

    Attributes:
        name: the provider's name (as in ``MODEL_PROVIDERS``).
        port: TCP port; 0 picks a free one.
        models: the model names served exactly; None: DeepSeek's.
    """

    name: str
    port: int = 0
    models: tuple[str, ...] | None = None

    @classmethod
    def parse_list(cls, text: str) -> list[ProviderSpec]:
        """``name=port[:model+model…][,name=port…]`` (``--providers``) as specs.

        Raises:
            ValueError: a malformed entry, a port out of 0..65535 or a name twice.
        """
        specs: list[ProviderSpec] = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, sep, rest = part.partition("=")
            port_text, _, model_text = rest.partition(":")
            name = name.strip()
            if not sep or not name or not port_text.strip().isdigit():
                raise ValueError(f"expected name=port[:model+model], got {part!r}")
            port = int(port_text)
            if port > 65535:
                raise ValueError(f"port out of range in {part!r}")
            models = tuple(m.strip() for m in model_text.split("+") if m.strip()) or None
            specs.append(cls(name, port, models))
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("each provider is named once")
        return specs


@contextlib.asynccontextmanager
async def run_standins(
    providers: Mapping[str, Mapping[str, Any]] | Sequence[ProviderSpec],
    host: str = "127.0.0.1",
    **options: Any,
) -> AsyncIterator[dict[str, StandIn]]:
    """Run one stand-in per provider, each on its own port, for the block.

    Each has its own faults, statistics and :meth:`StandIn.seen` record, so a test
    (or the demo) can make the primary answer 503 while the secondary answers::

        async with run_standins({"primary": {}, "backup": {"models": ["b-chat"]}}) as s:
            s["primary"].add_faults([{"kind": "status", "status": 503, "count": 100}])
            ... MODEL_PROVIDERS with s["primary"].base_url, s["backup"].base_url ...

    Args:
        providers: ``{name: {"port": n, "models": [...], "faults": [...], …}}`` (any
            :class:`StandIn` option per provider) or :class:`ProviderSpec` entries.
        host: interface to bind.
        **options: :class:`StandIn` options shared by all (``fault_rate``, ``seed``…).

    Yields:
        ``{name: StandIn}``, each started; all stopped on exit.
    """
    if isinstance(providers, Mapping):
        configs = {name: dict(conf) for name, conf in providers.items()}
    else:
        configs = {spec.name: {"port": spec.port, "models": spec.models} for spec in providers}
    servers: dict[str, StandIn] = {}
    try:
        for name, conf in configs.items():
            server = StandIn(host, conf.pop("port", 0), name=name, **{**options, **conf})
            await server.start()
            servers[name] = server
        yield servers
    finally:
        for server in servers.values():
            await server.stop()
