"""`tskernels-bench`: time ops side by side with their torch baselines and the roofline."""
from .core import Bench, register_bench, run_bench  # noqa: F401
