"""Device API: count, current device, properties, streams and events, multi-device copies."""

import time

import pytest
import torch

from _subprocess import run_python


def test_device_count_and_properties():
    # default platform: trn2, LNC=2 -> 4 logical devices of 96 GiB / 4
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() == 4
    props = torch.neuron.get_device_properties(1)
    assert props.total_memory == 24 * 2**30
    assert props.platform == "trn2" and props.lnc == 2
    assert props.physical_cores == [2, 3]
    assert "Trainium2" in torch.neuron.get_device_name(0)
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == 4


def test_set_and_current_device():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(2):
        assert torch.neuron.current_device() == 2
        t = torch.empty(3, device="neuron")
        assert t.device == torch.device("neuron", 2)
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device("neuron:1")
    try:
        assert torch.accelerator.current_device_index() == 1
        assert torch.ones(2, device="neuron").device.index == 1
    finally:
        torch.neuron.set_device(0)


def test_bad_device_index_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"Invalid device index 7: 4 neuron devices are visible.*0\.\.3"):
        torch.empty(2, device="neuron:7")
    with pytest.raises(RuntimeError, match="Invalid device index 9"):
        torch.neuron.set_device(9)
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.neuron.get_device_properties(4)
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.set_device("cpu")


def test_tensor_methods_and_module_to():
    t = torch.arange(6).neuron()
    assert t.is_neuron and t.device == torch.device("neuron", 0)
    m = torch.nn.Linear(3, 2).neuron()
    assert all(p.device.type == "neuron" for p in m.parameters())
    assert torch.equal(m.to("cpu").weight, m.weight.cpu())


def test_copies_between_devices_and_host():
    x = torch.randn(64, 33)
    a = x.to("neuron:0")
    b = a.to("neuron:3")
    assert b.device == torch.device("neuron", 3)
    assert torch.equal(b.cpu(), x)
    c = torch.empty_like(b, device="neuron:1").copy_(a)  # device->device copy_
    assert torch.equal(c.cpu(), x)
    # non-contiguous, dtype-converting, broadcasting copies
    d = torch.zeros(33, 64, dtype=torch.float64, device="neuron:2")
    d.copy_(a.t())
    assert d.dtype == torch.float64 and torch.equal(d.cpu(), x.t().double())
    e = torch.empty(4, 33, device="neuron")
    e.copy_(x[0])
    assert torch.equal(e.cpu(), x[0].expand(4, 33))
    # non_blocking and pinned memory
    pinned = torch.randn(1000).pin_memory()
    assert pinned.is_pinned()
    on_dev = pinned.to("neuron", non_blocking=True)
    assert torch.equal(on_dev.cpu(), pinned)
    back = on_dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, pinned)


def test_streams():
    s = torch.neuron.Stream(priority=-1)
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("neuron", 0)
    assert s.priority == -1
    assert torch.neuron.Stream().priority == 0
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    assert torch.neuron.default_stream().stream_id == 0
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
        y = torch.ones(4, device="neuron") * 3
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    s.synchronize()
    assert s.query()
    assert torch.equal(y.cpu(), torch.full((4,), 3.0))
    other = torch.neuron.Stream(device=2)
    assert other.device_index == 2
    torch.neuron.current_stream().wait_stream(s)


def test_events_ordering_and_elapsed_time():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    assert isinstance(start, torch.neuron.Event) and isinstance(start, torch.Event)
    assert start.query()  # never recorded: complete, as CUDA
    start.record()
    x = torch.randn(256, 256, device="neuron")
    for _ in range(3):
        x = x @ x / 256
    time.sleep(0.03)
    end.record()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert 25.0 <= ms < 5000.0
    # cross-stream wait: work recorded on one stream is visible after waiting on the event
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        z = torch.full((8,), 2.0, device="neuron")
        ev = s.record_event()
    torch.neuron.current_stream().wait_event(ev)
    assert torch.equal((z + 1).cpu(), torch.full((8,), 3.0))


def test_sleep_holds_the_current_stream_busy():
    # torch.neuron._sleep as torch.cuda._sleep (what PyTorch's FSDP2 stream tests call through
    # common_utils.device_sleep): launched on the current stream, and an event recorded after
    # it completes after it. The busy wait lasts cycles / engine clock by construction, so the
    # elapsed time has a lower bound only.
    from torch.testing._internal.common_utils import device_sleep

    from torch_neuronx import _C

    cycles = int(torch.neuron.get_platform()["engine_ghz"] * 1e6 * 20)  # 20 ms
    side, default = torch.neuron.Stream(), torch.neuron.current_stream()
    before = [_C._stream_launch_count(0, s.stream_id) for s in (side, default)]
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with torch.neuron.stream(side):
        start.record()
        device_sleep("neuron", cycles)
        end.record()
    default.wait_event(end)
    assert [_C._stream_launch_count(0, s.stream_id) for s in (side, default)] == [before[0] + 1, before[1]]
    end.synchronize()
    assert end.query() and side.query()
    assert start.elapsed_time(end) >= 20.0 * 0.999
    with pytest.raises(ValueError, match="non-negative"):
        torch.neuron._sleep(-1)
    with pytest.raises(TypeError, match="integer"):
        torch.neuron._sleep(1.5)


