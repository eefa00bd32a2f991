"""Code every llmgw role shares, and nothing role-specific.

- ``llmgw.v1``: the gRPC contract, generated from proto/ (never edited).
- :mod:`.config`: YAML configuration loaded into pydantic models.
- :mod:`.etcd`: the one small interface to the store, and its etcd implementation.
- :mod:`.grpcserver`: a gRPC server with health and reflection always on.
- :mod:`.errors`: the error tree and its mapping to gRPC status codes.
- :mod:`.keys`: engine keys derived from the cluster secret.
- :mod:`.telemetry`: logging and OpenTelemetry set-up, for entry points only.
"""
