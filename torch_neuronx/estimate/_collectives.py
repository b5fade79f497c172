"""Time of a collective on a platform from its size, its group, the algorithm and the topology.

Ranks are numbered as the mesh lays them out (tp innermost): consecutive ranks share a chip, then an
instance. A group's slowest hop sets its bandwidth: cores of one chip (through HBM), NeuronLink between
chips of an instance (trn2: a 4x4 2-D torus — a group within a row or column uses one of the two
dimensions), EFA between instances. Every rank runs the same collective at the same time (SPMD), so a
chip's links are shared by its ranks and an instance's EFA by all of its ranks.

Algorithms: ring (bandwidth-optimal: each rank sends (g-1)/g of the buffer, twice for all-reduce) with
g-1 latency steps, or recursive halving/doubling for power-of-two groups (log2 g steps): the cheaper
of the two, as collective libraries choose.
"""

from __future__ import annotations

import math

from torch_neuronx.estimate._ops import Target


def hop(group: tuple[int, ...], t: Target) -> tuple[float, float, str]:
    """(bytes/s per rank, latency per step in s, "chip" / "link" / "efa") for a group of ranks."""
    lo, hi = min(group), max(group)
    if hi // t.ranks_per_chip == lo // t.ranks_per_chip:
        # Cores of one chip exchange through HBM: each byte is read and written once.
        return min(t.hbm_bw, t.dma_bw) / 2, t.link_latency, "chip"
    if hi // t.ranks_per_instance == lo // t.ranks_per_instance:
        chips = len({r // t.ranks_per_chip for r in group})
        side = max(2, round(t.chips_per_instance ** (1 / t.link_dims)))
        dims = min(t.link_dims, max(1, math.ceil(math.log(chips) / math.log(side) - 1e-9)))
        return t.link_bw_chip * dims / t.link_dims / t.ranks_per_chip, t.link_latency, "link"
    if t.efa_bw_instance <= 0:
        return 0.0, t.efa_latency, "efa"
    return t.efa_bw_instance / t.ranks_per_instance, t.efa_latency, "efa"


def collective_seconds(kind: str, nbytes: int, group: tuple[int, ...], t: Target) -> tuple[float, str]:
    """(seconds, hop) of one collective of ``kind`` moving ``nbytes`` (the full buffer) over ``group``."""
    g = len(group)
    if g <= 1 or nbytes <= 0:
        return 0.0, "none"
    bw, lat, where = hop(group, t)
    if bw <= 0:
        from torch_neuronx.estimate._errors import EstimateError

        raise EstimateError(f"{t.name}: the plan needs more than one {t.instance}, and the platform model has no "
                            "network between instances for it; use a plan that fits one instance")
    steps_ring = g - 1
    steps_tree = math.ceil(math.log2(g))
    frac = (g - 1) / g
    if kind == "all_reduce":
        data = 2 * frac * nbytes / bw
        steps = 2 * min(steps_ring, steps_tree)
    elif kind in ("all_gather", "reduce_scatter"):
        data = frac * nbytes / bw
        steps = min(steps_ring, steps_tree)
    elif kind == "all_to_all":
        data = frac * nbytes / bw
        steps = steps_ring  # every pair exchanges
    elif kind == "broadcast":
        data = nbytes / bw
        steps = steps_tree
    else:  # send / recv
        data = nbytes / bw
        steps = 1
    return data + steps * lat, where
