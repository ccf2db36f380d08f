"""credential_service: users' model keys, AES-256-GCM at rest, resolved only for lease holders (reference §6).

Layers: :mod:`.servicer` (proto ↔ domain) → :mod:`.domain` (rules) →
:mod:`.repository` (SQL) and :mod:`.vault` (the AES-GCM keyring).
Run with ``python -m credential_service`` (serve), ``… migrate`` or ``… rotate-keys``.
"""

SERVICE_NAME = "zhixi.airuntime.credential.v1.CredentialService"
