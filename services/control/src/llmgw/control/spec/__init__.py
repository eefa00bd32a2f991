"""What operators declare: the model document (:mod:`.model`) and the catalog built from it.

Pure data and validation. Imports nothing else of the control plane, so
every other layer (and the CLI's documents) may import it.
"""
