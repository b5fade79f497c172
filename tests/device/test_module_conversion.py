"""Moving modules and parameters to and from neuron keeps Parameter objects, as with CUDA.

Neuron tensors are shallow-copy compatible with CPU tensors (as CUDA tensors are), so
Module.to()/.cpu()/.half() and FSDP2 assign `param.data` in place; nothing switches the
process-wide `swap_module_params_on_conversion` flag, so CPU-only programs are untouched."""

import pytest
import torch

from _subprocess import run_python


def test_cpu_only_program_is_untouched_by_the_plugin():
    # torch autoloads the backend; a module conversion with a live graph must behave as without it
    code = (
        "import torch\n"
        "assert 'torch_neuronx' in __import__('sys').modules\n"
        "print(torch.__future__.get_swap_module_params_on_conversion())\n"
        "lstm = torch.nn.LSTM(8, 16); out = lstm(torch.randn(4, 3, 8))\n"
        "w = lstm.weight_ih_l0\n"
        "lstm.double(); print(lstm.weight_ih_l0 is w, lstm.weight_ih_l0.dtype)\n"
    )
    with_plugin = run_python(code).split()
    assert with_plugin == ["False", "True", "torch.float64"]


def test_shallow_copy_compatible_like_cuda():
    c, n = torch.ones(2), torch.ones(2, device="neuron")
    assert torch._has_compatible_shallow_copy_type(c, n)
    assert torch._has_compatible_shallow_copy_type(n, c)
    assert torch._has_compatible_shallow_copy_type(n * 2, c)  # kernel results too
    assert torch._has_compatible_shallow_copy_type(n.view(2, 1), c)


def test_param_data_assignment_both_ways():
    p = torch.nn.Parameter(torch.randn(3, 4))
    ref = p.detach().clone()
    p.data = p.data.to("neuron")
    assert type(p) is torch.nn.Parameter and p.device == torch.device("neuron", 0) and p.requires_grad
    (p * 2).sum().backward()
    assert p.grad.device == p.device and torch.equal(p.grad.cpu(), torch.full((3, 4), 2.0))
    assert torch.equal(p.detach().cpu(), ref)
    p.grad = None
    p.data = p.data.cpu()
    assert p.device.type == "cpu" and torch.equal(p.detach(), ref)
    (p * 3).sum().backward()
    assert p.grad.device.type == "cpu"


def tied_model():
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    return torch.nn.Sequential(emb, head)


def test_tied_weights_stay_tied_and_params_keep_identity():
    m = tied_model()
    params = list(m.parameters())
    m.to("neuron")
    assert m[0].weight is m[1].weight and list(m.parameters()) == params
    assert m[0].weight.device == torch.device("neuron", 0)
    m.cpu()
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "cpu"
    # an optimizer built before the move keeps updating the moved parameters
    m.to("neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    before = m[0].weight.detach().cpu().clone()
    m(torch.tensor([1, 2], device="neuron")).sum().backward()
    opt.step()
    assert not torch.equal(m[0].weight.detach().cpu(), before)


@pytest.mark.parametrize("convert", ["cpu", "half", "double", "to_neuron1"])
def test_converting_a_neuron_model_with_live_outputs(convert):
    # As with CUDA models: outputs (and their autograd graph) still hold the old weights.
    m = tied_model().to("neuron")
    out = m(torch.tensor([1, 2], device="neuron"))
    {"cpu": m.cpu, "half": m.half, "double": m.double, "to_neuron1": lambda: m.to("neuron:1")}[convert]()
    assert m[0].weight is m[1].weight
    w = m[0].weight
    assert (w.device.type, w.dtype, w.device.index) == {
        "cpu": ("cpu", torch.float32, None), "half": ("neuron", torch.float16, 0),
        "double": ("neuron", torch.float64, 0), "to_neuron1": ("neuron", torch.float32, 1)}[convert]
    out.sum().backward()  # the old graph still works on the old weights


def test_fully_shard_a_cpu_built_model_on_a_neuron_mesh():
    # FSDP2 moves a CPU-built model with `param.data = param.to(mesh device)`.
    out = run_python(
        "import torch, torch.distributed as dist\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "dist.init_process_group('cpu:gloo,neuron:gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "mesh = init_device_mesh('neuron', (1,))\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        "ref = {k: v.clone() for k, v in m.state_dict().items()}\n"
        "cpu_out = m(torch.ones(3, 4))\n"
        "fully_shard(m[0], mesh=mesh); fully_shard(m, mesh=mesh)\n"
        "for k, p in m.named_parameters():\n"
        "    assert type(p).__name__ == 'DTensor' and p.to_local().device == torch.device('neuron', 0), k\n"
        "    assert torch.equal(p.to_local().cpu(), ref[k]), k\n"
        "y = m(torch.ones(3, 4, device='neuron'))\n"
        "torch.testing.assert_close(y.cpu(), cpu_out.detach())\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert out.strip().endswith("ok")
