"""Federation on the request path: hops, the origin tag, and the refusal that stops loops.

A peer cluster's model (``PEER/MODEL`` in the catalog, see
``llmgw.control.leader.federation``) is an external model whose provider is
the peer's router: it is routed, retried and broken like any external
provider (:func:`.table.external_endpoint`, endpoint ``peer:<model>``).
What federation adds is here:

- **The hop header.** Every request sent to a peer carries
  ``x-llmgw-hops``: the hops it arrived with plus one. A client's request
  arrives with none (0).
- **The hop limit.** A request that has already crossed ``hop_limit``
  clusters (the cluster setting ``federation.hop_limit``, default 1, sent
  with each peer model) is not sent to a peer again: with the default, a
  request that came from a peer is answered by this cluster's own replicas
  or not at all, so A -> B -> A cannot happen, let alone loop. Peer targets
  are dropped from the request's plan; when nothing else is left the
  client gets a 400 (``hop_limit_reached``) that says so, not a 503 that
  invites a retry.
- **The origin tag.** When the peer asked for tags (``send_tags``), requests
  to it carry ``x-llmgw-origin-cluster: <this cluster>``, so the peer's
  access log (and whatever meters it) sees who sent them. The router
  receiving a tag logs it; it trusts it no further than a header deserves.
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import BadRequest

HOPS_HEADER = "x-llmgw-hops"
ORIGIN_HEADER = "x-llmgw-origin-cluster"
# Far above any sane hop limit; a larger number is refused as malformed.
MAX_HOPS = 64


class HopLimitReached(BadRequest):
    """Every target of a request is a peer, and the request already crossed the hop limit."""

    error_code = "hop_limit_reached"

    def __init__(self, model: str, hops: int, limit: int) -> None:
        super().__init__(
            f"Model {model!r} is served by a peer cluster, and this request has already crossed {hops} "
            f"cluster boundar{'y' if hops == 1 else 'ies'} ({HOPS_HEADER}: {hops}; the limit is {limit}): "
            "it is not forwarded again, so requests cannot loop between clusters. Send it to a cluster "
            "that serves the model itself.",
            "model",
        )


def incoming_hops(headers: Mapping[str, str]) -> int:
    """The clusters a request has crossed (its hop header; 0 without one)."""
    raw = headers.get(HOPS_HEADER)
    if raw is None:
        return 0
    value = raw.strip()
    if not value.isdigit() or len(value) > 3 or int(value) > MAX_HOPS:
        raise BadRequest(f"{HOPS_HEADER} must be a whole number from 0 to {MAX_HOPS}, not {value[:20]!r}")
    return int(value)
