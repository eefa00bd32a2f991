"""The operator's CLI, ``llmgw``.

- ``llmgw up``: a whole local cluster (etcd, control, router, agents with
  simulated GPUs, a demo model) in one command; see :mod:`.localcluster`.
- ``llmgw status | models | nodes | replicas``: read the cluster through the
  control plane's AdminService (see :mod:`.admin`).
"""
