"""Packaging and process-level behaviour, each in a fresh interpreter: autoload, the
torch-version guard, platform env vars, collect_env, fork safety. What the wheel holds."""

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest


def test_autoload_registers_the_device_without_import(run_python):
    out = run_python(
        "import sys, torch\n"
        "print(torch.randn(2, 2, device='neuron') @ torch.ones(2, 2, device='neuron'))\n"
        "print('torch_neuronx' in sys.modules, torch.neuron.__name__)\n"
    )
    assert "device='neuron:0'" in out
    assert "True torch_neuronx.neuron" in out


def test_autoload_can_be_disabled(run_python):
    out = run_python(
        "import torch\n"
        "print(hasattr(torch, 'neuron'))\n"
        "import torch_neuronx\n"
        "print(torch.ones(1, device='neuron').device)\n",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert out.split() == ["False", "neuron:0"]


def test_importing_torch_neuronx_first_works(run_python):
    out = run_python("import torch_neuronx, torch\nprint(torch.zeros(1, device='neuron').device)\n")
    assert out.strip() == "neuron:0"


def test_torch_version_mismatch_is_an_import_error(run_python):
    out = run_python(
        "import torch\n"
        "torch.__version__ = '2.99.1'\n"
        "try:\n"
        "    import torch_neuronx\n"
        "except ImportError as e:\n"
        "    print('IMPORTERROR', e)\n",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert "IMPORTERROR" in out
    assert "built against torch 2.13.0" in out and "torch 2.99.1 is installed" in out
    assert "pip install torch==2.13.0" in out


@pytest.mark.parametrize(
    "env,count,memory,platform",
    [
        ({}, 4, 24 * 2**30, "trn2"),
        ({"NEURON_PLATFORM": "trn3"}, 4, 36 * 2**30, "trn3"),
        ({"NEURON_LOGICAL_NC_CONFIG": "1"}, 8, 12 * 2**30, "trn2"),
        ({"NEURON_RT_VISIBLE_CORES": "1,3"}, 2, 24 * 2**30, "trn2"),
        ({"NEURON_RT_NUM_CORES": "1"}, 1, 24 * 2**30, "trn2"),
    ],
)
def test_platform_env_vars(run_python, env, count, memory, platform):
    out = run_python(
        "import torch\n"
        "p = torch.neuron.get_device_properties(0)\n"
        "print(torch.neuron.device_count(), p.total_memory, p.platform, torch.neuron.is_fp8_supported())\n",
        env=env,
    )
    n, mem, plat, fp8 = out.split()
    assert (int(n), int(mem), plat) == (count, memory, platform)
    assert fp8 == str(platform == "trn3")


def test_visible_cores_map_to_logical_cores(run_python):
    out = run_python(
        "import torch\np = torch.neuron.get_device_properties(1)\nprint(p.logical_core, p.physical_cores)\n",
        env={"NEURON_RT_VISIBLE_CORES": "1,3"},
    )
    assert out.strip() == "3 [6, 7]"


def test_bad_platform_env_is_a_clear_error(run_python):
    out = run_python(
        "import torch\n"
        "print(torch.neuron.is_available())\n"
        "try:\n"
        "    torch.ones(1, device='neuron')\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n",
        env={"NEURON_RT_VISIBLE_CORES": "0-9"},
    )
    assert out.startswith("False")
    assert "NEURON_RT_VISIBLE_CORES names core 4" in out and "4 logical cores" in out


def test_collect_env_passes_here(run_python):
    out = run_python("", args=["-m", "torch_neuronx.collect_env"], quiet=True)
    assert "built against torch:        2.13.0" in out
    assert "visible devices:            4" in out
    assert "Smoke test: passed on 4 device(s)" in out
    assert "neuron device is usable" in out


@pytest.mark.parametrize("env", [{"NEURON_RT_VISIBLE_CORES": ""}, {"NEURON_PLATFORM": "trn9"}])
def test_collect_env_fails_when_device_unusable(run_python, env):
    out = run_python("", args=["-m", "torch_neuronx.collect_env"], env=env, expect_rc=1)
    assert "neuron device is NOT usable" in out


def test_importing_transformers_prints_nothing(run_python):
    # Transformers imports torchao, whose CUDA-only extensions cannot load on this torch and
    # whose enums torch warns about: none of that is about the user's code.
    pytest.importorskip("torchao")
    run_python("import torch\nfrom transformers import LlamaForCausalLM\n", quiet=True)


def test_other_torchao_and_pytree_warnings_still_show(run_python):
    pytest.importorskip("torchao")
    out = run_python(
        "import enum, logging, os, sys, torch, torchao\n"
        "sys.stderr = sys.stdout\n"
        "logging.getLogger('torch.utils._pytree').addHandler(logging.StreamHandler(sys.stdout))\n"
        "d = os.path.dirname(torchao.__file__)\n"
        "log = logging.getLogger('torchao')\n"
        "for name in ('_C.abi3.so', '_C_mxfp8.cpython-311-x86_64-linux-gnu.so'):\n"
        "    log.warning(f'Failed to load {os.path.join(d, name)}: Could not load this library')\n"
        "log.warning(f'Failed to load /elsewhere/_C_mxfp8.so: Could not load this library')\n"
        "class Mine(str, enum.Enum):\n"
        "    A = 'a'\n"
        "torch.utils._pytree.register_constant(Mine)\n"
    )
    assert "_C.abi3.so: Could not load" in out  # another torchao extension
    assert "/elsewhere/_C_mxfp8.so" in out  # not torchao's own
    assert "_C_mxfp8.cpython" not in out
    assert "Mine'> is an Enum subclass" in out  # the user's enum


def test_use_after_fork_raises_advising_spawn(run_python):
    out = run_python(
        "import os, torch\n"
        "x = torch.ones(4, device='neuron')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        x + 1\n"
        "        os._exit(3)\n"
        "    except RuntimeError as e:\n"
        "        ok = 'forked subprocess' in str(e) and \"'spawn'\" in str(e)\n"
        "        os._exit(0 if ok else 4)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
        "print('parent', (x + 1).sum().item())\n"
    )
    assert out.split() == ["child", "0", "parent", "8.0"]


def test_spawned_children_can_use_the_device(run_python, tmp_path):
    script = tmp_path / "spawn_child.py"
    script.write_text(
        "import torch, torch.multiprocessing as mp\n"
        "def work(q):\n"
        "    q.put((torch.arange(4, device='neuron') * 2).sum().item())\n"
        "if __name__ == '__main__':\n"
        "    torch.ones(1, device='neuron')\n"
        "    ctx = mp.get_context('spawn')\n"
        "    q = ctx.Queue()\n"
        "    p = ctx.Process(target=work, args=(q,))\n"
        "    p.start(); print(q.get(timeout=120)); p.join(timeout=120)\n"
    )
    out = run_python("", args=[str(script)])
    assert out.strip() == "12"


_REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
# The test harness that lives in the repository's coverage/ folder, never in the installed package.
_COVERAGE_ONLY = {"_sweep.py", "_models_specs.py", "_diffusers_specs.py", "_tiny_configs.py", "_nn_probe.py",
                  "cuda_only_ops.py"}


def _package_files(name: str) -> list[Path]:
    """The ``.py`` files of the installed (or editable) package ``name``."""
    spec = importlib.util.find_spec(name)
    return [f for d in spec.submodule_search_locations for f in Path(d).rglob("*.py")]


def test_installed_package_holds_no_sweep_or_catalog():
    files = _package_files("torch_neuronx") + _package_files("nki")
    assert any(f.name == "_compare.py" for f in files)  # the walk sees torch_neuronx.testing
    tomllib = pytest.importorskip("tomllib")
    harness = [str(f) for f in files if f.name.endswith("_sweep.py") or f.name in _COVERAGE_ONLY]
    assert not harness, f"coverage sweeps or catalogs inside the installed package: {harness}"
    with open(_REPO / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["tool"]["scikit-build"]["wheel"]["packages"] == ["torch_neuronx", "nki"]
    # ... and they are where `make coverage-*` runs them from
    swept = set(re.findall(r"\$\(PY\) (coverage/\w+\.py)", (_REPO / "Makefile").read_text()))
    assert len(swept) == 4 and all((_REPO / s).is_file() for s in swept), swept  # hf, opinfo, fake, compiled
    assert all((_REPO / "coverage" / n).is_file() for n in _COVERAGE_ONLY)


def test_package_imports_only_declared_dependencies_at_module_level():
    """Importing a module of the wheel may need only the standard library, the declared
    dependencies and the wheel itself; optional packages (transformers, numpy, ...) are imported
    where they are used."""
    tomllib = pytest.importorskip("tomllib")
    with open(_REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    allowed = set(sys.stdlib_module_names) | {"torch_neuronx", "nki"}
    allowed |= {re.match(r"[A-Za-z0-9_.-]+", d).group(0).replace("-", "_") for d in project["dependencies"]}
    undeclared = []
    for path in _package_files("torch_neuronx") + _package_files("nki"):
        # the vLLM platform plugin's modules subclass vLLM's classes; only vLLM imports them (its
        # entry point names torch_neuronx.vllm, whose __init__ imports no vLLM)
        plugin = path.parent.name == "vllm" and path.parent.parent.name == "torch_neuronx" and path.name != "__init__.py"
        for stmt in ast.parse(path.read_text(), str(path)).body:
            # what runs at import: module-level statements, and the bodies of module-level if/try
            for node in ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else (stmt,):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                undeclared += [f"{path.name}:{node.lineno} {n}" for n in names
                               if n.split(".")[0] not in allowed and not (plugin and n.split(".")[0] == "vllm")]
    assert not undeclared, f"module-level imports of packages torch-neuronx does not depend on: {undeclared}"
