"""CPU simulation of the sampler's plan for top-p alone (why `p0.9` took the fallback on the
H200): candidates the histogram bound keeps vs the true nucleus, per bin layout and per choice
of the per-bin mass bound (lower edge = the shipped rule; midpoint / upper edge would need the
finish kernel to check the candidates' mass and fall back when it is short).

    python benchmarks/sampling_plan_sim.py      (logits randn * 3, temperature 0.8, top-p 0.9)
"""
from __future__ import annotations

import torch

V, ROWS, TOP_P = 151936, 8, 0.9


def main() -> None:
    torch.manual_seed(0)
    s = torch.randn(ROWS, V, dtype=torch.float64) * 3 / 0.8
    m = s.max(-1, keepdim=True).values
    p = (s - m).exp()
    z = p.sum(-1)
    nucleus = ((p.sort(-1, descending=True).values.cumsum(-1) < TOP_P * z[:, None]).sum(-1) + 1)
    print("nucleus sizes:", nucleus.tolist())
    for nb, per_unit in ((256, 8.0), (256, 16.0), (512, 32.0), (32, 2.0)):
        for edge, name in ((1.0, "lower edge (shipped)"), (0.5, "midpoint"), (0.0, "upper edge")):
            b = (torch.floor(m * per_unit) - torch.floor(s * per_unit)).clamp(max=nb - 1).long()
            out = []
            for r in range(ROWS):
                tot = torch.bincount(b[r], minlength=nb).double()
                bound = torch.exp(-(torch.arange(nb) + edge) / per_unit)
                bound[-1] = 0.0
                j = int(((tot * bound).cumsum(0) < TOP_P * z[r]).sum().clamp(max=nb - 1))
                enough = bool(p[r][b[r] <= j].sum() >= TOP_P * z[r])
                out.append(f"{int(tot[:j + 1].sum())}{'' if enough else '(short)'}")
            print(f"bins {nb} x 1/{per_unit:g}, {name:<20}: candidates {' '.join(out)}")


if __name__ == "__main__":
    main()
