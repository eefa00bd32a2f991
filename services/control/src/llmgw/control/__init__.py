"""llmgw control plane: catalog, inventory, placement, reconcile, autoscaling, leadership.

Packages name the layers (controller-runtime's layout as vocabulary); each
package's docstring says what lives there. Imports go one way only, down
this list (tests/unit/control/test_layers.py holds every module to it):

- :mod:`.spec`: what operators declare (the model document, the catalog,
  and the load check of a model's weights). Data and validation; imports
  nothing else of the control plane.
- :mod:`.state`: soft state in the leader's memory (inventory, node weights,
  the usage book), rebuilt from agents and routers after a restart. Imports
  :mod:`.spec`.
- :mod:`.store`: what is kept in etcd (runtime models, replica records, node
  overrides, cluster settings, watch hubs mirroring published prefixes).
  Imports :mod:`.spec`, :mod:`.state`'s types and :mod:`.config`.
- :mod:`.decide`: the pure decisions (placement, reconcile, autoscale):
  functions of state, no I/O, called directly by tests and benchmarks.
  Imports :mod:`.spec`, :mod:`.state` and :mod:`.store`'s record types.
- :mod:`.leader`: leadership and the leader's duties for a term (the
  controller, applying a pass's actions, publishing, the scaler). Imports
  every layer above it in this list, and :mod:`.metrics`.
- :mod:`.api`: one gRPC servicer module per proto service, plus the
  authorization interceptor. Servicers translate and delegate; policy lives
  below them. Imports every layer above it, never another servicer's
  wiring.
- :mod:`.http`: the HTTP port (admin REST API transcoded from the protos,
  the web console, metrics). At the api layer, beside :mod:`.api`: it
  calls the servicers and interceptors the wiring hands it, and imports
  neither :mod:`.api` nor is imported by it.
- Top level: :mod:`.main` (entry point), :mod:`.controlplane` (one control
  plane assembled), :mod:`.config` (the machine's configuration file),
  :mod:`.metrics` (Prometheus collectors).

Where a new feature goes: a new proto service gets a module in ``api/``
(and, if operators call it, ``google.api.http`` rules in proto/ and a name
in :data:`.http.transcode.ADMIN_SERVICES`); a
new kind of record in etcd gets one in ``store/``; a new rule of what should
run where goes into ``decide/`` as a pure function with its test; something
only the leader does during its term goes into ``leader/``.
"""
