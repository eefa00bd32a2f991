"""Soft state the leader keeps in memory: nodes as agents report them, their weights, router load.

Nothing here is written to etcd: after a restart or a change of leader it is
rebuilt within a heartbeat from the agents' and routers' reports. May import
:mod:`..spec` and the record types of :mod:`..store`; no I/O of its own.
"""
