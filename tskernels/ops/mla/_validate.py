"""What the MLA family's hand-written CUDA backends share (sm_90 wgmma and sm_100 tcgen05
builds of the absorbed-MLA decode): the problem they are written for and its registry traits.
Backends import these from here, never from each other."""
from __future__ import annotations

DC, DR = 512, 64       # latent (kv_lora_rank) and rope widths of the DeepSeek-V3 / Kimi-K2 cache
LOG2E = 1.4426950408889634
PAGE_SIZES = (64, 128, 256)
MAX_HEADS = 1024
MAX_AUTO_SPLITS = 128

CUDA_TRAITS = {"kv_lora_rank": lambda r: r == DC, "rope_dim": lambda r: r == DR,
               "page_size": lambda p: p in PAGE_SIZES,
               "num_heads": lambda h: 1 <= h <= MAX_HEADS,
               "cache_like_q": lambda same: same}  # a 16-bit cache of q's dtype, or fp8
