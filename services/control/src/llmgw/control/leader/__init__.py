"""Leadership and the leader's duties for the length of a term.

:mod:`.leadership` elects at most one leader through etcd; while this process
leads, :mod:`.controller` runs reconcile passes, :mod:`.applier` carries out
their actions, :mod:`.publisher` writes what routers may use,
:mod:`.scaler` feeds autoscaling, and :mod:`.fleetmetrics` shows the fleet to
Prometheus. May import every layer below it
(:mod:`..decide`, :mod:`..state`, :mod:`..store`, :mod:`..spec`); never
:mod:`..api`.
"""
