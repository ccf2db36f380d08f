"""A local stand-in for DeepSeek's chat-completions API, with fault injection.

Used only where configured explicitly — the launcher's dev mode, the demo and
tests (reference §5) — never as a fallback for a missing platform key.

Run it as ``python -m model_standin --host 127.0.0.1 --port 8600`` (or, one port
per provider, ``--providers deepseek=8600,backup=8601:backup-chat``), or
in-process::

    from model_standin import run_standin

    async with run_standin(port=0) as standin:
        standin.add_faults([{"kind": "status", "status": 503}])
        ... point the DeepSeek client at standin.base_url ...
"""

from model_standin.faults import Fault, FaultBook, error_body
from model_standin.providers import ProviderSpec, run_standins
from model_standin.server import StandIn, key_fingerprint, run_standin

__all__ = [
    "Fault",
    "FaultBook",
    "ProviderSpec",
    "StandIn",
    "error_body",
    "key_fingerprint",
    "run_standin",
    "run_standins",
]
