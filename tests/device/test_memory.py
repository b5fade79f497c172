"""Memory: exact allocator statistics, out-of-memory errors and recovery, no leaks."""

import gc

import pytest
import torch


@pytest.fixture(autouse=True)
def clean_device():
    gc.collect()
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    yield
    gc.collect()
    torch.neuron.set_per_process_memory_fraction(1.0)
    torch.neuron.empty_cache()


def test_exact_statistics_for_a_known_pattern():
    base = torch.neuron.memory_allocated()
    a = torch.empty(1024, device="neuron")  # 4096 B
    b = torch.empty(1000, dtype=torch.float16, device="neuron")  # 2000 B -> 2048 (512 B granularity)
    c = torch.empty(3 * 2**20, dtype=torch.uint8, device="neuron")  # 3 MiB, large pool
    assert torch.neuron.memory_allocated() - base == 4096 + 2048 + 3 * 2**20
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.current"] >= 3
    assert stats["requested_bytes.all.current"] - stats["allocated_bytes.all.current"] <= 0
    assert stats["allocated_bytes.large_pool.current"] >= 3 * 2**20
    peak = torch.neuron.max_memory_allocated()
    assert peak - base == 4096 + 2048 + 3 * 2**20
    del c
    assert torch.neuron.memory_allocated() - base == 4096 + 2048
    assert torch.neuron.max_memory_allocated() == peak  # peak survives the free
    # the freed block stays cached: reserved stays, allocated drops
    reserved = torch.neuron.memory_reserved()
    assert reserved >= torch.neuron.memory_allocated() + 3 * 2**20
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == reserved - 3 * 2**20
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    del a, b
    assert torch.neuron.memory_allocated() == base
    # the same truth through torch.accelerator
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.neuron.memory_reserved()


def test_caching_reuses_freed_blocks():
    x = torch.empty(2**20, device="neuron")
    ptr = x.data_ptr()
    del x
    y = torch.empty(2**20, device="neuron")
    assert y.data_ptr() == ptr
    segs = torch.neuron.memory_stats()["segment.all.current"]
    del y
    for _ in range(10):
        z = torch.empty(2**20, device="neuron")
        del z
    assert torch.neuron.memory_stats()["segment.all.current"] == segs


def test_stats_are_per_device():
    base1 = torch.neuron.memory_allocated(1)
    t = torch.empty(2048, device="neuron:1")
    assert torch.neuron.memory_allocated(1) - base1 == 8192
    assert torch.neuron.memory_allocated("neuron:1") - base1 == 8192
    del t
    assert torch.neuron.memory_allocated(1) == base1


def test_out_of_memory_raises_and_program_recovers():
    free, total = torch.neuron.mem_get_info()
    assert total == 24 * 2**30 and free <= total
    # Earlier tests in this process may keep tensors alive (libraries cache some), so limits are
    # set above what is already allocated.
    base = torch.neuron.memory_allocated()
    limit = base + 64 * 2**20
    torch.neuron.set_per_process_memory_fraction(limit / total)  # 64 MiB free
    assert torch.neuron.get_per_process_memory_fraction() == pytest.approx(limit / total)
    keep = torch.empty(40 * 2**20, dtype=torch.uint8, device="neuron")
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(32 * 2**20, dtype=torch.uint8, device="neuron")
    msg = str(info.value)
    assert "Neuron out of memory. Tried to allocate 32.00 MiB" in msg
    assert f"total capacity of {limit / 2**20:.2f} MiB" in msg
    assert f"{(base + 40 * 2**20) / 2**20:.2f} MiB is allocated by PyTorch" in msg
    assert "reserved by PyTorch but unallocated" in msg
    assert torch.neuron.memory_stats()["num_ooms"] >= 1
    # an op whose output does not fit raises the same error
    with pytest.raises(torch.OutOfMemoryError):
        torch.cat([keep, keep])
    # free and continue
    del keep
    again = torch.empty(32 * 2**20, dtype=torch.uint8, device="neuron")
    again.fill_(7)
    assert int(again[-1].item()) == 7


def test_oom_frees_cache_before_failing():
    total = torch.neuron.mem_get_info()[1]
    base = torch.neuron.memory_allocated()
    torch.neuron.set_per_process_memory_fraction((base + 16 * 2**20) / total)
    a = torch.empty(10 * 2**20, dtype=torch.uint8, device="neuron")
    del a  # cached, reserved
    assert torch.neuron.memory_reserved() >= 10 * 2**20
    b = torch.empty(12 * 2**20, dtype=torch.uint8, device="neuron")  # needs the cache released
    assert b.numel() == 12 * 2**20
    assert torch.neuron.memory_stats()["num_alloc_retries"] >= 1


def test_device_memory_capacity_from_env(run_python):
    out = run_python(
        "import torch\n"
        "print(torch.neuron.get_device_properties(0).total_memory)\n"
        "try:\n"
        "    torch.empty(2**20, device='neuron')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', 'capacity of 1.00 MiB' in str(e))\n",
        env={"NEURON_DEVICE_MEMORY": "1MiB"},
    )
    assert out.split() == [str(2**20), "OOM", "True"]


def test_ten_thousand_alloc_free_cycles_leave_nothing():
    base = torch.neuron.memory_allocated()
    for i in range(10_000):
        t = torch.empty(64 + (i % 7) * 128, device="neuron")
        u = t + 1
        del t, u
    assert torch.neuron.memory_allocated() == base
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == torch.neuron.memory_stats()["reserved_bytes.all.current"]
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.current"] == torch.neuron.memory_stats()["active.all.current"]


def test_memory_summary_reports_the_numbers():
    t = torch.empty(5 * 2**20, dtype=torch.uint8, device="neuron")
    s = torch.neuron.memory_summary()
    assert "neuron:0" in s and "Allocated memory" in s and "5.00 MiB" in s
    del t


def test_memory_fraction_validation():
    with pytest.raises(ValueError, match="fraction"):
        torch.neuron.set_per_process_memory_fraction(1.5)


def test_host_allocator_is_registered():
    # torch.accelerator's host-cache calls dereference the device type's host allocator
    # (vLLM calls empty_host_cache() at shutdown); the pinned allocator serves as it.
    torch.ones(3, device="neuron")
    torch.accelerator.empty_host_cache()
    pinned = torch.arange(4.0).pin_memory()
    assert pinned.is_pinned()
    assert torch.equal(pinned.to("neuron").cpu(), torch.arange(4.0))
