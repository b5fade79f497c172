"""make bench-estimate: a full-size Llama-3-70B training step (sequence 8192, TP 32 x PP 8 x DP 4 = 1,024
ranks) estimated on trn2 and trn3 from one traced rank; prints the estimate, the wall time and the peak
memory of this process, and fails when they exceed 60 s / 4 GiB (docs/estimate.md)."""

from __future__ import annotations

import argparse
import resource
import sys
import time

LIMIT_S = 60.0
LIMIT_BYTES = 4 * 2**30


def llama3_70b_config():
    from transformers import LlamaConfig

    # Meta's published Llama-3-70B hyperparameters (config.json of meta-llama/Meta-Llama-3-70B).
    return LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                       num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       bos_token_id=128000, eos_token_id=128001)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=512, help="global batch in sequences (default 512: 4M tokens)")
    p.add_argument("--json", help="also write the estimate as JSON")
    a = p.parse_args()
    start = time.perf_counter()
    import torch_neuronx

    est = torch_neuronx.estimate(llama3_70b_config(), task="train", batch=a.batch, seq=8192, tp=32, pp=8, dp=4,
                                 fsdp=True, recompute=True, platforms="trn2,trn3,h100", name="Llama-3-70B", progress=True)
    took = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(est)
    if a.json:
        est.write_json(a.json)
    print(f"\nbench-estimate: {took:.1f} s wall time (limit {LIMIT_S:.0f} s), peak RSS {peak / 2**30:.2f} GiB "
          f"(limit {LIMIT_BYTES / 2**30:.0f} GiB), 1,024 ranks traced as one")
    ok = took <= LIMIT_S and peak <= LIMIT_BYTES
    if not ok:
        print("bench-estimate: FAILED the limits", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
