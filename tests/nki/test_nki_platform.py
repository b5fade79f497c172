"""One platform model (csrc/runtime/platform.cpp) owns the chip facts: torch.neuron.get_platform(),
nki.language.tile_size and the NKI verifier's limits agree for every platform, and trn1 / inf2
(NeuronCore-v2) are NKI targets with v2 limits while the torch device keeps refusing them.

The oracle is AWS's documentation: SBUF per partition 192 KiB on NeuronCore-v2, 224 KiB on v3,
256 KiB on v4; 128 partitions; PSUM banks of 2 KiB (512 fp32), 8 per partition.
"""

import json

import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl
from _subprocess import run_python

KIB = 1024
DOCS = {"trn1": (2, 192 * KIB), "inf2": (2, 192 * KIB), "trn2": (3, 224 * KIB), "trn3": (4, 256 * KIB)}


def _sbuf_tile(free_bytes):
    def k(x):
        t = nl.ndarray((128, free_bytes // 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)

    return k


def _seen_limits():
    """A kernel that records what nl.tile_size and nisa report while it is traced."""
    seen = {}

    def k(x):
        seen.update(sbuf=nl.tile_size.sbuf_fmax_bytes, pmax=nl.tile_size.pmax, psum_fmax=nl.tile_size.psum_fmax,
                    banks=nl.tile_size.psum_num_banks, moving=nl.tile_size.gemm_moving_fmax,
                    nc=int(nisa.get_nc_version()))

    nki.simulate(k)(np.zeros((1, 1), np.float32))
    return seen


@pytest.mark.parametrize("name", sorted(DOCS))
def test_tile_size_and_verifier_agree_with_the_platform_model(monkeypatch, name):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", name)
    nc, sbuf = DOCS[name]
    assert _seen_limits() == dict(sbuf=sbuf, pmax=128, psum_fmax=512, banks=8, moving=512, nc=nc)
    assert nl.tile_size.sbuf_fmax_bytes == sbuf  # outside a kernel: the environment's target
    assert nl.tile_size.sbuf_size_bytes == 128 * sbuf
    x = np.zeros((1, 1), np.float32)
    nki.simulate(_sbuf_tile(sbuf))(x)  # a full partition fits
    with pytest.raises(nki.NkiValidationError, match=f"needs {sbuf + 4} bytes per partition; {name} has {sbuf}") as e:
        nki.simulate(_sbuf_tile(sbuf + 4))(x)
    assert e.value.rule == "sbuf-capacity"


_DEVICE_SIDE = """
import json, numpy as np, torch, nki, nki.isa as nisa, nki.language as nl
p = torch.neuron.get_platform()
seen = {}
def k(x):
    seen.update(sbuf=nl.tile_size.sbuf_fmax_bytes, nc=int(nisa.get_nc_version()))
nki.simulate(k)(np.zeros((1, 1), np.float32))
def too_big(x):
    t = nl.ndarray((128, p["sbuf_partition_bytes"] // 4 + 1), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
try:
    nki.simulate(too_big)(np.zeros((1, 1), np.float32))
    rule = None
except nki.NkiValidationError as e:
    rule = e.rule
print(json.dumps(dict(platform=p, seen=seen, rule=rule, cap=torch.neuron.get_device_capability(0),
                      name=torch.neuron.get_device_name(0))))
"""


@pytest.mark.parametrize("name", ["trn2", "trn3"])
def test_get_platform_reports_what_the_verifier_enforces(name):
    out = run_python(_DEVICE_SIDE, env={"NEURON_PLATFORM": name, "NEURON_PLATFORM_TARGET_OVERRIDE": None})
    r = json.loads(out.strip().splitlines()[-1])
    p, (nc, sbuf) = r["platform"], DOCS[name]
    assert p["platform"] == name and p["nc_version"] == nc and p["partitions"] == 128
    assert p["sbuf_partition_bytes"] == sbuf == r["seen"]["sbuf"]
    assert p["sbuf_bytes_per_core"] == 128 * sbuf  # trn2: 28 MiB, trn3: 32 MiB
    assert p["psum_bytes_per_core"] == p["psum_banks"] * p["psum_bank_bytes"] * 128 == 2 * 1024 * KIB
    assert r["seen"]["nc"] == nc and r["cap"] == [nc, 0]
    assert r["rule"] == "sbuf-capacity"
    assert r["name"].startswith({"trn2": "Trainium2 NeuronCore-v3", "trn3": "Trainium3 NeuronCore-v4"}[name])


@pytest.mark.parametrize("name", ["trn1", "inf2"])
def test_torch_device_refuses_nki_only_platforms(name):
    out = run_python("import torch; print(torch.neuron.is_available(), torch.neuron.device_count())",
                     env={"NEURON_PLATFORM": name})
    assert out.strip().splitlines()[-1] == "False 0"
    run_python("import torch\ntry:\n    torch.empty(1, device='neuron')\nexcept RuntimeError as e:\n"
               f"    assert \"NEURON_PLATFORM='{name}' is not a known platform\" in str(e), e\nelse:\n    raise SystemExit(1)",
               env={"NEURON_PLATFORM": name})


def test_aws_tutorial_kernels_run_on_trn1(monkeypatch):
    # AWS's NKI tutorials set the target at import, as here.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    @nki.jit
    def add_matmul(a, b):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        s = nl.add(nl.load(a), nl.load(b))                      # [128, 512] in SBUF
        ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=s[:, 0:128], moving=s)  # s[:, :128].T @ s
        nl.store(out, nl.copy(ps))
        return out

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((128, 512), dtype=np.float32) for _ in range(2))
    got = nki.simulate(add_matmul)(a, b)
    s = a + b
    np.testing.assert_allclose(got, s[:, :128].T @ s, rtol=1e-4, atol=1e-3)

    # 200 KiB per partition fits NeuronCore-v3 (224 KiB) but not v2 (192 KiB).
    x = np.zeros((1, 1), np.float32)
    with pytest.raises(nki.NkiValidationError, match="trn1 has 196608 bytes per partition"):
        nki.simulate(_sbuf_tile(200 * KIB))(x)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    nki.simulate(_sbuf_tile(200 * KIB))(x)


def test_generation_names_and_unknown_targets(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")
    assert _seen_limits()["nc"] == 2
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ValueError, match="NKI target 'trn9' .*is not supported: use trn1"):
        nki.simulate(_sbuf_tile(4))(np.zeros((1, 1), np.float32))
