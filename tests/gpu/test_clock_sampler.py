"""NVML readings while the GPU works (what ferry bench --overlap reports)."""


def test_clock_sampler_reads_a_busy_gpu():
    import torch
    from ferry._native import require

    native = require()
    sampler = native.ClockSampler(native.pci_bus_id(0), 500)
    a = torch.randn(4096, 4096, device="cuda:0", dtype=torch.bfloat16)
    sampler.start()
    for _ in range(200):  # well over 50 ms of GEMMs
        torch.mm(a, a)
    torch.cuda.synchronize(0)
    seen = sampler.stop()
    assert seen["samples"] >= 20, seen
    # A working GPU reports a clock in the hundreds of MHz or more, and a power
    # draw a board can have.
    assert 100 <= seen["min_sm_mhz"] <= seen["mean_sm_mhz"] <= 5000, seen
    assert 10 <= seen["mean_power_w"] <= 2000, seen
    assert 0.0 <= seen["power_capped"] <= 1.0 and 0.0 <= seen["thermal"] <= 1.0, seen
    # Stopped means stopped: a second stop summarizes nothing new.
    assert sampler.stop()["samples"] == 0


def test_clock_sampler_of_an_unknown_gpu_reads_nothing():
    from ferry._native import require

    sampler = require().ClockSampler("ffff:ff:ff.f", 200)
    sampler.start()
    assert sampler.stop()["samples"] == 0
