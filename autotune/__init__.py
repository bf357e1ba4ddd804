"""Generic autotuning: declared config spaces, a tuner with an injected timer, versioned
per-device tables with staleness checks, a lookup fallback chain and shape capture. Knows
nothing about specific kernels: kernels declare their spaces here.

    ks = declare(KernelSpace("norm.rmsnorm.triton", Space(num_warps=[4, 8, 16]),
                             key=lambda p: {"N": pow2_bucket(p["N"])},
                             heuristic=lambda p: {"num_warps": 8},
                             source=lambda: _kernel.cache_key))
    choice = choose(ks, {"N": 4096}, device_key())      # exact > nearest > family > heuristic
    choice.config, choice.link, print(choice.explain())

CLI: `python -m autotune list | diff | prune | export | explain | tune` (see __main__.py).
"""
from . import capture
from .cache import Store, default_store, device_key, pow2_bucket
from .declare import (BACKEND_KNOBS, KernelSpace, Runner, Target, backend_options, bucket_str,
                      declare, get_space, jit_source, parse_bucket, spaces)
from .lookup import Choice, Lookup, StaleTableWarning, choose, default_lookup
from .search import Result, search
from .space import Space
from .table import Entry, Table, Tables, current_versions, device_family
from .timer import cpu_timer, cuda_graph_timer, cuda_timer
from .tune import BucketResult, RepeatReport, repeat_report, tune, tune_bucket

__all__ = ["BACKEND_KNOBS", "backend_options", "BucketResult", "Choice", "Entry", "KernelSpace", "Lookup", "RepeatReport", "Result",
           "Runner", "Space", "StaleTableWarning", "Store", "Table", "Tables", "Target",
           "bucket_str", "capture", "choose", "cpu_timer", "cuda_graph_timer", "cuda_timer", "current_versions",
           "declare", "default_lookup", "default_store", "device_family", "device_key",
           "get_space", "jit_source", "parse_bucket", "pow2_bucket", "repeat_report", "search", "spaces",
           "tune", "tune_bucket"]
