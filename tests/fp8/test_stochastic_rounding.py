"""Stochastic rounding of fp32 -> bf16 / fp8 conversions on neuron
(NEURON_RT_STOCHASTIC_ROUNDING_EN=1, read at start-up, so each check runs in a fresh process)."""

import json

_CHECK = r'''
import json, math, torch, torch_neuronx
out = {}
n = 200_000
for name, dtype, value, lo, hi in (("bf16", torch.bfloat16, 1 + 2 ** -10, 1.0, 1 + 2 ** -7),
                                   ("bf16_neg", torch.bfloat16, -(3 + 2 ** -9), -3.0, -(3 + 2 ** -6)),
                                   ("e4m3", torch.float8_e4m3fn, 1.03, 1.0, 1.125),
                                   ("e5m2", torch.float8_e5m2, 0.3, 0.25, 0.3125)):
    x = torch.full((n,), value, device="neuron")
    torch.manual_seed(0)
    y = x.to(dtype).float().cpu()
    torch.manual_seed(0)
    again = x.to(dtype).float().cpu()
    vals = sorted(set(y.tolist()))
    p = (value - lo) / (hi - lo)
    sigma = abs(hi - lo) * math.sqrt(p * (1 - p) / n)
    out[name] = dict(values=vals, mean_err=abs(y.double().mean().item() - value), bound=6 * sigma,
                     reproducible=bool(torch.equal(y, again)))
x = torch.randn(10_000)
out["rne"] = bool(torch.equal(x.to("neuron").to(torch.bfloat16).cpu(), x.to(torch.bfloat16)))
print(json.dumps(out))
'''


def test_stochastic_rounding_is_unbiased_and_reproducible(run_python):
    out = json.loads(run_python(_CHECK, env={"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}).strip().splitlines()[-1])
    expect = {"bf16": [1.0, 1 + 2 ** -7], "bf16_neg": [-(3 + 2 ** -6), -3.0], "e4m3": [1.0, 1.125],
              "e5m2": [0.25, 0.3125]}
    for name, vals in expect.items():
        r = out[name]
        assert r["values"] == vals, (name, r)  # only the two neighbours
        assert r["mean_err"] <= r["bound"], (name, r)  # the mean is the value
        assert r["reproducible"], name
    assert not out["rne"]  # on: not round-to-nearest-even


def test_off_by_default_and_bit_identical_to_round_to_nearest_even(run_python):
    out = json.loads(run_python(_CHECK, env={"NEURON_RT_STOCHASTIC_ROUNDING_EN": None}).strip().splitlines()[-1])
    assert out["rne"]
    assert out["bf16"]["values"] == [1.0]  # 1 + 2**-10 rounds to 1.0, every time
    assert out["e4m3"]["values"] == [1.0]
