"""The NKI op table and name maps of the C++ core (nki._core, from csrc/nki/ir.h) are the only
numbering: every name Python uses round-trips through them, and nki.isa / nki.language expose
exactly the table's instructions."""

import ast
import inspect

import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl
from nki import _core, _dtypes, _ops

_MAPS = {name: getattr(_core, name) for name in ("OPS", "DTYPES", "ALU_OPS", "ACTIVATIONS", "ENGINES", "BUFFERS",
                                                 "REDUCE_CMDS", "DGE_MODES", "OOB_MODES")}


@pytest.mark.parametrize("name", sorted(_MAPS))
def test_codes_are_dense_and_names_unique(name):
    codes = sorted(_MAPS[name].values())
    assert codes == list(range(len(codes))), f"{name}: codes {codes}"
    assert len(set(_MAPS[name])) == len(codes)


def test_op_table_rows_round_trip_name_code_name():
    assert len(_core.OP_TABLE) == len(_core.OPS)
    for code, row in enumerate(_core.OP_TABLE):
        assert row["code"] == code
        assert _core.OPS[row["name"]] == code
        assert row["engine"] in _core.ENGINES and row["engine"] != "unknown"
        for kind in ("operands", "ints", "floats"):
            names = [p["name"] for p in row[kind]]
            assert len(set(names)) == len(names), (row["name"], kind)
            assert all(p["arity"] in ("one", "optional", "variadic") for p in row[kind])
            assert all(p["arity"] != "variadic" for p in row[kind][:-1]), (row["name"], kind)


def test_the_dtype_table_is_the_cores():
    assert _dtypes.DTYPE_CODE == _core.DTYPES
    assert list(_dtypes.DTYPES) == sorted(_core.DTYPES, key=_core.DTYPES.get)
    # nki.language's dtype names are exactly the table's, each the string of its own name
    assert {n for n in _core.DTYPES if getattr(nl, n, None) == n} == set(_core.DTYPES)
    for name in _core.DTYPES:
        assert nki.language.DType(getattr(nl, name)) == name
        assert _dtypes.itemsize(name) == _core.DTYPE_SIZES[name]
    assert _dtypes.itemsize("bfloat16") == 2 and _dtypes.itemsize("float8_e5m2") == 1


def test_every_alu_operator_and_activation_has_its_nl_function():
    for name, code in _core.ALU_OPS.items():
        fn = getattr(nl, name)
        assert _ops.alu(fn) == code, name
    for name, code in _core.ACTIVATIONS.items():
        fn = getattr(nl, name)
        assert _ops.act(fn) == code, name
    # and every nl function registered as an operator stands for the operator of its name
    for fn, code in _ops._alu.items():
        assert {"max": "maximum", "min": "minimum"}.get(fn.__name__, fn.__name__) == \
            next(n for n, c in _core.ALU_OPS.items() if c == code)
    for fn, code in _ops._act.items():
        assert fn.__name__ == next(n for n, c in _core.ACTIVATIONS.items() if c == code)


def test_isa_enums_the_core_interprets_are_the_cores():
    for enum, codes in ((nisa.engine, _core.ENGINES), (nisa.reduce_cmd, _core.REDUCE_CMDS),
                        (nisa.dge_mode, _core.DGE_MODES), (nisa.oob_mode, _core.OOB_MODES)):
        assert {e.name: int(e) for e in enum} == dict(codes), enum.__name__
        assert getattr(nisa.constants, enum.__name__) is enum
    # nki.language's memories: nl.hbm is the core's "hbm" (private HBM)
    assert {nl.hbm.value, nl.shared_hbm.value, nl.sbuf.value, nl.psum.value} == set(_core.BUFFERS.values())
    assert nl.hbm is nl.private_hbm and nl.hbm.value == _core.BUFFERS["hbm"]
    assert all(getattr(nl, n).value == c for n, c in _core.BUFFERS.items())


def test_coded_attributes_name_their_map():
    kinds = set()
    for row in _core.OP_TABLE:
        for p in row["ints"]:
            if p["code"] is not None:
                kinds.add(p["code"])
                assert p["code"].removesuffix(" or -1") in _MAPS, (row["name"], p)
        assert all(p.get("code") is None for p in row["floats"])
    assert kinds == {"ALU_OPS", "ALU_OPS or -1", "ACTIVATIONS", "ENGINES", "REDUCE_CMDS", "DGE_MODES", "OOB_MODES"}
    rows = {r["name"]: r for r in _core.OP_TABLE}
    assert [p["code"] for p in rows["activation"]["ints"]] == ["ACTIVATIONS", "REDUCE_CMDS"]
    assert [p["code"] for p in rows["tensor_scalar"]["ints"]] == ["ALU_OPS", None, "ALU_OPS or -1", None]


