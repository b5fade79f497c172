"""vLLM's own serving benchmark (``vllm bench serve``, random prompts) against ``vllm serve`` on
``neuron`` and, where the host can run vLLM's compiled CPU kernels (AVX-512), against vLLM's CPU
backend in the same run: request throughput, TTFT and TPOT per concurrency (``make bench-serve``,
docs/serving.md). The model is the tiny Llama of ``make serve``, made in code.

Run in the main environment; the servers and the benchmark client run in .venv/serve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / ".venv" / "serve"


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join(p for p in [str(SERVE), env.get("PYTHONPATH", "")] if p),
                "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _vllm(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]


def run_backend(backend: str, model: Path, args, workdir: Path) -> list[dict]:
    port = _free_port()
    extra = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"} if backend == "cpu" else {}
    log = open(workdir / f"server-{backend}.log", "w")
    server = subprocess.Popen(
        _vllm("serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
              "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory-bytes", str(64 << 20)),
        env=_env(**extra), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise SystemExit(f"{backend} server exited with {server.returncode}; see {log.name}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{backend} server not ready after 600 s; see {log.name}")
            time.sleep(1)
        rows = []
        for c in args.concurrency:
            name = f"{backend}-c{c}.json"
            subprocess.run(
                _vllm("bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
                      "--model", "tiny", "--tokenizer", str(model), "--dataset-name", "random",
                      "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                      "--num-prompts", str(args.num_prompts), "--max-concurrency", str(c), "--ignore-eos",
                      "--seed", "0", "--disable-tqdm", "--save-result", "--result-dir", str(workdir),
                      "--result-filename", name),
                env=_env(), check=True, stdout=subprocess.DEVNULL, timeout=1800)
            r = json.loads((workdir / name).read_text())
            rows.append({"backend": backend, "concurrency": c, "request_throughput": r["request_throughput"],
                         "output_throughput": r["output_throughput"], "mean_ttft_ms": r["mean_ttft_ms"],
                         "mean_tpot_ms": r["mean_tpot_ms"]})
        return rows
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()


def estimated_rows(model: Path, args, platforms: str = "trn2,trn3") -> list[dict]:
    """The performance model's TTFT and TPOT for the same model and request shapes on Trainium
    (torch_neuronx.estimate, full size on fake tensors, bf16 as served there, one logical core): TTFT is
    the prefill of ``concurrency`` prompts of ``input_len`` tokens batched together (every request of a
    wave arriving at once), TPOT a decode step of ``concurrency`` sequences at the mean context
    (prompt + half the output)."""
    from transformers import AutoConfig

    import torch_neuronx.estimate as estimate

    config = AutoConfig.from_pretrained(model)
    rows = []
    for c in args.concurrency:
        prefill = estimate(config, task="prefill", batch=c, seq=args.input_len, platforms=platforms)
        decode = estimate(config, task="decode", batch=c, seq=args.input_len + args.output_len // 2,
                          platforms=platforms)
        for name in prefill.results:
            ttft, tpot = prefill.results[name].step_time_s, decode.results[name].step_time_s
            request = ttft + tpot * (args.output_len - 1)  # one wave of c requests, start to last token
            rows.append({"backend": f"{name} (estimated)", "concurrency": c, "request_throughput": c / request,
                         "output_throughput": c * args.output_len / request, "mean_ttft_ms": ttft * 1e3,
                         "mean_tpot_ms": tpot * 1e3})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    if not (SERVE / "vllm").is_dir():
        raise SystemExit(f"vLLM is not installed in {SERVE}: run `make serve-deps`")

    from torch_neuronx.vllm.tiny_models import build

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        workdir = Path(tmp)
        model = build(workdir / "tiny-llama", "llama")
        rows = run_backend("neuron", model, args, workdir)
        if _has_avx512():
            rows += run_backend("cpu", model, args, workdir)
        else:
            print("vLLM's CPU backend skipped: its compiled kernels need AVX-512, this host has none")
        rows += estimated_rows(model, args)
    print(f"\ntiny Llama, {args.num_prompts} random prompts of {args.input_len} tokens, {args.output_len} "
          "output tokens each\n")
    print("| backend | concurrency | requests/s | output tokens/s | mean TTFT (ms) | mean TPOT (ms) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['concurrency']} | {r['request_throughput']:.3g} | "
              f"{r['output_throughput']:.3g} | {r['mean_ttft_ms']:.3g} | {r['mean_tpot_ms']:.3g} |")
    cpu = {r["concurrency"]: r for r in rows if r["backend"] == "cpu"}
    for r in rows:
        if r["backend"] == "neuron" and r["concurrency"] in cpu:
            ratio = r["request_throughput"] / cpu[r["concurrency"]]["request_throughput"]
            print(f"neuron / cpu request throughput at concurrency {r['concurrency']}: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
