"""The extend plans' host copies of a batch's lengths (attention.extend_plan, mla.extend_plan):
`host_copies` checks the caller's copies at the public boundary, `host_lengths` gives a plan
factory its int64 arrays (the copies, or the tensors read once)."""
from __future__ import annotations

import numpy as np
import torch


def host_copies(host_qo_indptr, host_seq_lens, batch):
    """extend_plan's optional host copies of qo_indptr / seq_lens (lists, numpy arrays or CPU
    tensors of ints) as int64 numpy arrays [batch + 1] / [batch], or None when neither is
    given. Only their lengths are checked: comparing them with the device tensors would read
    those (a sync), which is what they are there to avoid."""
    if host_qo_indptr is None and host_seq_lens is None:
        return None
    if host_qo_indptr is None or host_seq_lens is None:
        raise ValueError("host_qo_indptr, host_seq_lens: pass both host copies or neither")
    out = []
    for name, h, n in (("host_qo_indptr", host_qo_indptr, batch + 1),
                       ("host_seq_lens", host_seq_lens, batch)):
        if isinstance(h, torch.Tensor):
            if h.device.type != "cpu":
                raise ValueError(f"{name}: a host copy (list, numpy array or CPU tensor), got "
                                 f"a tensor on {h.device}")
            h = h.numpy()
        a = np.asarray(h)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{name}: expected {n} values (batch {batch}), got shape "
                             f"{tuple(a.shape)}")
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integers, got dtype {a.dtype}")
        out.append(a.astype(np.int64, copy=False))
    return tuple(out)


def host_lengths(qo_indptr, seq_lens, host_qo_indptr=None, host_seq_lens=None):
    """An extend plan's (qo_indptr, seq_lens) as int64 numpy arrays: the host copies when
    given (extend_plan passes them; no device read), else the tensors read in one copy (one
    sync when they are on a device)."""
    if host_qo_indptr is not None and host_seq_lens is not None:
        return (np.asarray(host_qo_indptr, dtype=np.int64).reshape(-1),
                np.asarray(host_seq_lens, dtype=np.int64).reshape(-1))
    both = torch.cat((qo_indptr, seq_lens)).cpu().numpy().astype(np.int64)
    return both[:qo_indptr.shape[0]], both[qo_indptr.shape[0]:]
