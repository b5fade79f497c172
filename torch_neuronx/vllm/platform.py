"""The ``neuron`` platform for vLLM: what vLLM asks a device vendor (device names, memory, the
worker, the attention backend, the communicator), answered from ``torch.neuron``.

vLLM's compiled CPU kernels (``vllm._C``) are never imported: they are built for AVX-512 hosts and
nothing on ``neuron`` needs them (vLLM's layers run their PyTorch-native forwards on out-of-tree
platforms; attention is our own backend).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import torch

import torch_neuronx  # noqa: F401  (registers the device)
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

WORKER = "torch_neuronx.vllm.worker.NeuronWorker"
ATTENTION_BACKEND = "torch_neuronx.vllm.attention.NeuronAttentionBackend"
COMMUNICATOR = "torch_neuronx.vllm.communicator.NeuronCommunicator"
COMPILER = "torch_neuronx.vllm.compiler.NeuronAdaptor"  # vLLM's piecewise pieces

# vLLM names attention backends by enum; out-of-tree backends take the CUSTOM member.
register_backend(AttentionBackendEnum.CUSTOM, ATTENTION_BACKEND)


class NeuronPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "neuron"
    device_type: str = "neuron"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "neuron_cores"
    # One process per logical core; the same variable AWS's runtime reads.
    device_control_env_var: str = "NEURON_RT_VISIBLE_CORES"
    dist_backend: str = "neuron"
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_compile_backend(cls) -> str:
        return COMPILER

    @classmethod
    def import_kernels(cls) -> None:
        # vllm._C is an AVX-512 build of CPU/CUDA kernels (SIGILL on AVX2 hosts); nothing here
        # uses it, so it is never imported.
        return None

    @classmethod
    def import_ir_kernels(cls) -> None:
        return None

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        # The V1 runner computes slot mappings with a Triton kernel; neuron runs a torch version.
        from vllm.triton_utils.dispatcher import register_kernels

        from torch_neuronx.vllm.attention import compute_slot_mapping

        register_kernels({"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping})

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.neuron.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        props = torch.neuron.get_device_properties(device_id)
        return f"neuron-{props.platform}-{device_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.neuron.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        torch.neuron.reset_peak_memory_stats(device)
        return torch.neuron.max_memory_allocated(device)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.neuron.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.neuron.manual_seed_all(seed)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"neuron serves float32, bfloat16 and float16 models, not {dtype}; "
                             "pass --dtype float32, bfloat16 or float16")

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        raise ValueError(f"{quant} quantization is not supported on neuron yet; serve an unquantized "
                         "(float32/bfloat16/float16) checkpoint")

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # Device memory is host memory: there is no host-to-device DMA to pin for.
        return False

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla:
            raise NotImplementedError("MLA attention (DeepSeek-style) is not supported on neuron yet")
        if attn_selector_config.use_sparse:
            raise NotImplementedError("sparse attention is not supported on neuron")
        if selected_backend is not None and selected_backend != AttentionBackendEnum.CUSTOM:
            logger.info("attention backend %s is not available on neuron; using neuron's own",
                        selected_backend.name)
        return ATTENTION_BACKEND

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR

    @classmethod
    def get_punica_wrapper(cls) -> str:
        return "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention runs as one vllm.unified_attention op, so graphs split around it.
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return True

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        return None

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER
        if parallel_config.enable_dbo:
            logger.warning_once("dual-batch overlap is not supported on neuron; disabled")
            parallel_config.enable_dbo = False

        # Our runner subclasses vLLM's V1 GPU model runner.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        # Execution is synchronous on the simulator: nothing to overlap the scheduler with.
        vllm_config.scheduler_config.async_scheduling = False

        # torch.compile through the neuron backend: vLLM's piecewise compilation (VLLM_COMPILE, its
        # default) hands each piece between attention calls to NeuronAdaptor; DYNAMO_TRACE_ONCE
        # (mode 2) compiles the whole traced model with it, attention staying one opaque op. No
        # graph capture (nothing like CUDA graphs on the simulator).
        compilation_config = vllm_config.compilation_config
        model_config = vllm_config.model_config
        eager = model_config is not None and model_config.enforce_eager
        if compilation_config.mode in (CompilationMode.STOCK_TORCH_COMPILE,
                                       CompilationMode.DYNAMO_TRACE_ONCE) and not eager:
            compilation_config.backend = "neuron"
        elif compilation_config.mode == CompilationMode.VLLM_COMPILE and not eager:
            if compilation_config.backend in ("", "inductor"):
                compilation_config.backend = COMPILER
            # No graph-capture sizes are computed on a platform without static graphs, which leaves
            # compile_sizes unset; the piecewise backend needs a list (empty: one dynamic range).
            if compilation_config.compile_sizes is None:
                compilation_config.compile_sizes = []
            # vLLM's fusion passes match CUDA/ROCm kernels (quantization, all-reduce + norm, rope +
            # KV cache); none exists here.
            passes = compilation_config.pass_config
            for field in dataclasses.fields(passes):
                if field.name.startswith(("fuse_", "enable_")):
                    setattr(passes, field.name, False)
        elif compilation_config.mode != CompilationMode.NONE:
            logger.info("neuron runs vLLM models eagerly with enforce_eager or compilation mode %s",
                        compilation_config.mode)
            compilation_config.mode = CompilationMode.NONE
            if model_config is not None:
                model_config.enforce_eager = True
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.cudagraph_capture_sizes = []

        # The device is initialised in each worker; a forked child would inherit a runtime
        # that belongs to its parent.
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        # One stream per device: the shared-experts overlap has nothing to run on.
        os.environ["VLLM_DISABLE_SHARED_EXPERTS_STREAM"] = "1"

        if vllm_config.lora_config is not None:
            raise NotImplementedError("LoRA adapters are not supported on neuron yet")
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("speculative decoding is not supported on neuron yet")
