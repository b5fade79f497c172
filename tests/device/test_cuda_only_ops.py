"""CUDA-only aten ops (a CUDA kernel, no CPU or composite kernel): the list read from
native_functions.yaml, and the public nn APIs that reach them on neuron. A reachable op
without a neuron kernel must fail as NotImplementedError naming it, never as a crash,
a hang or a wrong result."""

from __future__ import annotations

import os

import pytest
import torch

from torch_neuronx.testing._pool import run_isolated

import _nn_probe  # coverage/ (on sys.path by conftest.py)
import cuda_only_ops as coo

NAMES = {o.name for o in coo.cuda_only_ops()}


def _has_neuron_kernel(op: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "PrivateUse1")


def test_parser_finds_cuda_only_ops_and_not_cpu_ones():
    assert {"_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell_backward_impl",
            "_thnn_fused_gru_cell_backward", "batch_norm_stats", "mm.dtype"} <= NAMES  # fmt: skip
    # CPU kernels (some only through a structured delegate or a ufunc), or a composite
    # kernel next to the CUDA one
    for op in ("add", "add.Tensor", "add.out", "mm", "mm.out", "bmm", "native_dropout", "_fused_rms_norm",
               "_grouped_mm", "_thnn_fused_lstm_cell_backward", "_cudnn_rnn.out", "_thnn_fused_lstm_cell.out"):
        assert op not in NAMES, op
    assert all(o.category for o in coo.cuda_only_ops())
    assert coo.category("cudnn_convolution") == "cudnn" and coo.category("miopen_rnn") == "miopen"


def test_dispatch_sections_are_read_as_torchgen_writes_them():
    entries = [
        {"func": "a.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", "structured": True,
         "dispatch": {"CUDA": "a_cuda", "MPS": "a_mps"}},
        {"func": "a(Tensor self) -> Tensor", "structured_delegate": "a.out"},
        {"func": "a_(Tensor(a!) self) -> Tensor(a!)", "structured_delegate": "a.out",
         "dispatch": {"SparseCPU, SparseCUDA": "a_sparse_"}},
        {"func": "b(Tensor self) -> Tensor", "dispatch": {"CPU, CUDA": "b_kernel"}},
        {"func": "c(Tensor self) -> Tensor", "dispatch": {"CUDA, NestedTensorCUDA": "c_cuda"}},
        {"func": "d(Tensor self) -> Tensor", "dispatch": {"CompositeExplicitAutograd, CUDA": "d_kernel"}},
        {"func": "e(Tensor self) -> Tensor"},
        {"func": "f.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", "structured": True,
         "ufunc_inner_loop": {"Generic": "f (AllAndComplex)"}, "dispatch": {"SparseCUDA": "f_sparse"}},
        {"func": "f(Tensor self) -> Tensor", "structured_delegate": "f.out"},
    ]  # fmt: skip
    keys = coo.kernel_keys(entries)
    assert keys["a"] == {"CUDA", "MPS"} and keys["a_"] == {"CUDA", "MPS", "SparseCPU", "SparseCUDA"}
    assert keys["c"] == {"CUDA", "NestedTensorCUDA"} and keys["e"] == {"CompositeImplicitAutograd"}
    assert {"CPU", "CUDA"} <= keys["f"]
    assert {n for n, k in keys.items() if coo.is_cuda_only(k)} == {"a.out", "a", "a_", "c"}