# ---- bad codes from a hand-built kernel: a clear error, never an index into a table ----------

def _builder():
    b = _core.KernelBuilder("trn2")
    sb, f32 = _core.BUFFERS["sbuf"], _core.DTYPES["float32"]
    return b, b.tensor(sb, f32, [4, 8], "x", "k.py", 3, -1), b.tensor(sb, f32, [4, 8], "y", "k.py", 4, -1)


def _whole(t):
    return (t, 0, [(8, 4), (1, 8)], -1, 0, 0, 0, False)


@pytest.mark.parametrize("code", [-1, len(_core.DTYPES), 255, 1 << 20])
def test_a_dtype_code_outside_the_table_is_a_value_error(code):
    b, x, _ = _builder()
    with pytest.raises(ValueError, match=rf"dtype code {code} is not an NKI dtype; the codes are 0\.\.13"):
        b.tensor(_core.BUFFERS["sbuf"], code, [4, 8], "z", "k.py", 5, -1)
    with pytest.raises(ValueError, match=rf"dtype code {code} is not an NKI dtype"):
        b.alias(x, code, [4, 8], "z", "k.py", 5)
    with pytest.raises(ValueError, match="memory code"):
        b.tensor(len(_core.BUFFERS) if code >= 0 else code, _core.DTYPES["float32"], [4, 8], "z", "k.py", 5, -1)
    with pytest.raises(ValueError, match="alias of tensor 7, which is not declared"):
        b.alias(7, _core.DTYPES["float32"], [4, 8], "z", "k.py", 5)
    # good codes still declare
    assert b.alias(x, _core.DTYPES["int32"], [4, 8], "xi", "k.py", 6) == 2


@pytest.mark.parametrize("access, message", [
    ((0, 0, [(8, 4), (1, 8)]), "an operand access is an 8-tuple"),
    ((0, 0.5, [(8, 4), (1, 8)], -1, 0, 0, 0, False), "the offset of an operand access is not an integer"),
    ((0, 0, [(8, 4, 1)], -1, 0, 0, 0, False), r"a dim of an access is \(stride, size\)"),
    ((0, 0, 7, -1, 0, 0, 0, False), "the dims of an operand access are a sequence"),
    ((0, 0, [(8, "4")], -1, 0, 0, 0, False), "a size of an operand access is not an integer"),
])
def test_a_malformed_operand_access_is_a_type_error(access, message):
    b, x, y = _builder()
    with pytest.raises(TypeError, match=message):
        b.instr(_core.OPS["tensor_copy"], [_whole(y), access], [], [], "k.py", 9)
    # the well-formed one still records (numpy integers too)
    b.instr(_core.OPS["tensor_copy"], [_whole(y), (np.int64(x), 0, ((8, 4), (1, 8)), -1, 0, 0, 0, False)], [], [],
            "k.py", 9)
    assert b.num_instructions == 1


@pytest.mark.parametrize("op, ints, attr", [
    ("tensor_scalar", lambda: [len(_core.ALU_OPS), 0, -1, 0], "op0"),
    ("tensor_scalar", lambda: [_core.ALU_OPS["add"], 0, -2, 0], "op1"),
    ("activation", lambda: [len(_core.ACTIVATIONS), 0], "op"),
    ("activation", lambda: [_core.ACTIVATIONS["exp"], len(_core.REDUCE_CMDS)], "reduce_cmd"),
    ("tensor_copy", lambda: [len(_core.ENGINES)], "engine"),
])
def test_an_attribute_code_outside_its_enum_is_a_verifier_error(op, ints, attr):
    b, x, y = _builder()
    floats = {"tensor_scalar": [1.0, 0.0], "activation": [1.0, 0.0]}.get(op, [])
    b.instr(_core.OPS[op], [_whole(y), _whole(x)], ints(), floats, "k.py", 9)
    with pytest.raises(nki.NkiValidationError, match=rf"\[ir-code\] {op}: attribute '{attr}' is -?\d+, which is not") as e:
        b.build(nki.NkiValidationError)
    assert (e.value.rule, e.value.filename, e.value.lineno) == ("ir-code", "k.py", 9)


