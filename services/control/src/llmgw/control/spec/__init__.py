"""What operators declare: the model document (:mod:`.model`) and the catalog built from it.

Pure data and validation, plus the load check (:mod:`.loadcheck`), which
reads a model's weights files (headers only) to say whether they can run
on its profiles; :mod:`.architectures` is its data. Imports nothing else
of the control plane, so every other layer (and the CLI's documents) may
import it.
"""
