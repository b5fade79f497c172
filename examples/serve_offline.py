"""vLLM's offline API on the `neuron` device: a tiny Llama and its tokenizer are made in code (no
downloads), vLLM's ``LLM`` generates greedily for a batch of prompts and chat messages, and the
tokens are checked against Transformers' ``generate`` on the CPU for the same weights.

It exits non-zero if a check fails. Run with vLLM's environment first on the path (make serve-deps):

    PYTHONPATH=.venv/serve .venv/bin/python examples/serve_offline.py [--family qwen3_moe]
"""

from __future__ import annotations

import argparse
import sys
import tempfile


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="llama", help="llama, qwen3, qwen3_moe, gemma3 or gpt_oss")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from torch_neuronx.vllm.tiny_models import build

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build(f"{tmp}/model", args.family)
        llm = LLM(model=str(model_dir), dtype="float32", max_model_len=256, kv_cache_memory_bytes=16 << 20, seed=0)
        print(f"vLLM platform: {current_platform.device_name} ({current_platform.get_device_name()})")
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        prompts = ["1 2 3 4 5", "count from 10 to 20 please", "hello " + " ".join(str(i) for i in range(40, 80))]
        outs = llm.generate(prompts, params)
        chat = llm.chat([{"role": "user", "content": "7 8 9"}], params)

        tok = AutoTokenizer.from_pretrained(model_dir)
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        ok = True
        for o in outs + chat:
            ids = torch.tensor([o.prompt_token_ids])
            want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                                do_sample=False, eos_token_id=None)[0, ids.shape[1]:].tolist()
            got = list(o.outputs[0].token_ids)
            ok &= got == want
            print(f"{tok.decode(o.prompt_token_ids)!r:.60} -> {o.outputs[0].text!r} "
                  f"{'== Transformers' if got == want else f'!= Transformers {want}'}")
    if not ok:
        sys.exit("vLLM on neuron differs from Transformers on the CPU")
    print("OK: greedy tokens equal Transformers' on the CPU")


if __name__ == "__main__":
    main()
