"""Run in the serving environment (.venv/serve first on PYTHONPATH): vLLM's offline ``LLM.generate``
on neuron, greedy, for each job of the JSON file argv[1], one engine after the other in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: importing vLLM once is most of the start-up); prints one
``RESULT {json}`` line per job with the generated token ids of each request, in order.

Job file: [{"model": dir, "engine": {LLM keyword arguments}, "requests":
[{"prompt_token_ids": [...], "max_tokens": n}, ...]}, ...].
"""

import gc
import json
import sys


BACKEND_CALLS = []


def _count_neuron_backend_calls() -> None:
    """Graphs handed to torch.compile's "neuron" backend (looked up by name when vLLM compiles)."""
    from torch_neuronx.compile import _backend

    original = _backend.neuron_backend

    def counting(gm, example_inputs, *args, **kwargs):
        BACKEND_CALLS.append(len(gm.graph.nodes))
        return original(gm, example_inputs, *args, **kwargs)

    _backend.neuron_backend = counting


def main() -> None:
    _count_neuron_backend_calls()
    from vllm import LLM, SamplingParams
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    for job in json.load(open(sys.argv[1])):
        llm = LLM(model=job["model"], seed=0, **job["engine"])
        reqs = job["requests"]
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in reqs]
        params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True) for r in reqs]
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = {}
        if job.get("metrics"):
            stats = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                     if m.name in job["metrics"]}
        print("RESULT " + json.dumps({"model": job["model"], "platform": current_platform.device_type,
                                      "tokens": [list(o.outputs[0].token_ids) for o in outs],
                                      "metrics": stats,
                                      "num_gpu_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
                                      "neuron_backend_calls": len(BACKEND_CALLS)}),
              flush=True)
        del llm, outs
        gc.collect()
        cleanup_dist_env_and_memory()


if __name__ == "__main__":
    main()
