"""torch.compile on neuron: compiled neuron vs eager neuron vs Inductor on the CPU, and compile time.

    make bench-compile        # = .venv/bin/python benchmarks/compile.py

One run measures everything and rewrites the compile section of docs/performance.md:
- a training step (forward, loss backward, AdamW) of a ~30M-parameter Llama, batch 4 x 128;
- a batch-1 decode step of the same model, one token appended to a static KV cache after a 128-token prompt;
- cold and warm compile time of a 2-layer Llama forward + backward, each in a fresh process
  (cold: an empty Inductor cache directory; warm: the same directory again).
Step times are medians; the three variants alternate step by step so that the machine's noise
hits them alike. Ratios come from the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
MARK_START = "<!-- bench:compile:start -->"
MARK_END = "<!-- bench:compile:end -->"


def llama(layers: int, hidden: int, inter: int, vocab: int, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
                      pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device)


def bench_30m_config():
    return dict(layers=6, hidden=512, inter=1376, vocab=8000)


def time_alternating(fns: dict, steps: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        for f in fns.values():
            f()
    times = {k: [] for k in fns}
    for _ in range(steps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def training(steps: int) -> dict:
    cfg = bench_30m_config()
    ids = torch.randint(1, cfg["vocab"], (4, 128))
    variants = {}
    for name, device, compiled in (("eager neuron", "neuron", False), ("compiled neuron", "neuron", True),
                                   ("Inductor CPU", "cpu", True)):
        model = llama(**cfg, device=device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fwd = torch.compile(model, backend="neuron" if device == "neuron" else "inductor") if compiled else model
        x = ids.to(device)

        def step(fwd=fwd, opt=opt, x=x, device=device):
            loss = fwd(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "neuron":
                torch.neuron.synchronize()

        variants[name] = step
    params = sum(p.numel() for p in llama(**cfg, device="meta").parameters())
    return {"params": params, "times": time_alternating(variants, steps, warmup=2)}


def decode(steps: int) -> dict:
    from transformers import StaticCache

    cfg = bench_30m_config()
    variants = {}
    for name, device, compiled in (("eager neuron", "neuron", False), ("compiled neuron", "neuron", True),
                                   ("Inductor CPU", "cpu", True)):
        model = llama(**cfg, device=device).eval()
        cache = StaticCache(config=model.config, max_cache_len=128 + 3 + steps)  # prompt, warm-up, timed steps
        prompt = torch.randint(1, cfg["vocab"], (1, 128), device=device)
        with torch.no_grad():
            model(input_ids=prompt, cache=cache)
        fwd = torch.compile(model.forward, backend="neuron" if device == "neuron" else "inductor") if compiled \
            else model.forward
        tok = torch.randint(1, cfg["vocab"], (1, 1), device=device)

        # Each step appends one token to the static cache (its position comes from the cache's length).
        def step(fwd=fwd, tok=tok, cache=cache, device=device):
            with torch.no_grad():
                fwd(input_ids=tok, cache=cache)
            if device == "neuron":
                torch.neuron.synchronize()

        variants[name] = step
    return {"times": time_alternating(variants, steps, warmup=3)}


_COMPILE_CHILD = textwrap.dedent(
    """
    import json, sys, time, torch, torch_neuronx
    sys.path.insert(0, sys.argv[1])
    from compile import llama
    model = llama(layers=2, hidden=256, inter=688, vocab=4000, device="neuron")
    ids = torch.randint(1, 4000, (2, 64), device="neuron")
    def step(m):
        m(input_ids=ids, labels=ids).loss.backward()
        torch.neuron.synchronize()
    step(model)  # eager once: one-time costs outside the measurement
    t = time.perf_counter(); step(model); eager = time.perf_counter() - t
    # Importing the compiler stack is a once-per-process cost, reported apart from compiling.
    t = time.perf_counter()
    import torch._dynamo, torch._inductor.compile_fx
    imports = time.perf_counter() - t
    torch.neuron.reset_dynamo_metrics()
    c = torch.compile(model, backend="neuron")
    t = time.perf_counter(); step(c); first = time.perf_counter() - t
    m = torch.neuron.get_dynamo_metrics()
    print(json.dumps(dict(first_call=first, eager=eager, imports=imports, hits=m.cache_hits, misses=m.cache_misses)))
    """
)


def compile_times() -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=d)
        out = {}
        for which in ("cold", "warm"):
            p = subprocess.run([sys.executable, "-c", _COMPILE_CHILD, str(Path(__file__).parent)], env=env,
                               capture_output=True, text=True, timeout=1200, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["compile"] = r["first_call"] - r["eager"]
            out[which] = r
        return out


def fmt(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.1f} s"


def section(train: dict, dec: dict, comp: dict, info: dict) -> str:
    t, d = train["times"], dec["times"]
    rows = [
        ("training step, compiled neuron / Inductor CPU", t["compiled neuron"] / t["Inductor CPU"], "≤ 1.02"),
        ("training step, compiled / eager neuron", t["compiled neuron"] / t["eager neuron"], "—"),
        ("decode step, compiled neuron / Inductor CPU", d["compiled neuron"] / d["Inductor CPU"], "≤ 1.02"),
        ("decode step, eager / compiled neuron (speed-up)", d["eager neuron"] / d["compiled neuron"], "≥ 1.3"),
    ]
    lines = [
        MARK_START,
        "## torch.compile",
        "",
        "<!-- Generated by benchmarks/compile.py: rerun it rather than editing between the markers. -->",
        "",
        "Reproduce: `make bench-compile` (= `.venv/bin/python benchmarks/compile.py`; several minutes).",
        "",
        f"Measured {info['date']} on {info['cpu']}, {info['threads']} threads, torch {info['torch']}. "
        f"Model: Llama, {train['params'] / 1e6:.1f}M parameters (6 layers, hidden 512). Training step: "
        "batch 4 × 128 tokens, forward + loss backward + AdamW. Decode step: batch 1, one token appended to "
        "a static KV cache holding a 128-token prompt and the steps before it. The three variants alternate step by step; medians. Load average "
        f"{info['load_start']:.1f} at the start, {info['load_end']:.1f} at the end (other processes share the "
        "2 cores: compile times grow with it; the same-run ratios much less).",
        "",
        "| step | eager neuron | compiled neuron | Inductor CPU |",
        "|---|---:|---:|---:|",
        f"| training | {fmt(t['eager neuron'])} | {fmt(t['compiled neuron'])} | {fmt(t['Inductor CPU'])} |",
        f"| decode | {fmt(d['eager neuron'])} | {fmt(d['compiled neuron'])} | {fmt(d['Inductor CPU'])} |",
        "",
        "| ratio | measured | target |",
        "|---|---:|---|",
        *[f"| {name} | {v:.2f} | {tgt} |" for name, v, tgt in rows],
        "",
        "Compile time of a 2-layer Llama (hidden 256) forward + backward, each in a fresh process: the first "
        "compiled call minus an eager call. Importing torch's compiler stack (Dynamo, Inductor) is a "
        f"once-per-process cost measured apart: {fmt(comp['cold']['imports'])} cold, "
        f"{fmt(comp['warm']['imports'])} warm.",
        "",
        "| | compile time | cache hits / misses | target |",
        "|---|---:|---:|---|",
        f"| cold (empty Inductor cache) | {fmt(comp['cold']['compile'])} | "
        f"{comp['cold']['hits']} / {comp['cold']['misses']} | ≤ 60 s |",
        f"| warm (second process, same cache) | {fmt(comp['warm']['compile'])} | "
        f"{comp['warm']['hits']} / {comp['warm']['misses']} | ≤ 5 s |",
        MARK_END,
    ]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if MARK_START in doc:
        a, b = doc.index(MARK_START), doc.index(MARK_END) + len(MARK_END)
        doc = doc[:a] + text + doc[b:]
    else:
        doc = doc.rstrip() + "\n\n" + text + "\n"
    DOC.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant (default 10)")
    ap.add_argument("--no-doc", action="store_true", help="print only; do not rewrite docs/performance.md")
    a = ap.parse_args()
    import torch_neuronx  # noqa: F401

    info = dict(date=datetime.date.today().isoformat(), cpu=platform.processor() or platform.machine(),
                threads=torch.get_num_threads(), torch=torch.__version__, load_start=os.getloadavg()[0])
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    train = training(a.steps)
    print("training", json.dumps(train))
    dec = decode(a.steps * 5)
    print("decode", json.dumps(dec))
    comp = compile_times()
    print("compile", json.dumps(comp))
    info["load_end"] = os.getloadavg()[0]
    text = section(train, dec, comp, info)
    print(text)
    if not a.no_doc:
        write_doc(text)


if __name__ == "__main__":
    main()
