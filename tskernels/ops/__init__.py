"""Op families; importing one registers its backends."""
from . import activation, attention, gdn, gemm, kvcache, mla, moe, norm, rope, sampling  # noqa: F401
