"""Building blocks shared by several backends (Triton helpers, split-KV merge, plan
values): backends import these, never one another."""
