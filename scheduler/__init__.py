"""Request scheduler for the serving layer (C++ core, nanobind bindings).

    cfg = SchedulerConfig(num_pages=4096, page_size=16, max_running=256, token_budget=2048,
                          max_context=4096, enable_prefix_cache=True, eos_token_ids=[2])
    s = Scheduler(cfg)
    s.submit(7, [1, 5, 9], max_new_tokens=32)
    while s.has_work():
        plan = s.next_plan()            # numpy arrays: input_ids, positions, page_table, ...
        sampled = run_model(plan)       # int32 [len(plan)], read where plan.sample is True
        for request_id, token_id, finish_reason in s.advance(plan, sampled):
            ...

token_array(ids, vocab_size) turns a list of token ids into the int32 array submit() takes
(None when an entry is not an int in range). See scheduler/README.md for the plan layout, the retraction policy and the invariants.
This package does not import torch.
"""
from __future__ import annotations

from ._core import (
    PAGE_CACHED,
    PAGE_FREE,
    PAGE_NULL,
    PAGE_USED,
    InvalidEventError,
    Plan,
    Scheduler,
    SchedulerConfig,
    UnknownRequestError,
    token_array,
)

__all__ = [
    "InvalidEventError",
    "PAGE_CACHED",
    "PAGE_FREE",
    "PAGE_NULL",
    "PAGE_USED",
    "Plan",
    "Scheduler",
    "SchedulerConfig",
    "UnknownRequestError",
    "token_array",
]
