"""Built-in benchmark cases, one module per family (importing one registers its cases). Every
module in this folder is loaded, so a new case file needs no edit here."""
import importlib
import pkgutil

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_m}")
