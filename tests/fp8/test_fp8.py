"""FP8 / MXFP8 scaled matmuls on neuron (csrc/aten/scaled_mm.cpp).

The platform is read once per process, so the checks run in fresh interpreters with
NEURON_PLATFORM=trn3 (FP8 compute) or trn2 (refusals). The oracle is the product in float64 of
the exactly decoded FP8 operands and scales, rounded once to out_dtype."""

import json

import pytest

_TRN3_CASES = r'''
import itertools, json, torch, torch_neuronx
torch.manual_seed(0)
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}  # relative, at most

def q(shape, dtype, scale=1.0):
    return (torch.randn(shape) * scale).to(dtype)

def mx_scales(rows, k):
    # powers of two in [2^-4, 2^4] as float8_e8m0fnu
    return torch.pow(2.0, torch.randint(-4, 5, (rows, k // 32)).float()).to(torch.float8_e8m0fnu)

def reference(a, b, sa, sb, mode, bias, out_dtype):
    """The product in float64 rounded once, and the fp32-accumulation error bound around it."""
    a64, b64 = a.double(), b.double()
    if mode == "mx":
        a64 = a64 * sa.double().repeat_interleave(32, 1)
        b64 = b64 * sb.double().t().repeat_interleave(32, 0)
    r, mag = a64 @ b64, a64.abs() @ b64.abs()
    if mode != "mx":
        r, mag = r * sa.double() * sb.double(), mag * (sa.double() * sb.double()).abs()
    if bias is not None:
        r = r + bias.double()
    return r.to(out_dtype), mag * a.shape[1] * 2.0 ** -23

# _scaled_mm takes MX scales in the blocked (swizzled 32x4x4) layout torchao and cuBLAS use.
def to_blocked(s):
    rows, cols = s.shape
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    padded = torch.zeros(rp, cp, dtype=s.dtype)
    padded[:rows, :cols] = s
    blocks = padded.view(rp // 128, 128, cp // 4, 4).permute(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()

def v1_scale(s):
    return to_blocked(s) if s.dtype == torch.float8_e8m0fnu else s

results = {}
for (da, db), mode, out_dtype, with_bias, col_major, shape in itertools.product(
        [(E4, E4), (E4, E5)], ["tensor", "row", "mx"], [torch.bfloat16, torch.float16, torch.float32],
        [False, True], [True, False], [(17, 64, 24), (33, 96, 40), (3, 96, 200), (50, 256, 70)]):
    M, K, N = shape
    a = q((M, K), da)
    b = q((N, K), db).t() if col_major else q((K, N), db)
    if mode == "tensor":
        sa, sb = torch.tensor(0.75), torch.tensor(1.5)
    elif mode == "row":
        sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    else:
        sa, sb = mx_scales(M, K), mx_scales(N, K)
    bias = torch.randn(N).to(out_dtype) if with_bias else None
    dev = lambda t: None if t is None else t.to("neuron")
    got = torch._scaled_mm(dev(a), dev(b), dev(v1_scale(sa)), dev(v1_scale(sb)), bias=dev(bias), out_dtype=out_dtype)
    want, acc_err = reference(a, b, sa, sb, mode, bias, out_dtype)
    diff = (got.cpu().double() - want.double()).abs()
    # One rounding to out_dtype (an ulp of it) plus what fp32 accumulation may add.
    within = bool((diff <= want.double().abs() * ULP[out_dtype] + acc_err).all())
    key = f"{da}x{db}-{mode}-{out_dtype}-bias{with_bias}-col{col_major}-{shape}"
    results[key] = dict(device=str(got.device), dtype=str(got.dtype), shape=list(got.shape),
                        within=within, exact=float((diff == 0).float().mean()))

# Every FP8 code decodes exactly (zeros, subnormals, the largest values, NaN): rows of all 256
# codes times an identity, K-contiguous (the vectorized decode) and not, with and without MX.
codes = {}
eye = torch.eye(32).to(E4)
for dt in (E4, E5):
    a = torch.arange(256, dtype=torch.uint8).view(dt).reshape(8, 32)
    want = a.double() @ eye.double()  # inf x 0 in the sum: inf codes give NaN, as IEEE says
    for layout, x in (("rows", a), ("cols", a.t().contiguous().t())):
        one = torch.tensor(1.0)
        got = torch._scaled_mm(x.to("neuron"), eye.to("neuron"), one.to("neuron"), one.to("neuron"),
                               out_dtype=torch.float32).cpu().double()
        ok = bool(torch.equal(got.isnan(), want.isnan())) and bool((got[~want.isnan()] == want[~want.isnan()]).all())
        s8 = torch.full((8, 1), 8.0).to(torch.float8_e8m0fnu)
        s1 = torch.ones(32, 1).to(torch.float8_e8m0fnu)
        got = torch._scaled_mm(x.to("neuron"), eye.to("neuron"), to_blocked(s8).to("neuron"), to_blocked(s1).to("neuron"),
                               out_dtype=torch.float32).cpu().double()
        ok = ok and bool(torch.equal(got.isnan(), want.isnan())) and bool(
            (got[~want.isnan()] == 8 * want[~want.isnan()]).all())
        codes[f"{dt}-{layout}"] = ok
results["every_code"] = codes

# MX scales so far from 1 that scaled values leave bf16's normal range take the fp32 path; the
# result is still the reference rounded once.
extreme = {}
for lo, hi in [(-70, -60), (50, 60), (-100, 100)]:
    a, b = q((33, 64), E4), q((40, 64), E5).t()
    sa = torch.pow(2.0, torch.randint(lo, hi + 1, (33, 2)).float()).to(torch.float8_e8m0fnu)
    sb = torch.pow(2.0, torch.randint(-20, 21, (40, 2)).float()).to(torch.float8_e8m0fnu)
    got = torch._scaled_mm(a.to("neuron"), b.to("neuron"), to_blocked(sa).to("neuron"), to_blocked(sb).to("neuron"),
                           out_dtype=torch.float32)
    want, acc_err = reference(a, b, sa, sb, "mx", None, torch.float64)
    extreme[f"{lo},{hi}"] = bool(((got.cpu().double() - want).abs() <= want.abs() * ULP[torch.float32] + acc_err).all())
results["mx_extreme"] = extreme

# Blocked scales are read as blocked even where a plain [rows, K / 32] matrix has as many
# elements (rows a multiple of 128, K / 32 of 4): the product equals the float64 reference.
swz = {}
for M, K, N in [(128, 128, 64), (256, 256, 128), (130, 160, 40)]:
    a, b = q((M, K), E4), q((N, K), E4).t()
    sa, sb = mx_scales(M, K), mx_scales(N, K)
    got = torch._scaled_mm(a.to("neuron"), b.to("neuron"), to_blocked(sa).to("neuron"), to_blocked(sb).to("neuron"),
                           out_dtype=torch.float32)
    want, acc_err = reference(a, b, sa, sb, "mx", None, torch.float64)
    swz[f"{M}x{K}x{N}"] = bool(((got.cpu().double() - want).abs() <= want.abs() * ULP[torch.float32] + acc_err).all())
results["swizzled"] = swz

# torch.nn.functional.scaled_mm (the v2 entry point, recipes named) gives _scaled_mm's results.
import torch.nn.functional as F
ST, SW = F.ScalingType, F.SwizzleType
a, b = q((40, 128), E4).to("neuron"), q((48, 128), E4).t().to("neuron")
cases = {
    "TensorWise": ((torch.tensor(0.5), ST.TensorWise, None), (torch.tensor(2.0), ST.TensorWise, None),
                   (torch.tensor(0.5), torch.tensor(2.0))),
    "RowWise": ((torch.rand(40) + 0.5, ST.RowWise, None), (torch.rand(48) + 0.5, ST.RowWise, None), None),
    "BlockWise1x32": ((mx_scales(40, 128), ST.BlockWise1x32, SW.NO_SWIZZLE),
                      (mx_scales(48, 128), ST.BlockWise1x32, SW.NO_SWIZZLE), None),
}
v2 = {}
for name, ((sa, ra, wa), (sb, rb, wb), _) in cases.items():
    got = F.scaled_mm(a, b, sa.to("neuron"), ra, sb.to("neuron"), rb, swizzle_a=wa, swizzle_b=wb,
                      output_dtype=torch.bfloat16)
    v1a = sa.reshape(40, 1) if name == "RowWise" else v1_scale(sa)
    v1b = sb.reshape(1, 48) if name == "RowWise" else v1_scale(sb)
    want = torch._scaled_mm(a, b, v1a.to("neuron"), v1b.to("neuron"), out_dtype=torch.bfloat16)
    v2[name] = bool(torch.equal(got.cpu(), want.cpu()))
sa, sb = cases["BlockWise1x32"][0][0], cases["BlockWise1x32"][1][0]
got = F.scaled_mm(a, b, to_blocked(sa).to("neuron"), ST.BlockWise1x32, to_blocked(sb).to("neuron"),
                  ST.BlockWise1x32, swizzle_a=SW.SWIZZLE_32_4_4, swizzle_b=SW.SWIZZLE_32_4_4,
                  output_dtype=torch.bfloat16)
want = torch._scaled_mm(a, b, to_blocked(sa).to("neuron"), to_blocked(sb).to("neuron"), out_dtype=torch.bfloat16)
v2["BlockWise1x32 swizzled"] = bool(torch.equal(got.cpu(), want.cpu()))
results["v2"] = v2

# Grouped (MoE), the four layouts of torch._grouped_mm, each against the float64 reference of
# its groups; offs with an empty group. F.scaled_grouped_mm (v2, RowWise recipes) agrees.
def rowwise_ref(a, b, sa, sb):
    want, acc_err = reference(a, b, sa.reshape(-1, 1), sb.reshape(1, -1), "row", None, torch.float64)
    return want, acc_err

def close(got, want, acc_err, dt=torch.bfloat16):
    return bool(((got.double() - want).abs() <= want.abs() * ULP[dt] + acc_err.to(want.dtype) + 1e-30).all())

grouped = {}
G, K, N, M = 3, 64, 32, 8
offs = torch.tensor([5, 5, 19], dtype=torch.int32)
dev = lambda *ts: [t.to("neuron") for t in ts]
# 2-D x 3-D: groups of rows.
a, b = q((19, K), E4), torch.stack([q((N, K), E4).t() for _ in range(G)])
sa, sb = torch.rand(19) + 0.5, torch.rand(G, N) + 0.5
got = torch._scaled_grouped_mm(*dev(a, b, sa, sb), offs=offs.to("neuron"), out_dtype=torch.bfloat16).cpu()
ok, start = got.shape == (19, N), 0
for g, end in enumerate(offs.tolist()):
    if end > start:
        w, e = rowwise_ref(a[start:end], b[g], sa[start:end], sb[g])
        ok = ok and close(got[start:end], w.to(torch.bfloat16).double(), e)
    start = end
grouped["2d_3d"] = ok
v2 = F.scaled_grouped_mm(*dev(a, b), sa.to("neuron"), ST.RowWise, sb.to("neuron"), ST.RowWise,
                         offs=offs.to("neuron"), output_dtype=torch.bfloat16).cpu()
grouped["v2_equal"] = bool(torch.equal(v2, got))
# 3-D x 2-D: groups of columns of mat2.
a, b = q((G, M, K), E4), q((19, K), E4).t()
sa, sb = torch.rand(G, M) + 0.5, torch.rand(19) + 0.5
got = torch._scaled_grouped_mm(*dev(a, b, sa, sb), offs=offs.to("neuron"), out_dtype=torch.bfloat16).cpu()
ok, start = got.shape == (M, 19), 0
for g, end in enumerate(offs.tolist()):
    if end > start:
        w, e = rowwise_ref(a[g], b[:, start:end], sa[g], sb[start:end])
        ok = ok and close(got[:, start:end], w.to(torch.bfloat16).double(), e)
    start = end
grouped["3d_2d"] = ok
# 2-D x 2-D: groups along K (weight gradients); an empty group gives zeros.
koffs = torch.tensor([32, 32, 96], dtype=torch.int32)
a, b = q((M, 96), E4), q((N, 96), E4).t()
sa, sb = torch.rand(G * M) + 0.5, torch.rand(G * N) + 0.5
got = torch._scaled_grouped_mm(*dev(a, b, sa, sb), offs=koffs.to("neuron"), out_dtype=torch.bfloat16).cpu()
ok, start = got.shape == (G, M, N), 0
for g, end in enumerate(koffs.tolist()):
    if end > start:
        w, e = rowwise_ref(a[:, start:end], b[start:end], sa[g * M:(g + 1) * M], sb[g * N:(g + 1) * N])
        ok = ok and close(got[g], w.to(torch.bfloat16).double(), e)
    else:
        ok = ok and bool((got[g] == 0).all())
    start = end
grouped["2d_2d"] = ok
# 3-D x 3-D: batched.
a, b = q((G, M, K), E4), torch.stack([q((N, K), E4).t() for _ in range(G)])
sa, sb = torch.rand(G, M) + 0.5, torch.rand(G, N) + 0.5
got = torch._scaled_grouped_mm(*dev(a, b, sa, sb), out_dtype=torch.bfloat16).cpu()
grouped["3d_3d"] = got.shape == (G, M, N) and all(
    close(got[g], rowwise_ref(a[g], b[g], sa[g], sb[g])[0].to(torch.bfloat16).double(),
          rowwise_ref(a[g], b[g], sa[g], sb[g])[1]) for g in range(G))
results["grouped"] = grouped

# Clear errors for bad input.
errors = {}
def expect(name, fn):
    try:
        fn()
        errors[name] = None
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {e}".split("\n")[0]
a, b = q((16, 64), E4).to("neuron"), q((32, 64), E4).t().to("neuron")
one = torch.tensor(1.0, device="neuron")
expect("scale_shape", lambda: torch._scaled_mm(a, b, torch.ones(3, 1, device="neuron"), one, out_dtype=torch.bfloat16))
expect("scale_dtype", lambda: torch._scaled_mm(a, b, one.half(), one, out_dtype=torch.bfloat16))
expect("not_fp8", lambda: torch._scaled_mm(a.bfloat16(), b.bfloat16(), one, one, out_dtype=torch.bfloat16))
a48, b48 = q((16, 48), E4).to("neuron"), q((32, 48), E4).t().to("neuron")
expect("mx_block", lambda: torch._scaled_mm(a48, b48, torch.ones(16, 2, device="neuron").to(torch.float8_e8m0fnu),
                                            torch.ones(32, 2, device="neuron").to(torch.float8_e8m0fnu),
                                            out_dtype=torch.bfloat16))
expect("mx_plain", lambda: torch._scaled_mm(a, b, torch.ones(16, 2, device="neuron").to(torch.float8_e8m0fnu),
                                            torch.ones(32, 2, device="neuron").to(torch.float8_e8m0fnu),
                                            out_dtype=torch.bfloat16))
a3, b3 = q((2, 8, 64), E4).to("neuron"), torch.stack([q((16, 64), E4).t() for _ in range(2)]).to("neuron")
expect("grouped_scale", lambda: torch._scaled_grouped_mm(a3, b3, torch.ones(2, 9, device="neuron"),
                                                         torch.ones(2, 16, device="neuron"), out_dtype=torch.bfloat16))
expect("grouped_offs", lambda: torch._scaled_grouped_mm(a3[0], b3, torch.ones(8, device="neuron"),
                                                        torch.ones(2, 16, device="neuron"),
                                                        offs=torch.tensor([6, 4], dtype=torch.int32, device="neuron"),
                                                        out_dtype=torch.bfloat16))
expect("grouped_v2_mx", lambda: F.scaled_grouped_mm(a3[0], b3, torch.ones(8, 2, device="neuron").to(torch.float8_e8m0fnu),
                                                    ST.BlockWise1x32, torch.ones(2, 16, 2, device="neuron").to(torch.float8_e8m0fnu),
                                                    ST.BlockWise1x32, offs=torch.tensor([4, 8], dtype=torch.int32, device="neuron"),
                                                    output_dtype=torch.bfloat16))
print(json.dumps(dict(results=results, errors=errors)))
'''

