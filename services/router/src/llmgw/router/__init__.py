"""llmgw router: the OpenAI-compatible HTTP data plane.

Layout (each module's docstring records its decisions):

- :mod:`.main`: the ``llmgw-router`` entry point; :mod:`.flags`: the
  command line over the configuration file (:mod:`.config`).
- :mod:`.app`: the aiohttp application (``build_app``), with the routes
  other than the proxied paths in :mod:`.routes`; :mod:`.server`: the app
  on a real socket (``RouterServer``), for the entry point, tests and
  benchmarks.
- :mod:`.front`: the HTTP/1.1 server on the port (llhttp through
  httptools): :mod:`.frontconn` one connection, :mod:`.frontrules` what it
  refuses, :mod:`.frontwire` its request, streams and heads;
  :mod:`.seam`: the ``ProxyRequest`` / ``Responder`` Protocols both servers
  implement; :mod:`.upstream` and :mod:`.upstream_wire`: the client to
  engines.
- :mod:`.apis`: the APIs forwarded (paths, catalog names, how each
  stream ends and whether it resumes), data the proxy, the keys and the
  stream relay read.
- :mod:`.proxy`: one request forwarded to an engine, retried before the
  first byte and resumed after it; :mod:`.forward`: one attempt on one
  endpoint; :mod:`.clientstream`: the client's side of a streamed answer;
  :mod:`.body`: what the router reads of an OpenAI body; :mod:`.errors`:
  the one mapping to OpenAI error bodies.
- :mod:`.table`: models and endpoints (cluster layer + static layer) and the
  live state per endpoint; :mod:`.watch`: the control-plane watch that feeds
  the cluster layer; :mod:`.balancer` and :mod:`.breaker`: endpoint choice.
- :mod:`.metrics`: Prometheus series on a per-app registry.

Stateless by design: everything here is rebuilt from the control plane (or
the configuration) at start, and the last table keeps serving while every
control plane is down.
"""
