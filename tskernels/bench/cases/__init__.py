"""Built-in benchmark cases, one module per family (importing registers them)."""
import importlib

for _m in ("norm", "activation", "rope", "store_kv", "attention", "mla", "gemm", "moe", "gdn", "sampling"):
    try:
        importlib.import_module(f"{__name__}.{_m}")
    except ModuleNotFoundError as e:  # a family whose cases are not written yet
        if e.name != f"{__name__}.{_m}":
            raise