_TRN2_CASES = r'''
import json, torch, torch_neuronx
x = torch.randn(16, 32)
out = {}
def expect(name, fn):
    try:
        fn()
        out[name] = None
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}".split("\n")[0]
a = x.to(torch.float8_e4m3fn).to("neuron")
one = torch.tensor(1.0, device="neuron")
expect("scaled_mm", lambda: torch._scaled_mm(a, a.t(), one, one, out_dtype=torch.bfloat16))
expect("grouped", lambda: torch._scaled_grouped_mm(a, a.t().unsqueeze(0).contiguous(), one.expand(16).contiguous(),
                                                   torch.ones(1, 16, device="neuron"),
                                                   offs=torch.tensor([16], dtype=torch.int32, device="neuron"),
                                                   out_dtype=torch.bfloat16))
expect("mm", lambda: torch.mm(a, a.t()))
expect("matmul_3d", lambda: a.unsqueeze(0) @ a.t().unsqueeze(0))
# Storage and casts stay allowed.
back = a.to(torch.float32).cpu()
out["cast_equal"] = bool(torch.equal(back, x.to(torch.float8_e4m3fn).to(torch.float32)))
out["e5m2_roundtrip"] = bool(torch.equal(x.to("neuron").to(torch.float8_e5m2).cpu(), x.to(torch.float8_e5m2)))
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def trn3(run_python_module):
    return json.loads(run_python_module(_TRN3_CASES, env={"NEURON_PLATFORM": "trn3"}).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run_python_module():
    from _subprocess import run_python

    return run_python


def test_scaled_mm_every_mode_matches_the_float64_reference(trn3):
    results = {k: v for k, v in trn3["results"].items() if isinstance(v, dict) and "device" in v}
    assert len(results) == 2 * 3 * 3 * 2 * 2 * 4
    for key, r in results.items():
        assert r["device"] == "neuron:0", key
        assert r["dtype"] in ("torch.bfloat16", "torch.float16", "torch.float32"), key
        # fp32 accumulation, one rounding: within an ulp of out_dtype plus the accumulation
        # bound, and for narrow outputs nearly always identical to the rounded reference.
        assert r["within"], (key, r)
        if "float32" not in key.split("-")[2]:
            assert r["exact"] >= 0.95, (key, r)


def test_functional_scaled_mm_recipes_match_scaled_mm(trn3):
    assert trn3["results"]["v2"] == {"TensorWise": True, "RowWise": True, "BlockWise1x32": True,
                                     "BlockWise1x32 swizzled": True}


def test_every_fp8_code_decodes_exactly(trn3):
    assert trn3["results"]["every_code"] == {f"torch.float8_{d}-{lay}": True for d in ("e4m3fn", "e5m2")
                                             for lay in ("rows", "cols")}


def test_mx_scales_far_from_one_match_the_reference(trn3):
    assert trn3["results"]["mx_extreme"] == {"-70,-60": True, "50,60": True, "-100,100": True}


def test_mx_scales_in_the_blocked_layout_and_grouped_mm(trn3):
    assert trn3["results"]["swizzled"] == {"128x128x64": True, "256x256x128": True, "130x160x40": True}
    assert trn3["results"]["grouped"] == {"2d_3d": True, "v2_equal": True, "3d_2d": True, "2d_2d": True,
                                          "3d_3d": True}


def test_bad_input_is_a_clear_error(trn3):
    e = trn3["errors"]
    assert "scale_a of shape [3, 1] is neither tensor-wise" in e["scale_shape"]
    assert "must be float32" in e["scale_dtype"] and "float8_e8m0fnu" in e["scale_dtype"]
    assert "operands must be FP8" in e["not_fp8"]
    assert "not a multiple of 32" in e["mx_block"]
    assert "blocked (swizzled) layout" in e["mx_plain"] and "NO_SWIZZLE" in e["mx_plain"]
    assert "scale_a must be [2, 8]" in e["grouped_scale"]
    assert "offs must be non-decreasing" in e["grouped_offs"]
    assert e["grouped_v2_mx"].startswith("NotImplementedError") and "RowWise" in e["grouped_v2_mx"]


def test_trn2_refuses_fp8_compute_and_keeps_casts(run_python_module):
    out = json.loads(run_python_module(_TRN2_CASES, env={"NEURON_PLATFORM": "trn2"}).strip().splitlines()[-1])
    for op in ("scaled_mm", "grouped", "mm", "matmul_3d"):
        assert out[op] is not None and "trn2" in out[op] and "NEURON_PLATFORM=trn3" in out[op], (op, out[op])
    assert out["cast_equal"] and out["e5m2_roundtrip"]