def test_list_matches_torchgen_and_this_torch():
    from torchgen.gen import parse_native_yaml
    from torchgen.model import DispatchKey

    path = coo.native_functions_path()
    parsed = parse_native_yaml(path, os.path.join(os.path.dirname(path), "tags.yaml"))
    funcs = {str(f.func.name): f for f in parsed.native_functions}

    def has(name, key):
        f, index = funcs[name], parsed.backend_indices[key].index
        return f.func.name in index or (f.structured_delegate is not None and f.structured_delegate in index)

    composite = [k for k in DispatchKey if k.name.startswith("Composite")]
    expected = {n for n in funcs
                if has(n, DispatchKey.CUDA) and not has(n, DispatchKey.CPU) and not any(has(n, k) for k in composite)}
    assert NAMES == expected  # fmt: skip
    # and this torch registers no CPU kernel for any of them
    with_cpu = sorted(n for n in NAMES if torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{n}", "CPU"))
    assert not with_cpu
    assert torch._C._dispatch_has_computed_kernel_for_dispatch_key("aten::add.Tensor", "CPU")


def test_reachable_table_is_consistent():
    assert set(coo.REACHABLE) <= NAMES
    assert coo.reachable_ops() == frozenset(coo.REACHABLE)
    for op, reach in coo.REACHABLE.items():
        assert reach.cases and set(reach.cases) <= set(_nn_probe.CASES), op
        assert set(reach.after) <= set(coo.REACHABLE), op
    markdown = coo.markdown()
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    assert len(rows) == len(NAMES)
    first = {row.split("`")[1] for row in rows[: len(coo.REACHABLE)]}
    assert first == set(coo.REACHABLE)


def test_ops_documented_as_kernels_are_the_neuron_kernels():
    assert {op for op in NAMES if _has_neuron_kernel(op)} == coo.NEURON_KERNELS


def test_probe_reaches_only_listed_ops():
    results = _nn_probe.probe(workers=2, timeout=120)
    failed = {r.api: r.error for r in results if r.error and r.api not in _nn_probe.REFUSED}
    assert not failed, f"public API cases failed for another reason than a missing kernel: {failed}"
    assert {r.api for r in results if r.error} == set(_nn_probe.REFUSED)
    reached = {op: r.api for r in results for op in r.reached}
    assert set(reached) <= set(coo.REACHABLE), f"not in REACHABLE: {set(reached) - set(coo.REACHABLE)}"
    # every op whose earlier ops all have kernels must have been reached, unless the platform
    # refuses every API that reaches it (FP8 on trn2) before it runs
    runnable = {op for op, r in coo.REACHABLE.items()
                if all(_has_neuron_kernel(a) for a in r.after) and not set(r.cases) <= set(_nn_probe.REFUSED)}
    assert runnable <= set(reached), f"not reached: {runnable - set(reached)}"


# ---- (b) a reachable op without a kernel raises NotImplementedError naming it -------------------


# Shape-correct placeholders for the CUDA-only ops that run before another one, so the
# public API goes on to the op under test. Values are irrelevant: only which op fails is checked.
_STANDINS = {
    "_flash_attention_forward": lambda q, k, v, *args, **kwargs: (
        torch.zeros_like(q), q.new_zeros(q.size(1), q.size(0), dtype=torch.float32),
        q.new_zeros(2, dtype=torch.uint64), q.new_zeros(0), q.new_zeros(0)),
}  # fmt: skip

WITHOUT_KERNEL = [op for op in coo.REACHABLE if op not in coo.NEURON_KERNELS]


def _op_that_raised(op: str) -> tuple[str | None, str]:
    reach = coo.REACHABLE[op]
    lib = torch.library.Library("aten", "IMPL")
    try:
        for before in reach.after:
            if not _has_neuron_kernel(before):
                lib.impl(before, _STANDINS[before], "PrivateUse1")
        r = _nn_probe.run_case(reach.cases[0])
    finally:
        lib._destroy()
    return r.op, r.error


def test_every_reachable_op_without_kernel_has_a_standin_for_what_runs_before_it():
    needed = {a for op in WITHOUT_KERNEL for a in coo.REACHABLE[op].after if a not in coo.NEURON_KERNELS}
    assert needed <= set(_STANDINS)


def test_reachable_ops_without_kernel_raise_naming_the_op():
    outcomes = {o.item: o for o in run_isolated(_op_that_raised, WITHOUT_KERNEL, workers=2, timeout=120)}
    assert set(outcomes) == set(WITHOUT_KERNEL)
    for op, o in sorted(outcomes.items()):
        assert o.kind == "ok", f"{op}: {o.kind} {o.error}"  # not a crash or a hang
        raised, error = o.value
        api = coo.REACHABLE[op].cases[0]
        assert raised == op, f"{api} should raise NotImplementedError naming aten::{op}; got {raised or error!r}"


@pytest.mark.parametrize("op", ["_flash_attention_forward_no_dropout_inplace", "_flash_attention_forward"])
def test_error_message_names_op_and_cpu_way_out(op):
    # in this process too: the message a user sees
    with pytest.raises(NotImplementedError, match=rf"aten::{op} is not supported on the neuron device"):
        _nn_probe.CASES[coo.REACHABLE[op].cases[0]]("neuron")
