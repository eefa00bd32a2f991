"""What is kept in etcd, one module per kind of record.

Runtime models (:mod:`.models`), replica records (:mod:`.replicas`), node
overrides (:mod:`.nodeoverrides`), domain holds (:mod:`.domainholds`), the cluster settings document
(:mod:`.settings`), and the watch hubs that mirror published prefixes in
memory (:mod:`.watchhub`). Each store validates before it writes, so a bad
document is refused and nothing is written. May import :mod:`..spec`,
:mod:`..state`'s types and :mod:`..config`; never the decisions, the API or
the leader's duties.
"""
