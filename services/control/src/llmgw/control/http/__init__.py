"""The control plane's HTTP port: the admin REST API, the web console, the fleet metrics.

It sits at the api layer, beside :mod:`llmgw.control.api`, and imports no
servicer: :mod:`llmgw.control.controlplane` hands it the same registrations
and interceptors it gives the gRPC server.

- :mod:`.transcode`: JSON over HTTP mapped from the ``google.api.http``
  annotations in proto/, one generic transcoder (protobuf's json_format).
  Calls run **in-process**, not over a loopback gRPC channel: the servicer's
  method handler is found the way grpc finds it (the generated
  ``add_*_to_server`` registers into a recorder), then the gRPC server's own
  interceptors are applied to it, so there is one authorization path, the
  interceptors', for both ports (the admin token today; whatever identities
  the interceptors learn tomorrow see an HTTP call as metadata plus a peer
  without a TLS identity). A loopback channel would have cost a second
  serialization and a client identity for the control plane to hold.
- :mod:`.session`: who an HTTP caller is. ``Authorization: Bearer TOKEN``
  (scripts) is passed to the interceptors as the same gRPC metadata; the
  console's login turns the admin token into a session cookie (HttpOnly,
  SameSite=Strict, signed with the token so every control plane accepts it
  and a new token ends every session) and every change made with the cookie
  also needs the session's CSRF token in a header.
- :mod:`.events`: server-sent events for the console, fed by the watch hubs.
- :mod:`.openapi`: the OpenAPI 3 document, generated from the same protos.
- :mod:`.app`: the aiohttp application and its server; deny by default:
  only ``/healthz``, the login call and the console's static files (no
  data in them) are open. A control plane without an admin token serves
  neither the API nor the console on HTTP (the gRPC port stays open as
  before, with its warning): a browser-reachable admin API with no
  credential could be driven by any web page the operator visits.
"""