def test_isa_enum_arguments_take_their_enums_values_only():
    @nki.jit
    def copy(x, mode):
        out = nl.ndarray(x.shape, x.dtype, nl.shared_hbm)
        t = nl.ndarray(x.shape, x.dtype, nl.sbuf)
        nisa.dma_copy(dst=t, src=x, oob_mode=mode)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(nki.simulate(copy)(x, nisa.oob_mode.skip), x)
    np.testing.assert_array_equal(nki.simulate(copy)(x, 0), x)  # a code is its enum's value
    with pytest.raises(ValueError, match=r"oob_mode=7 is not a nisa.oob_mode; use one of nisa.oob_mode.error, "
                                         r"nisa.oob_mode.skip"):
        nki.simulate(copy)(x, 7)
    with pytest.raises(ValueError, match=r"reduce_cmd='reset' is not a nisa.reduce_cmd"):
        nki.simulate(_activation_with_cmd)(x, "reset")


@nki.jit
def _activation_with_cmd(x, cmd):
    out = nl.ndarray(x.shape, x.dtype, nl.shared_hbm)
    t = nl.load(x)
    nisa.activation(dst=t, op=nl.exp, data=t, reduce_cmd=cmd)
    nl.store(out, t)
    return out


def _emits(module):
    """(function name, emitted op name, int attribute names, float attribute names) for each
    ``....emit("op", ...)`` call in a module's source."""
    out = []
    for fn in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "emit":
                op = call.args[0]
                assert isinstance(op, ast.Constant), f"{fn.name}: emit() takes the op's name as a literal"
                attrs = {"ints": ast.Dict(keys=[], values=[]), "floats": ast.Dict(keys=[], values=[])}
                for kind, node in zip(("ints", "floats"), call.args[2:4]):
                    attrs[kind] = node
                for kw in call.keywords:
                    if kw.arg in attrs:
                        attrs[kw.arg] = kw.value
                keys = {k: [c.value for c in v.keys] if isinstance(v, ast.Dict) else None for k, v in attrs.items()}
                out.append((fn.name, op.value, keys["ints"], keys["floats"]))
    return out


def test_isa_emits_each_instruction_under_its_own_name_with_the_tables_attributes():
    rows = {r["name"]: r for r in _core.OP_TABLE}
    emitted = _emits(nisa)
    for fn, op, ints, floats in emitted:
        assert op in rows, f"nisa.{fn} emits {op!r}, which is not in the op table"
        assert op == fn, f"nisa.{fn} emits {op!r}"
        for kind, keys in (("ints", ints), ("floats", floats)):
            assert keys is not None, f"nisa.{fn}: {kind} are given as a dict literal"
            assert set(keys) <= {p["name"] for p in rows[op][kind]}, (fn, kind, keys)
    # nki.isa has one function per instruction of the table (nl.device_print is nki.language's)
    instructions = {op for _, op, _, _ in emitted}
    assert instructions == set(rows) - {"device_print"}
    for name in instructions:
        assert name in nisa.__all__ and callable(getattr(nisa, name))
    assert [op for _, op, _, _ in _emits(nl)] == ["device_print"]
    assert callable(nl.device_print)


def test_an_attribute_the_table_does_not_name_is_refused_while_tracing():
    from nki._trace import _layout

    params = [("op", "one"), ("negate", "one"), ("axis", "variadic")]
    assert _layout("tensor_reduce", params, {"op": 3, "negate": False, "axis": [1, 2]}, int) == [3, 0, 1, 2]
    with pytest.raises(TypeError, match="no attribute"):
        _layout("tensor_reduce", params, {"op": 3, "negate": 0, "axes": [1]}, int)
    with pytest.raises(TypeError, match="needs its attribute 'negate'"):
        _layout("tensor_reduce", params, {"op": 3}, int)


def test_a_kernel_records_attributes_by_name_and_computes_as_before():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, nl.shared_hbm)
        t = nl.load(x)
        r = nl.ndarray((x.shape[0], 1), nl.float32, nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.maximum, data=t, axis=1, negate=True)
        y = nl.ndarray(x.shape, nl.float32, nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.subtract, operand0=r, reverse0=True, op1=nl.multiply, operand1=2.0)
        nl.store(out, y)
        return out

    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    want = (-x.max(axis=1, keepdims=True) - x) * 2.0
    np.testing.assert_allclose(nki.simulate(kernel)(x), want, rtol=1e-6)
