"""Op families (one folder each, named in `tskernels_ref.FAMILIES`); importing one registers
its backends."""
import importlib

from tskernels_ref import FAMILIES

for _family in FAMILIES:
    importlib.import_module(f".{_family}", __name__)
