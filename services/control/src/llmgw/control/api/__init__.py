"""The gRPC surface: one servicer module per proto service, and authorization.

:mod:`.agents` AgentService, :mod:`.watches` the Watch services,
:mod:`.admin` AdminService, :mod:`.settings` SettingsService,
:mod:`.nodes` NodeService and PlacementService, :mod:`.nodeadmin`
NodeAdminService, :mod:`.usage` UsageService, :mod:`.keys` KeyService and
KeyTableService, :mod:`.quota` QuotaService; :mod:`.auth` the interceptor
that denies a caller without the right identity. Servicers translate between
protos and the layers below and map errors to gRPC status; the policy they
apply lives in :mod:`..decide`, :mod:`..store` and :mod:`..leader`.
"""
