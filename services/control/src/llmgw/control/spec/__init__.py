"""What operators declare: the model document (:mod:`.model`) and the catalog built from it,
owners and quotas (:mod:`.tenancy`), facility domains (:mod:`.facility`).

Pure data and validation. Imports nothing else of the control plane, so
every other layer (and the CLI's documents) may import it.
"""
