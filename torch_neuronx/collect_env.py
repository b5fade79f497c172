"""``python -m torch_neuronx.collect_env``: is the neuron device usable from PyTorch?

Prints versions, the simulated platform, the visible devices and their memory, the
relevant environment variables, and runs a smoke test (allocate, compute, compare with
CPU). Exits non-zero when the device is not usable, so CI can rely on it.
"""

from __future__ import annotations

import os
import platform as _platform
import sys
import traceback

ENV_VARS = (
    "NEURON_PLATFORM",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES",
    "NEURON_DEVICE_MEMORY",
    "NEURON_LAUNCH_BLOCKING",
    "TORCH_NEURONX_FALLBACK_POLICY",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _smoke_test() -> list[str]:
    """Allocate, compute and compare with CPU on every visible device; returns problems."""
    import torch

    problems = []
    for i in range(torch.neuron.device_count()):
        dev = torch.device("neuron", i)
        try:
            g = torch.Generator().manual_seed(1234 + i)
            a = torch.randn(64, 48, generator=g)
            b = torch.randn(48, 32, generator=g)
            na, nb = a.to(dev), b.to(dev)
            out = (torch.relu(na @ nb) + na.sum()).softmax(-1)
            ref = (torch.relu(a @ b) + a.sum()).softmax(-1)
            if out.device != dev:
                problems.append(f"neuron:{i}: result landed on {out.device}")
            elif not torch.allclose(out.cpu(), ref, atol=1e-5, rtol=1e-4):
                problems.append(f"neuron:{i}: result differs from CPU by {(out.cpu() - ref).abs().max().item():.3e}")
        except Exception as e:  # noqa: BLE001 - report every failure mode
            problems.append(f"neuron:{i}: {type(e).__name__}: {e}")
    return problems


def main() -> int:
    lines: list[str] = []
    say = lines.append
    ok = True
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"torch could not be imported: {e}")
        return 2
    say(f"PyTorch version:            {torch.__version__}")
    try:
        import torch_neuronx
        from torch_neuronx import _build_info, _C
    except Exception as e:  # noqa: BLE001
        say(f"torch-neuronx:              not importable: {type(e).__name__}: {e}")
        print("\n".join(lines))
        return 1
    say(f"torch-neuronx version:      {torch_neuronx.__version__}")
    say(f"built against torch:        {_build_info.torch_version}")
    say(f"built with compiler:        {_build_info.compiler}")
    say(f"Python:                     {sys.version.split()[0]} ({_platform.machine()}, {_platform.system()})")
    for mod in ("transformers", "accelerate", "numpy"):
        try:
            m = __import__(mod)
            say(f"{mod + ':':<28}{m.__version__}")
        except ImportError:
            say(f"{mod + ':':<28}not installed")
    say("")
    say("Device: NeuronCore simulator (device memory is host memory owned by the C++ runtime)")
    err = _C._config_error()
    if err:
        say(f"configuration error:        {err}")
        ok = False
    else:
        p = torch.neuron.get_platform()
        say(f"platform:                   {p['platform']} ({p['core']}), LNC={p['lnc']}, "
            f"{p['logical_cores_per_chip']} logical cores per chip")
        say(f"chip HBM:                   {_gib(p['hbm_per_chip'])}, {p['hbm_tbps']} TB/s; "
            f"BF16 {p['bf16_tflops']} TFLOPS, FP32 {p['fp32_tflops']} TFLOPS, FP8/MX: "
            f"{'yes' if p['supports_fp8'] else 'no (trn3 only)'}")
        say(f"execution:                  synchronous (NEURON_LAUNCH_BLOCKING={int(p['launch_blocking'])})")
        n = torch.neuron.device_count()
        say(f"visible devices:            {n}")
        for i in range(n):
            props = torch.neuron.get_device_properties(i)
            say(f"  neuron:{i}  {props.name}, logical core {props.logical_core} (physical {props.physical_cores}), "
                f"memory {_gib(props.total_memory)} ({p['memory_source']})")
        if n == 0:
            say("  no devices are visible: check NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES")
            ok = False
    say(f"torch.accelerator:          {torch.accelerator.current_accelerator()}")
    say(f"autoload entry point:       {'on' if os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD', '1') != '0' else 'off'}")
    say(f"fallback policy:            {torch.neuron.get_fallback_policy()}")
    say("")
    say("Environment:")
    for var in ENV_VARS:
        say(f"  {var}={os.environ[var]}" if var in os.environ else f"  {var} (unset)")
    say("")
    if ok:
        try:
            problems = _smoke_test()
        except Exception:  # noqa: BLE001
            problems = [traceback.format_exc()]
        if problems:
            ok = False
            say("Smoke test: FAILED")
            lines.extend(f"  {p}" for p in problems)
        else:
            say(f"Smoke test: passed on {torch.neuron.device_count()} device(s) (matmul, relu, sum, softmax vs CPU)")
    say("")
    say("neuron device is usable" if ok else "neuron device is NOT usable")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
