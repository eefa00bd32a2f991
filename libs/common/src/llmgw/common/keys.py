"""Engine keys (one per replica, derived from the cluster secret) and client key hashes.

``engine_key(secret, replica_id)`` is an HMAC-SHA256, so every control plane
and every router of a cluster computes the same key for a replica without a
table to share, and a key read off one engine opens no other engine.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from .errors import InvalidArgument

MIN_SECRET_BYTES = 16


def engine_key(secret: bytes, replica_id: str) -> str:
    digest = hmac.new(secret, b"engine-key\x00" + replica_id.encode(), hashlib.sha256)
    return "llmgw-e-" + digest.hexdigest()


def read_secret(path: str | Path) -> bytes:
    """Read the cluster secret from a file, refusing one too short to be safe."""
    p = Path(path)
    try:
        data = p.read_bytes().strip()
    except FileNotFoundError:
        raise InvalidArgument(
            f"cluster secret file {p} does not exist; create it with `head -c 32 /dev/urandom | base64 > {p}`"
        ) from None
    if len(data) < MIN_SECRET_BYTES:
        raise InvalidArgument(f"cluster secret in {p} is {len(data)} bytes; use at least {MIN_SECRET_BYTES}")
    return data


# Client API keys (what clients present to routers) are random, not derived:
# only this hash of one is stored, and routers look a presented key up by it.
CLIENT_KEY_PREFIX = "sk-llmgw-"


def client_key_hash(secret: str) -> str:
    """Hex SHA-256 of a client key; a plain hash suffices for 256 random bits."""
    return hashlib.sha256(secret.encode()).hexdigest()
