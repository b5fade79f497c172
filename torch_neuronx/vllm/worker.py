"""vLLM worker and model runner for ``neuron``: one process per logical NeuronCore.

The model runner is vLLM's own GPU model runner (input batching, block tables, sampling and
logits processing are device-generic torch code); the worker places it on ``neuron:<local rank>``,
sizes the KV cache from ``torch.neuron`` memory statistics and joins the parallel groups over our
``neuron`` c10d backend.
"""

from __future__ import annotations

import atexit
import contextlib
import gc

import torch

import torch_neuronx  # noqa: F401  (registers the device)
import torch_neuronx.vllm.moe  # noqa: F401  (registers the MoE method before models are built)
from vllm.config import VllmConfig
from vllm.distributed.parallel_state import get_pp_group
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes
from vllm.v1.worker.workspace import init_workspace_manager

logger = init_logger(__name__)


@contextlib.contextmanager
def _cuda_names_on_neuron():
    """The GPU model runner creates its copy streams and events with ``torch.cuda.*`` names
    while it is built; point those names at ``torch.neuron`` for that long (as vLLM's XPU runner
    does for ``torch.xpu``) and restore them after."""
    names = ("Stream", "Event", "current_stream", "stream", "default_stream")
    saved = {n: getattr(torch.cuda, n) for n in names}
    try:
        for n in names:
            setattr(torch.cuda, n, getattr(torch.neuron, n))
        yield
    finally:
        for n, v in saved.items():
            setattr(torch.cuda, n, v)


def _release_parallel_groups() -> None:
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

    try:
        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:  # noqa: BLE001 - exiting anyway; a broken group must not mask the exit status
        pass


class NeuronModelRunner(GPUModelRunner):
    """vLLM's GPU model runner on a ``neuron`` device, eager (no graph capture)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        with _cuda_names_on_neuron():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False

    def _sync_device(self) -> None:
        torch.neuron.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        # Execution is synchronous, so no copy event is needed before reading the tokens.
        return sampled_token_ids.tolist()

    def capture_model(self) -> int:
        return 0

    def _init_kv_zero_meta(self) -> None:
        # vLLM's block zeroer is a Triton kernel; _zero_block_ids below zeroes with torch ops.
        return None

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        """Zero newly allocated KV blocks of full-attention layers, so a partly written block
        never holds another request's stale keys."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        if not block_ids:
            return
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        seen: set[int] = set()
        for group in self.kv_cache_config.kv_cache_groups:
            if not isinstance(group.kv_cache_spec, FullAttentionSpec):
                continue
            for name in group.layer_names:
                ctx = self.compilation_config.static_forward_context.get(name)
                kv = getattr(ctx, "kv_cache", None)
                if isinstance(kv, torch.Tensor) and kv.data_ptr() not in seen:
                    seen.add(kv.data_ptr())
                    kv.index_fill_(0, idx, 0)


class NeuronWorker(Worker):
    """A vLLM worker on ``neuron:<local_rank>``."""

    def init_device(self) -> None:
        if self.device_config.device_type != "neuron":
            raise RuntimeError(f"NeuronWorker runs on neuron devices, not {self.device_config.device}")
        n = torch.neuron.device_count()
        if self.local_rank >= n:
            raise RuntimeError(
                f"worker {self.rank} needs neuron:{self.local_rank} but {n} neuron device(s) are visible; "
                "lower --tensor-parallel-size or raise NEURON_RT_NUM_CORES")
        self.device = torch.device("neuron", self.local_rank)
        torch.neuron.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)

        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank,
            current_platform.dist_backend)
        # torch_neuronx destroys the default process group at exit; vLLM's own clean-up (an exit
        # finalizer of the engine) would then destroy its subgroups after their world is gone and
        # fail. Registered later, this runs first and lets vLLM release its groups in order.
        atexit.register(_release_parallel_groups)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.neuron.empty_cache()

        init_workspace_manager(self.device, 1, 1)
        self.model_runner = NeuronModelRunner(self.vllm_config, self.device)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Eager execution has nothing to compile or capture: warm up the sampler at the
        largest batch (as vLLM's GPU worker does) and reset the seed."""
        if get_pp_group().is_last_rank:
            num_reqs = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
            _, last_hidden = self.model_runner._dummy_run(num_tokens=num_reqs, skip_eplb=True)
            if not self.model_runner.is_pooling_model:
                self.model_runner._dummy_sampler_run(hidden_states=last_hidden)
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: a profile run at the largest batch measures the peak of this
        device's allocator; the cache gets ``gpu_memory_utilization`` of the device's capacity
        minus that peak. The simulated device's memory is host memory (shared with the other
        workers and programs of the host), so the cache is also capped at half of what the host
        has available."""
        torch.neuron.reset_peak_memory_stats(self.device)
        self.model_runner.profile_run()
        torch.neuron.synchronize(self.device)
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit:
            logger.info("KV cache: %s GiB (kv_cache_memory_bytes)", format_gib(explicit))
            return int(explicit)
        import psutil  # a vLLM dependency

        peak = torch.neuron.max_memory_allocated(self.device)
        current = torch.neuron.memory_allocated(self.device)
        util = self.cache_config.gpu_memory_utilization
        total = torch.neuron.get_device_properties(self.device).total_memory
        by_device = int(total * util) - peak
        by_host = psutil.virtual_memory().available // 2 - (peak - current)
        available = min(by_device, by_host)
        if available <= 0:
            raise ValueError(
                f"no memory left for the KV cache on {self.device}: peak use {format_gib(peak)} GiB of "
                f"{format_gib(total)} GiB at gpu_memory_utilization={util}; raise "
                "--gpu-memory-utilization or set --kv-cache-memory-bytes")
        logger.info("KV cache: %s GiB (device %s GiB x %.2f, at most half the host's free memory, peak use %s GiB)",
                    format_gib(available), format_gib(total), util, format_gib(peak))
        return available

    def _maybe_get_memory_pool_context(self, tag: str) -> contextlib.AbstractContextManager:
        # vLLM's sleep-mode memory pools are CUDA/XPU allocators; neuron allocates plainly.
        return contextlib.nullcontext()

    def sleep(self, level: int = 1) -> None:
        logger.warning("sleep mode is not supported on neuron; ignored")

    def wake_up(self, tags: list[str] | None = None) -> None:
        logger.warning("sleep mode is not supported on neuron; ignored")