def test_event_misuse_messages():
    a = torch.neuron.Event()  # timing disabled
    b = torch.neuron.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)
    c = torch.neuron.Event(enable_timing=True)
    d = torch.neuron.Event(enable_timing=True)
    c.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded before calculating elapsed time"):
        c.elapsed_time(d)


def test_synchronize_and_accelerator_api():
    torch.neuron.synchronize()
    torch.neuron.synchronize(3)
    torch.accelerator.synchronize()
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.neuron.synchronize(8)


def test_device_capability_from_platform():
    for platform, fp8 in (("trn2", False), ("trn3", True)):
        out = run_python(
            "import torch\n"
            "caps = torch.accelerator.get_device_capability('neuron:0')\n"
            "print(sorted(str(d) for d in caps['supported_dtypes']))\n",
            env={"NEURON_PLATFORM": platform},
        )
        dtypes = set(eval(out.strip().splitlines()[-1]))
        assert {"torch.float32", "torch.bfloat16", "torch.float16", "torch.int64", "torch.float64", "torch.bool"} <= dtypes
        assert not {"torch.qint8", "torch.quint8", "torch.qint32"} & dtypes  # quantized tensors are refused
        assert ("torch.float8_e4m3fn" in dtypes) == fp8 and ("torch.float8_e5m2" in dtypes) == fp8
        assert ("torch.float8_e8m0fnu" in dtypes) == fp8  # MX scales: trn3 only
        assert "torch.float8_e4m3fnuz" not in dtypes
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.accelerator.get_device_capability("neuron:9")


def test_record_stream():
    s = torch.neuron.Stream()
    x = torch.ones(1024, device="neuron")
    with torch.neuron.stream(s):
        y = x * 2
    y.record_stream(s)
    x.record_stream(torch.neuron.current_stream())
    ptr = y.data_ptr()
    del y
    torch.neuron.synchronize()
    # synchronous execution: the block is free again once the stream's work is done
    z = torch.empty(1024, device="neuron")
    assert z.data_ptr() == ptr
    with pytest.raises(RuntimeError, match="expected a neuron stream"):
        x.record_stream(torch.Stream(device="cpu"))
    with pytest.raises(RuntimeError, match="the stream is on neuron:1"):
        x.record_stream(torch.neuron.Stream(device=1))


def test_autograd_workers_release_finished_backwards_before_exit():
    # A device's autograd worker may still hold the last reference to a finished backward, whose
    # captured thread-local state owns Python objects. The exit hook has each worker release it
    # while Python still runs; released later, during finalization, it would abort the process.
    import weakref

    class Marker:
        pass

    marker = Marker()
    ref = weakref.ref(marker)
    torch._C._stash_obj_in_tls("torch_neuronx_test_marker", marker)
    x = torch.randn(8, 8, device="neuron:1", requires_grad=True)
    (x @ x).sum().backward()
    torch._C._stash_obj_in_tls("torch_neuronx_test_marker", None)  # now only finished backwards hold it
    del marker
    torch.neuron._drain_autograd_workers()
    assert ref() is None
    assert x.grad is not None


def test_scripts_that_ran_backward_exit_cleanly():
    # Inductor stashes Python objects in the importing thread's state (as above) at import.
    script = (
        "import torch\n"
        "import torch._inductor.cudagraph_trees\n"
        "x = torch.randn(64, 64, device='neuron', requires_grad=True)\n"
        "for _ in range(3):\n"
        "    (x @ x).sum().backward()\n"
        "print('done')\n"
    )
    for _ in range(3):
        out = run_python(script)  # raises with the output on any non-zero exit (an abort is -6)
        assert out.strip() == "done", out


def test_set_device_initializes_so_a_bare_neuron_means_the_current_device():
    # As torch.cuda.set_device: FakeTensor (torch.compile, DTensor's sharding propagation)
    # resolves a bare "neuron" to the current device only once the device is initialized.
    out = run_python(
        "import torch\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "print(torch.neuron.is_initialized())\n"
        "torch.neuron.set_device(1)\n"
        "print(torch.neuron.is_initialized())\n"
        "with FakeTensorMode():\n"
        "    a = torch.empty(4, device='neuron')\n"
        "    b = torch.empty(4, dtype=torch.bfloat16, device='neuron')\n"
        "    print(a.device, b.device, (a + b).device)\n"
    )
    assert out.split() == ["False", "True", "neuron:1", "neuron:1", "neuron:1"], out
