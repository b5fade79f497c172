// GoogleTest suite for the NKI verifier (csrc/nki/verify.cpp): for every rule it enforces, a
// kernel built by hand in the IR that breaks it, the error it gets (rule name, and the message's
// key words: what is wrong and how to fix it), and where useful the kernel that just fits.
// Every op has a well-formed one-instruction kernel (FittingKernel); the rules that many ops share
// are checked op by op on mutations of it. Python-level tests of the same rules through nki.isa
// are in tests/nki/test_nki_verifier.py; this file is for the rules themselves.
//
// Rules covered (docs/nki.md, "Verifier rules"), with the checks of verify.cpp behind each:
//   partition-limit        declarations: at most 128 partitions (VerifierDeclarations)
//   ir-code                enum codes out of range: every coded attribute of every op, a declaration's dtype
//                          and memory (VerifierCodes)
//   on-chip-rank           1-D SBUF/PSUM declarations; 0-D on-chip accesses (VerifierDeclarations, VerifierAccesses)
//   sbuf-capacity          one declaration; the live tensors at an instruction (VerifierDeclarations, VerifierCapacity)
//   psum-capacity          likewise, PSUM in whole 2 KiB banks (VerifierDeclarations, VerifierCapacity)
//   out-of-bounds          empty dimensions, accesses outside the tensor or across partitions, index reads past
//                          the index tensor (VerifierAccesses, VerifierDynamicOffsets)
//   partition-access       strided partition dimension (VerifierAccesses)
//   dynamic-offset         unknown / non-SBUF / float index tensors; vector offsets outside DMA, on the on-chip
//                          side, on dma_transpose's destination or without swdge; one row per offset
//                          (VerifierDynamicOffsets)
//   engine-memory          every compute operand in HBM, op by op; nonzero_with_count, sendrecv, core_barrier
//   gpsimd-psum            iota, affine_select, partition reduce, GpSimd tensor_copy / tensor_tensor, nc_n_gather,
//                          local_gather
//   dma-psum               dma_copy, dma_compute, dma_transpose
//   psum-operands          tensor_tensor, scan, scalar_tensor_tensor, select, copy_predicated, select_reduce
//   shape-mismatch         same layout and (P, 1) columns, op by op; every op's own shape checks
//   dtype                  bitwise operators on floats; arithmetic-only ops; dtype lists; float32 operands; the
//                          ops' own dtype checks
//   alu-op                 reduce operators; range_select's comparisons and fill value; activate2's op pairs
//   nc-version             exponential, activate2 before NeuronCore-v4
//   matmul-memory          nc_matmul operands and result; Tensor-engine transposes
//   matmul-contraction     unequal contraction sizes
//   matmul-stationary-free, matmul-moving-free (trn2 512; trn3 4096 fp32 / 8192 bf16), matmul-dtype (every case)
//   transpose-limit        Tensor engine 128 x 128, Vector engine 32 x 32
//   reduce-axis            no axis, the partition axis, non-trailing axes
//   bn-stats-free, dma-transpose (every case), quadrant, shuffle-mask
// Unreachable checks (each test named ...Unreachable... shows the rule that fires first):
//   * matmul-contraction's "at most 128": both operands must be SBUF tensors, whose declarations have at most
//     128 partitions (partition-limit), and an access covers at most its tensor's partitions (out-of-bounds).
//   * dma-transpose's hwdge "src.shape[-1] <= 128": every permutation makes src.shape[-1] the destination's
//     partition dimension, and the destination is in SBUF (at most 128 partitions).
// Rules checked by the Python front end before the IR exists (kernel-output, memset's whole numbers, iota's
// pattern size, activation's reduce_op, dma_compute's sources and scales, sendrecv ranks, core_barrier cores,
// GpSimd memset / tensor_scalar on PSUM) are tested in tests/nki/test_nki_verifier.py.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nki/ir.h"
#include "nki_builders.h"

using namespace nki_test;

namespace {

using B = nk::Buffer;
using D = nk::DType;
using O = nk::Op;
constexpr B kSb = B::kSbuf, kPs = B::kPsum, kHbm = B::kSharedHbm;
constexpr int kDeclLine = 7, kLine = 42;  // where every declaration / instruction is, unless a test says

constexpr int64_t alu(nk::Alu a) { return static_cast<int64_t>(a); }
constexpr int64_t act(nk::Act a) { return static_cast<int64_t>(a); }
constexpr int64_t kAdd = alu(nk::Alu::kAdd), kSub = alu(nk::Alu::kSubtract), kMul = alu(nk::Alu::kMultiply),
                  kDiv = alu(nk::Alu::kDivide), kMax = alu(nk::Alu::kMaximum), kAbsMax = alu(nk::Alu::kAbsMax),
                  kEq = alu(nk::Alu::kEqual), kGe = alu(nk::Alu::kGreaterEqual), kLt = alu(nk::Alu::kLess),
                  kAnd = alu(nk::Alu::kBitwiseAnd), kOr = alu(nk::Alu::kBitwiseOr), kBypass = alu(nk::Alu::kBypass);
constexpr int64_t kGpSimd = static_cast<int64_t>(nk::Engine::kGpSimd), kTensorE = static_cast<int64_t>(nk::Engine::kTensor);
const double kFp32Min = -std::numeric_limits<float>::max();

// A kernel under construction: a declaration returns the whole tensor as an access.
struct Kb {
  nk::Kernel k;
  explicit Kb(const char* target = "trn2") : k{nk::target_for(target), {}, {}} {}
  nk::Access decl(B b, std::vector<int64_t> shape, D d = D::kFloat32, int line = kDeclLine) {
    return whole(k, tensor(k, b, d, std::move(shape), -1, line));
  }
  nk::Access sb(std::vector<int64_t> shape, D d = D::kFloat32) { return decl(kSb, std::move(shape), d); }
  nk::Access ps(std::vector<int64_t> shape, D d = D::kFloat32) { return decl(kPs, std::move(shape), d); }
  nk::Access hbm(std::vector<int64_t> shape, D d = D::kFloat32) { return decl(kHbm, std::move(shape), d); }
  Kb& op(O o, std::vector<nk::Access> args, std::vector<int64_t> ints = {}, std::vector<double> floats = {},
         int line = kLine) {
    instr(k, o, std::move(args), std::move(ints), std::move(floats), line);
    return *this;
  }
};

// verify(k) throws a VerifyError of `rule` whose message holds every one of `words`.
::testing::AssertionResult Breaks(const char* kexpr, const char*, const char*, const nk::Kernel& k,
                                  const std::string& rule, const std::vector<std::string>& words) {
  try {
    nk::verify(k);
  } catch (const nk::VerifyError& e) {
    const std::string m = e.what();
    if (e.rule != rule) {
      return ::testing::AssertionFailure() << kexpr << " broke '" << e.rule << "', not '" << rule << "': " << m;
    }
    for (const std::string& w : words) {
      if (m.find(w) == std::string::npos) {
        return ::testing::AssertionFailure() << "the '" << rule << "' message lacks \"" << w << "\": " << m;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << kexpr << " threw something else than a VerifyError: " << e.what();
  }
  return ::testing::AssertionFailure() << kexpr << " was accepted; expected rule '" << rule << "'";
}
#define EXPECT_BREAKS(k, rule, ...) EXPECT_PRED_FORMAT3(Breaks, k, rule, (std::vector<std::string>{__VA_ARGS__}))

::testing::AssertionResult Fits(const char* kexpr, const nk::Kernel& k) {
  try {
    nk::verify(k);
  } catch (const nk::VerifyError& e) {
    return ::testing::AssertionFailure() << kexpr << " broke '" << e.rule << "': " << e.what();
  }
  return ::testing::AssertionSuccess();
}
#define EXPECT_FITS(k) EXPECT_PRED_FORMAT1(Fits, k)

// The error verify(k) throws (a test failure if none).
nk::VerifyError error_of(const nk::Kernel& k) {
  try {
    nk::verify(k);
  } catch (const nk::VerifyError& e) {
    return e;
  }
  ADD_FAILURE() << "the kernel was accepted";
  return nk::VerifyError("", "", {});
}

// A well-formed kernel of one `op` instruction, each operand its own tensor (SBUF [32, 8] fp32
// unless the op needs otherwise), written as nki.isa emits it.
Kb fitting(O op) {
  Kb b(op == O::kExponential || op == O::kActivate2 ? "trn3" : "trn2");
  auto t = [&](std::vector<int64_t> s = {32, 8}, D d = D::kFloat32) { return b.sb(std::move(s), d); };
  auto col = [&](D d = D::kFloat32) { return b.sb({32, 1}, d); };
  switch (op) {
    case O::kDmaCopy: b.op(op, {t(), b.hbm({32, 8})}, {0}); break;
    case O::kTensorCopy: b.op(op, {t(), t()}, {0}); break;
    case O::kMemset: b.op(op, {t()}, {}, {1.0}); break;
    case O::kIota: b.op(op, {t({32, 8}, D::kInt32)}, {0, 1, 1, 8}); break;
    case O::kMatmul: b.op(op, {b.ps({8, 16}), t({32, 8}, D::kBFloat16), t({32, 16}, D::kBFloat16)}, {-1, 0}); break;
    case O::kTranspose: b.op(op, {b.ps({8, 32}), t({32, 8})}, {0}); break;
    case O::kTensorTensor: b.op(op, {t(), t(), t()}, {kAdd, 0}); break;
    case O::kTensorScalar: b.op(op, {t(), t(), col(), col()}, {kAdd, 0, kMul, 0}, {0, 0}); break;
    case O::kActivation: b.op(op, {t(), t(), col(), col(), col()}, {act(nk::Act::kExp), 0}, {1, 0}); break;
    case O::kTensorReduce: b.op(op, {t({32, 1}), t()}, {kAdd, 0, 1}); break;
    case O::kTensorTensorScan: b.op(op, {t(), t(), t(), col()}, {kMul, kAdd, 0, 0}, {0}); break;
    case O::kAffineSelect: b.op(op, {t(), t()}, {kEq, 0, 1, 1, 8}, {0}); break;
    case O::kBnStats: b.op(op, {t({32, 6}), t()}); break;
    case O::kBnAggr: b.op(op, {t({32, 2}), t({32, 6})}); break;
    case O::kMax8: b.op(op, {t(), t({32, 16})}); break;
    case O::kFindIndex8: b.op(op, {t({32, 8}, D::kUInt32), t({32, 16}), t()}); break;
    case O::kReciprocal: b.op(op, {t(), t()}); break;
    case O::kPartitionReduce: b.op(op, {t({1, 8}), t()}, {kAdd}); break;
    case O::kScalarTensorTensor: b.op(op, {t(), t(), col(), t()}, {kMul, kAdd, 0, 0}, {0}); break;
    case O::kSelect: b.op(op, {t(), t({32, 8}, D::kUInt8), t(), col()}, {}, {0}); break;
    case O::kCopyPredicated: b.op(op, {t(), t(), t({32, 8}, D::kUInt8)}, {0}, {0}); break;
    case O::kSelectReduce: b.op(op, {t(), t({32, 8}, D::kUInt8), t(), col(), col()}, {0, 0}, {0}); break;
    case O::kRangeSelect: b.op(op, {t(), t(), col(), col(), col()}, {kGe, kLt, 0, 0}, {kFp32Min}); break;
    case O::kTensorScalarReduce: b.op(op, {t(), t(), col(), col(), col()}, {kMul, kAdd, 0, 0}, {0, 0}); break;
    case O::kTensorScalarCumulative: b.op(op, {t(), t(), col(), col()}, {kMul, kAdd, 0}, {0, 0}); break;
    case O::kExponential: b.op(op, {t(), t(), col(), col(), col()}, {0}, {0, 0}); break;
    case O::kActivate2:
      b.op(op, {t(), t(), col(), col(), col(), col()}, {act(nk::Act::kExp), kMul, kAdd, 0, 0, kAdd, 0}, {0, 0, 0});
      break;
    case O::kMatchReplace8: b.op(op, {t({32, 16}), t({32, 16}), t(), t({32, 8}, D::kUInt32)}, {}, {0}); break;
    case O::kStreamShuffle: {
      std::vector<int64_t> mask(32);
      for (int i = 0; i < 32; ++i) mask[i] = 31 - i;
      b.op(op, {t(), t()}, mask);
      break;
    }
    case O::kDmaTranspose: b.op(op, {t({8, 32}), b.hbm({32, 8})}, {0}); break;
    case O::kNGather: b.op(op, {t({32, 4}), t(), t({32, 4}, D::kUInt32)}); break;
    case O::kLocalGather: b.op(op, {t({32, 4}), t(), t({32, 2}, D::kUInt16)}, {1, 4}); break;
    case O::kNonzeroWithCount: b.op(op, {t({32, 9}, D::kInt32), t()}, {0, -1}); break;
    case O::kDmaCompute: b.op(op, {b.hbm({32, 8}), t(), b.hbm({32, 8})}, {0}, {1, 1}); break;
    case O::kSendRecv: b.op(op, {t(), t()}, {0, 0, 0}); break;
    case O::kCoreBarrier: b.op(op, {b.hbm({2, 8})}, {0}); break;
    case O::kDevicePrint: b.k.instrs.push_back({op, {t()}, {}, {}, {"kernel.py", kLine}, "x:"}); break;
  }
  return b;
}

// The fitting kernel of `op`, changed by `f`.
nk::Kernel mutated(O op, const std::function<void(nk::Kernel&)>& f) {
  nk::Kernel k = fitting(op).k;
  f(k);
  return k;
}
int tensor_of(const nk::Kernel& k, size_t slot) { return k.instrs.at(0).args.at(slot).tensor; }
// Operand `slot`'s tensor moves to memory `b`.
nk::Kernel with_buffer(O op, std::vector<size_t> slots, B b) {
  return mutated(op, [&](nk::Kernel& k) {
    for (size_t s : slots) k.tensors.at(tensor_of(k, s)).buffer = b;
  });
}
// Operand `slot`'s tensor gets another shape (the operand stays the whole tensor).
nk::Kernel with_shape(O op, size_t slot, std::vector<int64_t> shape) {
  return mutated(op, [&](nk::Kernel& k) {
    const int t = tensor_of(k, slot);
    k.tensors.at(t).shape = shape;
    k.instrs[0].args[slot] = whole(k, t);
  });
}
nk::Kernel with_dtype(O op, size_t slot, D d) {
  return mutated(op, [&](nk::Kernel& k) { k.tensors.at(tensor_of(k, slot)).dtype = d; });
}
nk::Kernel with_int(O op, size_t i, int64_t v) {
  return mutated(op, [&](nk::Kernel& k) { k.instrs[0].ints.at(i) = v; });
}

struct OperandCase {
  O op;
  size_t slot;
  std::string words;  // what the message calls the operand
};
std::string trace(const OperandCase& c) { return std::string(nk::op_name(c.op)) + " operand " + std::to_string(c.slot); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Every op has a kernel that fits: the rules below reject what they should and nothing else.
// ---------------------------------------------------------------------------------------------

TEST(NkiVerifier, EveryOpHasAFittingKernel) {
  for (int i = 0; i < nk::kNumOps; ++i) {
    const O op = static_cast<O>(i);
    SCOPED_TRACE(nk::op_name(op));
    const Kb b = fitting(op);
    ASSERT_EQ(b.k.instrs.size(), 1u) << "fitting() has no kernel for this op";
    EXPECT_FITS(b.k);
  }
}

// ---------------------------------------------------------------------------------------------
// Enum codes (ir-code): a hand-built IR may hold any integer where an enum is meant
// ---------------------------------------------------------------------------------------------

// Every int attribute the op table marks as a code, of every op, out of its enum's range on both
// sides: rule ir-code naming the attribute. Its highest code (and -1 where "none" is allowed)
// passes this rule; other rules (an operator the op does not support) may still refuse it.
TEST(VerifierCodes, EveryCodedAttributeOfEveryOpIsInItsEnum) {
  auto count_of = [](nk::Code c) {
    switch (c) {
      case nk::Code::kAlu: case nk::Code::kAluOrNone: return nk::kNumAlu;
      case nk::Code::kAct: return nk::kNumAct;
      case nk::Code::kEngine: return nk::kNumEngines;
      case nk::Code::kReduceCmd: return nk::kNumReduceCmds;
      case nk::Code::kDgeMode: return nk::kNumDgeModes;
      case nk::Code::kOobMode: return nk::kNumOobModes;
      case nk::Code::kInt: break;
    }
    return 0;
  };
  std::set<nk::Code> kinds;
  for (int i = 0; i < nk::kNumOps; ++i) {
    const O op = static_cast<O>(i);
    const auto& params = nk::op_info(op).ints;
    for (size_t j = 0; j < params.size(); ++j) {
      const nk::Param& p = params[j];
      if (p.code == nk::Code::kInt) continue;
      SCOPED_TRACE(std::string(nk::op_name(op)) + "." + p.name);
      const int n = count_of(p.code);
      auto with = [&](int64_t v) {
        return mutated(op, [&](nk::Kernel& k) {
          auto& ints = k.instrs[0].ints;
          if (ints.size() <= j) ints.resize(j + 1, 0);  // an optional attribute the fitting kernel leaves off
          ints[j] = v;
        });
      };
      const std::string attr = std::string("'") + p.name + "'";
      EXPECT_BREAKS(with(n), "ir-code", attr, "is " + std::to_string(n), "codes are 0.." + std::to_string(n - 1));
      EXPECT_BREAKS(with(1000), "ir-code", attr, "is 1000");
      EXPECT_BREAKS(with(-2), "ir-code", attr, "is -2");
      if (p.code != nk::Code::kAluOrNone) EXPECT_BREAKS(with(-1), "ir-code", attr, "is -1");
      for (int64_t ok : {int64_t{n - 1}, int64_t{p.code == nk::Code::kAluOrNone ? -1 : 0}}) {
        try {
          nk::verify(with(ok));
        } catch (const nk::VerifyError& e) {
          EXPECT_NE(e.rule, "ir-code") << ok << ": " << e.what();
        }
      }
      kinds.insert(p.code);
    }
  }
  EXPECT_EQ(kinds.size(), 7u) << "every kind of code but kInt is some op's attribute";
}

TEST(VerifierCodes, DeclarationsHoldADtypeAndAMemory) {
  Kb dtype, memory;
  dtype.sb({4, 8});
  dtype.k.tensors[0].dtype = static_cast<D>(nk::kNumDTypes);
  memory.sb({4, 8});
  memory.k.tensors[0].buffer = static_cast<B>(nk::kNumBuffers);
  EXPECT_BREAKS(dtype.k, "ir-code", "'t0'", "dtype code " + std::to_string(nk::kNumDTypes), "not a dtype");
  EXPECT_BREAKS(memory.k, "ir-code", "'t0'", "memory code " + std::to_string(nk::kNumBuffers), "not a memory");
  EXPECT_EQ(error_of(dtype.k).loc.line, kDeclLine);
}

// ---------------------------------------------------------------------------------------------
// Declarations
// ---------------------------------------------------------------------------------------------

TEST(VerifierDeclarations, OnChipTensorsHaveAPartitionAndAFreeDimension) {
  for (B b : {kSb, kPs}) {
    Kb k;
    k.decl(b, {128}, D::kFloat32, 3);
    const nk::VerifyError e = error_of(k.k);
    EXPECT_EQ(e.rule, "on-chip-rank");
    EXPECT_EQ(e.loc.line, 3) << "a declaration's error points at the declaration";
    EXPECT_BREAKS(k.k, "on-chip-rank", "is 1-D", "use shape (P, F)");
  }
  Kb hbm;  // HBM tensors have any rank
  hbm.hbm({128});
  EXPECT_FITS(hbm.k);
}

TEST(VerifierDeclarations, PartitionLimit) {
  for (const char* target : {"trn1", "trn2", "trn3"}) {
    Kb fits(target), breaks(target);
    fits.ps({128, 4});
    breaks.ps({129, 4});
    EXPECT_FITS(fits.k);
    EXPECT_BREAKS(breaks.k, "partition-limit", "has 129 partitions", "at most 128", "nl.tile_size.pmax",
                  "tile the data along it");
  }
}

TEST(VerifierDeclarations, OneTensorFitsTheMemoryPerPartition) {
  Kb sbuf_fits, sbuf_breaks, psum_fits, psum_breaks;
  sbuf_fits.sb({128, 224 * 1024 / 2}, D::kBFloat16);  // trn2: 224 KiB per partition
  sbuf_breaks.sb({128, 224 * 1024 / 2 + 1}, D::kBFloat16);
  psum_fits.ps({128, 4096});  // 8 banks of 2 KiB
  psum_breaks.ps({128, 4097});
  EXPECT_FITS(sbuf_fits.k);
  EXPECT_FITS(psum_fits.k);
  EXPECT_BREAKS(sbuf_breaks.k, "sbuf-capacity", "needs 229378 bytes per partition", "trn2 has 229376");
  EXPECT_BREAKS(psum_breaks.k, "psum-capacity", "needs 16388 bytes per partition", "trn2 has 16384");
}

// ---------------------------------------------------------------------------------------------
// Accesses
// ---------------------------------------------------------------------------------------------

TEST(VerifierAccesses, EmptyDimension) {
  Kb b;
  const nk::Access s = b.sb({32, 8});
  const nk::Access h = b.hbm({32, 8});
  b.op(O::kDmaCopy, {{s.tensor, 0, {{8, 0}, {1, 8}}}, {h.tensor, 0, {{8, 0}, {1, 8}}}}, {0});
  EXPECT_BREAKS(b.k, "out-of-bounds", "has an empty dimension");
}

TEST(VerifierAccesses, StaysInsideItsTensor) {
  for (int64_t offset : {int64_t{8}, int64_t{-1}}) {
    Kb b;
    const nk::Access s = b.sb({32, 8});
    nk::Access h = b.hbm({32, 8});
    h.offset = offset;  // one row past the end, or one element before the start
    b.op(O::kDmaCopy, {s, h}, {0});
    EXPECT_BREAKS(b.k, "out-of-bounds", "reaches element " + std::to_string(offset == 8 ? 263 : -1),
                  "of a tensor of shape [32, 8] (256 elements)");
  }
  Kb fits;  // the last 31 rows
  const nk::Access s = fits.sb({31, 8});
  nk::Access h = fits.hbm({32, 8});
  h.offset = 8;
  h.dims[0].size = 31;
  fits.op(O::kDmaCopy, {s, h}, {0});
  EXPECT_FITS(fits.k);
}

TEST(VerifierAccesses, OnChipAccessesAreAtLeastOneDimensional) {
  Kb b;
  const nk::Access s = b.sb({32, 8});
  b.op(O::kMemset, {{s.tensor, 0, {}}}, {}, {0});
  EXPECT_BREAKS(b.k, "on-chip-rank", "memset: a 0-D access to");
}

TEST(VerifierAccesses, PartitionsAreContiguous) {
  Kb b;
  const nk::Access s = b.sb({32, 8});
  b.op(O::kMemset, {{s.tensor, 0, {{16, 16}, {1, 8}}}}, {}, {0});  // every other partition
  EXPECT_BREAKS(b.k, "partition-access", "steps 16 elements along the partition dimension",
                "cover a contiguous range of partitions");
  Kb fits;  // partitions 8..23
  const nk::Access f = fits.sb({32, 8});
  fits.op(O::kMemset, {{f.tensor, 64, {{8, 16}, {1, 8}}}}, {}, {0});
  EXPECT_FITS(fits.k);
}

TEST(VerifierAccesses, FreeElementsStayInTheirPartition) {
  Kb b;
  const nk::Access s = b.sb({32, 8});
  b.op(O::kMemset, {{s.tensor, 4, {{8, 4}, {1, 8}}}}, {}, {0});  // columns 4..11 of rows 0..3
  EXPECT_BREAKS(b.k, "out-of-bounds", "crosses from one partition's free elements into another's",
                "free offsets 4..11 of 8");
  Kb fits;  // columns 4..7, reversed
  const nk::Access f = fits.sb({32, 8});
  fits.op(O::kMemset, {{f.tensor, 7, {{8, 4}, {-1, 4}}}}, {}, {0});
  EXPECT_FITS(fits.k);
}

// ---------------------------------------------------------------------------------------------
// Run-time offsets (ap(scalar_offset= / vector_offset=), select, vector_select)
// ---------------------------------------------------------------------------------------------

namespace {

// dma_copy of `rows` rows of an HBM [16, 8] tensor, gathered by a vector offset read from `index`,
// into an SBUF [dst_rows, 8] tile (dma_transpose: into an SBUF [8, dst_rows] tile).
Kb gather_rows(B index_buffer, D index_dtype, int64_t index_elements, int64_t rows, int64_t dst_rows,
               O op = O::kDmaCopy) {
  Kb b;
  const nk::Access dst = b.sb(op == O::kDmaTranspose ? std::vector<int64_t>{8, dst_rows} : std::vector<int64_t>{dst_rows, 8});
  const nk::Access src = b.hbm({16, 8});
  const nk::Access idx = b.decl(index_buffer, {1, index_elements}, index_dtype);
  nk::Access a{src.tensor, 0, {{8, rows}, {1, 8}}, {idx.tensor, 0, 1, 8, true}};
  b.op(op, {dst, a}, {op == O::kDmaTranspose ? 1 : 0});
  return b;
}

}  // namespace

TEST(VerifierDynamicOffsets, FittingVectorOffset) {
  EXPECT_FITS(gather_rows(kSb, D::kInt32, 4, 4, 4).k);
  EXPECT_FITS(gather_rows(kSb, D::kUInt32, 4, 4, 4).k);
}

TEST(VerifierDynamicOffsets, IndexTensorMustExist) {
  Kb b = gather_rows(kSb, D::kInt32, 4, 4, 4);
  b.k.instrs[0].args[1].index.tensor = 99;
  EXPECT_BREAKS(b.k, "dynamic-offset", "names an unknown index tensor");
}

TEST(VerifierDynamicOffsets, OffsetsAreReadFromSbuf) {
  for (B where : {kHbm, kPs}) {
    EXPECT_BREAKS(gather_rows(where, D::kInt32, 4, 4, 4).k, "dynamic-offset", "offsets are read from SBUF",
                  "copy them there with nisa.dma_copy");
  }
}

TEST(VerifierDynamicOffsets, OffsetsAreIntegers) {
  EXPECT_BREAKS(gather_rows(kSb, D::kFloat32, 4, 4, 4).k, "dynamic-offset", "from a float32 tensor",
                "offsets are integers");
}

TEST(VerifierDynamicOffsets, OffsetsStayInsideTheIndexTensor) {
  EXPECT_BREAKS(gather_rows(kSb, D::kInt32, 3, 4, 4).k, "out-of-bounds",
                "reads 4 value(s) past the end of its index tensor");
  Kb scalar;  // a scalar offset at element 5 of a 4-element index
  const nk::Access s = scalar.sb({1, 8});
  const nk::Access h = scalar.hbm({16, 8});
  const nk::Access idx = scalar.sb({1, 4}, D::kInt32);
  scalar.op(O::kDmaCopy, {s, {h.tensor, 0, {{8, 1}, {1, 8}}, {idx.tensor, 5, 0, 8, false}}}, {0});
  EXPECT_BREAKS(scalar.k, "out-of-bounds", "reads 1 value(s) past the end");
}

TEST(VerifierDynamicOffsets, VectorOffsetsAreADmaFeature) {
  Kb b;
  const nk::Access dst = b.sb({4, 8});
  const nk::Access src = b.sb({16, 8});
  const nk::Access idx = b.sb({1, 4}, D::kInt32);
  b.op(O::kTensorCopy, {dst, {src.tensor, 0, {{8, 4}, {1, 8}}, {idx.tensor, 0, 1, 8, true}}}, {0});
  EXPECT_BREAKS(b.k, "dynamic-offset", "vector_offset (a per-partition index) is a DMA feature",
                "nisa.dma_copy, nisa.dma_compute or nisa.dma_transpose(dge_mode=swdge)");
  Kb scalar;  // a scalar offset is fine on any engine
  const nk::Access d2 = scalar.sb({4, 8});
  const nk::Access s2 = scalar.sb({16, 8});
  const nk::Access i2 = scalar.sb({1, 1}, D::kInt32);
  scalar.op(O::kTensorCopy, {d2, {s2.tensor, 0, {{8, 4}, {1, 8}}, {i2.tensor, 0, 0, 8, false}}}, {0});
  EXPECT_FITS(scalar.k);
}

TEST(VerifierDynamicOffsets, IndirectDmaTransposeIndexesItsSourceWithSwdge) {
  Kb fits = gather_rows(kSb, D::kInt32, 4, 4, 4, O::kDmaTranspose);  // [4, 8] rows -> [8, 4]
  EXPECT_FITS(fits.k);
  Kb hwdge = fits;
  hwdge.k.instrs[0].ints[0] = 2;
  EXPECT_BREAKS(hwdge.k, "dynamic-offset", "an indirect dma_transpose indexes its source",
                "dge_mode=nisa.dge_mode.swdge");
  Kb on_dst;  // the offset on the destination
  const nk::Access dst = on_dst.hbm({8, 16});
  const nk::Access src = on_dst.sb({4, 8});
  const nk::Access idx = on_dst.sb({1, 8}, D::kInt32);
  on_dst.op(O::kDmaTranspose, {{dst.tensor, 0, {{16, 8}, {1, 4}}, {idx.tensor, 0, 1, 16, true}}, src}, {1});
  EXPECT_BREAKS(on_dst.k, "dynamic-offset", "an indirect dma_transpose indexes its source");
}

TEST(VerifierDynamicOffsets, VectorOffsetsIndexTheHbmSide) {
  Kb b;
  const nk::Access dst = b.sb({16, 8});
  const nk::Access src = b.hbm({4, 8});
  const nk::Access idx = b.sb({1, 4}, D::kInt32);
  b.op(O::kDmaCopy, {{dst.tensor, 0, {{8, 4}, {1, 8}}, {idx.tensor, 0, 1, 8, true}}, src}, {0});
  EXPECT_BREAKS(b.k, "dynamic-offset", "a vector offset indexes an HBM tensor", "gather from or scatter into HBM");
}

TEST(VerifierDynamicOffsets, OneRowPerOffset) {
  EXPECT_BREAKS(gather_rows(kSb, D::kInt32, 4, 4, 3).k, "dynamic-offset", "has 4 offsets",
                "must have 4 elements in its first dimension too", "one row per offset");
}

// ---------------------------------------------------------------------------------------------
// Where operands live
// ---------------------------------------------------------------------------------------------

TEST(VerifierMemories, ComputeEnginesReadAndWriteOnChipMemoryOnly) {
  const std::vector<OperandCase> cases = {
      {O::kTensorCopy, 0, "destination"}, {O::kTensorCopy, 1, "source"},
      {O::kReciprocal, 0, "destination"}, {O::kReciprocal, 1, "source"},
      {O::kMemset, 0, "destination"},     {O::kIota, 0, "destination"},
      {O::kAffineSelect, 0, "destination"}, {O::kAffineSelect, 1, "on_true_tile"},
      {O::kTranspose, 0, "destination"},  {O::kTranspose, 1, "data"},
      {O::kTensorTensor, 0, "destination"}, {O::kTensorTensor, 1, "input"}, {O::kTensorTensor, 2, "input"},
      {O::kTensorScalar, 0, "destination"}, {O::kTensorScalar, 1, "data"}, {O::kTensorScalar, 2, "operand"},
      {O::kTensorScalar, 3, "operand"},
      {O::kActivation, 0, "destination"}, {O::kActivation, 1, "data"},
      {O::kTensorReduce, 0, "destination"}, {O::kTensorReduce, 1, "data"},
      {O::kTensorTensorScan, 0, "destination"}, {O::kTensorTensorScan, 1, "input"},
      {O::kTensorTensorScan, 2, "input"},
      {O::kBnStats, 0, "destination"},    {O::kBnStats, 1, "data"},
      {O::kBnAggr, 0, "destination"},     {O::kBnAggr, 1, "data"},
      {O::kMax8, 0, "destination"},       {O::kMax8, 1, "data"},
      {O::kFindIndex8, 0, "destination"}, {O::kFindIndex8, 1, "data"},
      {O::kPartitionReduce, 0, "destination"}, {O::kPartitionReduce, 1, "data"},
      {O::kScalarTensorTensor, 0, "destination"}, {O::kScalarTensorTensor, 1, "data"},
      {O::kScalarTensorTensor, 3, "operand1"},
      {O::kSelect, 0, "destination"},     {O::kSelect, 1, "input"}, {O::kSelect, 2, "input"},
      {O::kCopyPredicated, 0, "destination"}, {O::kCopyPredicated, 1, "source"},
      {O::kCopyPredicated, 2, "predicate"},
      {O::kSelectReduce, 0, "destination"}, {O::kSelectReduce, 1, "input"}, {O::kSelectReduce, 2, "input"},
      {O::kRangeSelect, 0, "destination"}, {O::kRangeSelect, 1, "on_true_tile"}, {O::kRangeSelect, 2, "bound0"},
      {O::kRangeSelect, 3, "bound1"},
      {O::kTensorScalarReduce, 0, "destination"}, {O::kTensorScalarReduce, 1, "data"},
      {O::kTensorScalarCumulative, 0, "destination"}, {O::kTensorScalarCumulative, 1, "src"},
      {O::kExponential, 0, "destination"}, {O::kExponential, 1, "src"},
      {O::kActivate2, 0, "destination"},  {O::kActivate2, 1, "data"},
      {O::kMatchReplace8, 0, "destination"}, {O::kMatchReplace8, 1, "data"}, {O::kMatchReplace8, 3, "dst_idx"},
      {O::kStreamShuffle, 0, "destination"}, {O::kStreamShuffle, 1, "src"},
      {O::kNGather, 0, "destination"},    {O::kNGather, 1, "data"}, {O::kNGather, 2, "indices"},
      {O::kLocalGather, 0, "destination"}, {O::kLocalGather, 1, "src_buffer"}, {O::kLocalGather, 2, "index"},
  };
  for (const OperandCase& c : cases) {
    SCOPED_TRACE(trace(c));
    EXPECT_BREAKS(with_buffer(c.op, {c.slot}, kHbm), "engine-memory",
                  std::string(nk::op_name(c.op)) + ": " + c.words + " ", "is in HBM",
                  "compute engines read and write SBUF/PSUM only",
                  "move the data with nisa.dma_copy (or nl.load/nl.store) first");
  }
}

// Per-partition columns (bias, scale, reduce_res, initial, on_false, imm, operand0, ...) and the
// vals of find_index8 / match_replace8 are read by a compute engine: in HBM they break the rule too.
TEST(VerifierMemories, ColumnOperandsAndValsMustBeOnChip) {
  int checked = 0;
  for (int i = 0; i < nk::kNumOps; ++i) {
    const O op = static_cast<O>(i);
    const nk::Kernel k = fitting(op).k;
    if (nk::engine_of(op) == nk::Engine::kDma || op == O::kSendRecv || op == O::kCoreBarrier) continue;
    for (size_t slot = 1; slot < k.instrs.at(0).args.size(); ++slot) {
      const nk::Access& a = k.instrs.at(0).args[slot];
      if (!a.present() || k.tensors.at(a.tensor).buffer != kSb) continue;
      const auto& shape = k.tensors.at(a.tensor).shape;
      const bool column = shape.size() == 2 && shape[1] == 1;
      const bool vals = (op == O::kFindIndex8 || op == O::kMatchReplace8) && slot == 2;
      if (!column && !vals) continue;
      SCOPED_TRACE(std::string(nk::op_name(op)) + " operand " + std::to_string(slot));
      EXPECT_BREAKS(with_buffer(op, {slot}, kHbm), "engine-memory", "is in HBM",
                    "compute engines read and write SBUF/PSUM only");
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
  EXPECT_BREAKS(with_buffer(O::kFindIndex8, {2}, kHbm), "engine-memory", "vals ", "is in HBM");
  EXPECT_BREAKS(with_buffer(O::kMatchReplace8, {2}, kHbm), "engine-memory", "vals ", "is in HBM");
}

TEST(VerifierMemories, GpSimdCannotAccessPsum) {
  struct Case {
    O op;
    size_t slot;
    int engine_attr;  // index of the engine attribute to set to GpSimd, or -1
  };
  const std::vector<Case> cases = {
      {O::kIota, 0, -1},           {O::kAffineSelect, 0, -1},    {O::kAffineSelect, 1, -1},
      {O::kPartitionReduce, 0, -1}, {O::kPartitionReduce, 1, -1}, {O::kTensorCopy, 0, 0},
      {O::kTensorCopy, 1, 0},      {O::kTensorTensor, 0, 1},     {O::kTensorTensor, 1, 1},
      {O::kTensorTensor, 2, 1},    {O::kNGather, 0, -1},         {O::kNGather, 1, -1},
      {O::kNGather, 2, -1},        {O::kLocalGather, 0, -1},     {O::kLocalGather, 1, -1},
      {O::kLocalGather, 2, -1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(nk::op_name(c.op)) + " operand " + std::to_string(c.slot));
    nk::Kernel k = with_buffer(c.op, {c.slot}, kPs);
    if (c.engine_attr >= 0) {
      EXPECT_FITS(k) << "on the default engine PSUM is fine";
      k.instrs[0].ints[c.engine_attr] = kGpSimd;
    }
    EXPECT_BREAKS(k, "gpsimd-psum", "is in PSUM, which the GpSimd engine cannot access", "use SBUF");
  }
}

TEST(VerifierMemories, AtMostOneInputInPsum) {
  const std::vector<std::pair<O, std::pair<size_t, size_t>>> cases = {
      {O::kTensorTensor, {1, 2}},   {O::kTensorTensorScan, {1, 2}}, {O::kScalarTensorTensor, {1, 3}},
      {O::kSelect, {1, 2}},         {O::kCopyPredicated, {1, 2}},   {O::kSelectReduce, {1, 2}},
  };
  for (const auto& [op, slots] : cases) {
    SCOPED_TRACE(nk::op_name(op));
    EXPECT_FITS(with_buffer(op, {slots.first}, kPs));
    EXPECT_FITS(with_buffer(op, {slots.second}, kPs));
    EXPECT_BREAKS(with_buffer(op, {slots.first, slots.second}, kPs), "psum-operands", "are in PSUM",
                  "at most one input of an instruction can be read from PSUM", "copy one to SBUF first");
  }
}

TEST(VerifierMemories, DmaCannotAccessPsum) {
  EXPECT_BREAKS(with_buffer(O::kDmaCopy, {0}, kPs), "dma-psum", "dma_copy: destination", "DMA cannot access PSUM",
                "copy PSUM to SBUF with nisa.tensor_copy first");
  EXPECT_BREAKS(with_buffer(O::kDmaCopy, {1}, kPs), "dma-psum", "dma_copy: source", "DMA cannot access PSUM");
  EXPECT_FITS(with_buffer(O::kDmaCopy, {0}, kHbm)) << "HBM to HBM";
  for (size_t slot : {0, 1, 2}) {
    EXPECT_BREAKS(with_buffer(O::kDmaCompute, {slot}, kPs), "dma-psum", "dma_compute:", "DMA cannot access PSUM",
                  "nisa.tensor_copy first");
  }
  EXPECT_BREAKS(with_buffer(O::kDmaTranspose, {1}, kPs), "dma-psum", "dma_transpose: source",
                "DMA cannot access PSUM");
}

TEST(VerifierMemories, GpSimdOnlyOpsUseSbuf) {
  for (B where : {kPs, kHbm}) {
    EXPECT_BREAKS(with_buffer(O::kNonzeroWithCount, {0}, where), "engine-memory", "dst ", "must be in SBUF (GpSimd)");
    EXPECT_BREAKS(with_buffer(O::kNonzeroWithCount, {1}, where), "engine-memory", "src ", "must be in SBUF (GpSimd)");
    EXPECT_BREAKS(with_buffer(O::kSendRecv, {0}, where), "engine-memory", "sendrecv: dst ", "must be in SBUF");
    EXPECT_BREAKS(with_buffer(O::kSendRecv, {1}, where), "engine-memory", "sendrecv: src ", "must be in SBUF");
  }
  for (B where : {kSb, kPs}) {
    EXPECT_BREAKS(with_buffer(O::kCoreBarrier, {0}, where), "engine-memory", "core_barrier's data",
                  "is shared HBM");
  }
}

// ---------------------------------------------------------------------------------------------
// Shapes shared by many ops: same layout, (P, 1) columns
// ---------------------------------------------------------------------------------------------

TEST(VerifierShapes, OperandsShareTheDestinationsLayout) {
  const std::vector<OperandCase> cases = {
      {O::kTensorCopy, 1, "destination and source"},        {O::kReciprocal, 1, "destination and source"},
      {O::kAffineSelect, 1, "destination and on_true_tile"},
      {O::kTensorTensor, 1, "destination and data1"},       {O::kTensorTensor, 2, "destination and data2"},
      {O::kTensorScalar, 1, "destination and data"},        {O::kActivation, 1, "destination and data"},
      {O::kTensorTensorScan, 1, "destination and data0"},   {O::kTensorTensorScan, 2, "destination and data1"},
      {O::kScalarTensorTensor, 1, "destination and data"},  {O::kScalarTensorTensor, 3, "destination and operand1"},
      {O::kSelect, 1, "destination and predicate"},         {O::kSelect, 2, "destination and on_true"},
      {O::kCopyPredicated, 1, "destination and source"},    {O::kCopyPredicated, 2, "destination and predicate"},
      {O::kSelectReduce, 1, "destination and predicate"},   {O::kSelectReduce, 2, "destination and on_true"},
      {O::kRangeSelect, 1, "destination and on_true_tile"}, {O::kTensorScalarReduce, 1, "destination and data"},
      {O::kTensorScalarCumulative, 1, "destination and src"}, {O::kExponential, 1, "destination and src"},
      {O::kActivate2, 1, "destination and data"},           {O::kMatchReplace8, 1, "destination and data"},
  };
  for (const OperandCase& c : cases) {
    SCOPED_TRACE(trace(c));
    for (std::vector<int64_t> shape : {std::vector<int64_t>{32, 12}, std::vector<int64_t>{16, 8}}) {
      EXPECT_BREAKS(with_shape(c.op, c.slot, shape), "shape-mismatch", c.words,
                    "differ in partitions or in elements per partition");
    }
  }
  // Elements per partition, not the free shape, must agree: [32, 2, 4] matches [32, 8].
  EXPECT_FITS(with_shape(O::kTensorTensor, 2, {32, 2, 4}));
}

TEST(VerifierShapes, ScalarOperandsAreColumns) {
  const std::vector<OperandCase> cases = {
      {O::kTensorScalar, 2, "operand0"},       {O::kTensorScalar, 3, "operand1"},
      {O::kActivation, 2, "bias"},             {O::kActivation, 3, "scale"},        {O::kActivation, 4, "reduce_res"},
      {O::kTensorTensorScan, 3, "initial"},    {O::kScalarTensorTensor, 2, "operand0"},
      {O::kSelect, 3, "on_false"},             {O::kSelectReduce, 3, "on_false"},   {O::kSelectReduce, 4, "reduce_res"},
      {O::kRangeSelect, 2, "bound0"},          {O::kRangeSelect, 3, "bound1"},      {O::kRangeSelect, 4, "reduce_res"},
      {O::kTensorScalarReduce, 2, "operand0"}, {O::kTensorScalarReduce, 3, "reduce_res"},
      {O::kTensorScalarReduce, 4, "reduce_init"},
      {O::kTensorScalarCumulative, 2, "imm0"}, {O::kTensorScalarCumulative, 3, "imm1"},
      {O::kExponential, 2, "max_value"},       {O::kExponential, 3, "reduce_res"},  {O::kExponential, 4, "reduce_init"},
      {O::kActivate2, 2, "imm0"},              {O::kActivate2, 3, "imm1"},          {O::kActivate2, 4, "relu_param"},
      {O::kActivate2, 5, "reduce_res"},
  };
  for (const OperandCase& c : cases) {
    SCOPED_TRACE(trace(c));
    EXPECT_BREAKS(with_shape(c.op, c.slot, {32, 2}), "shape-mismatch", c.words + " ",
                  "must be a (32, 1) column: one value per partition");
    EXPECT_BREAKS(with_shape(c.op, c.slot, {16, 1}), "shape-mismatch", "must be a (32, 1) column");
  }
}

// ---------------------------------------------------------------------------------------------
// Dtypes and operators shared by many ops
// ---------------------------------------------------------------------------------------------

TEST(VerifierDtypes, BitwiseOperatorsTakeIntegers) {
  // (op, attribute holding an operator, the operands that must be integers)
  const std::vector<std::tuple<O, size_t, std::vector<size_t>>> cases = {
      {O::kTensorTensor, 0, {0, 1, 2}}, {O::kTensorScalar, 0, {0, 1}}, {O::kTensorScalar, 2, {0, 1}},
      {O::kTensorReduce, 0, {0, 1}},
  };
  for (const auto& [op, attr, operands] : cases) {
    SCOPED_TRACE(std::string(nk::op_name(op)) + " attribute " + std::to_string(attr));
    EXPECT_BREAKS(with_int(op, attr, kAnd), "dtype", "bitwise operators take integer tensors", "is float32");
    nk::Kernel ints = with_int(op, attr, kAnd);
    for (size_t s : operands) ints.tensors[tensor_of(ints, s)].dtype = D::kInt32;
    EXPECT_FITS(ints);
    ints.tensors[tensor_of(ints, operands.back())].dtype = D::kBFloat16;
    EXPECT_BREAKS(ints, "dtype", "is bfloat16");
  }
}

TEST(VerifierDtypes, SomeOpsTakeArithmeticOperatorsOnly) {
  const std::vector<std::pair<O, size_t>> cases = {
      {O::kTensorTensorScan, 0}, {O::kTensorTensorScan, 1}, {O::kScalarTensorTensor, 0},
      {O::kScalarTensorTensor, 1}, {O::kTensorScalarReduce, 0}, {O::kTensorScalarCumulative, 0},
  };
  for (const auto& [op, attr] : cases) {
    SCOPED_TRACE(std::string(nk::op_name(op)) + " attribute " + std::to_string(attr));
    EXPECT_BREAKS(with_int(op, attr, kOr), "dtype", "takes arithmetic operators only (computed in fp32)",
                  "bitwise operators run in tensor_tensor / tensor_scalar on integer tensors");
  }
}

TEST(VerifierDtypes, OperandDtypeLists) {
  struct Case {
    O op;
    size_t slot;
    D bad;
    std::string words;
  };
  const std::vector<Case> cases = {
      {O::kCopyPredicated, 2, D::kFloat32, "predicate"}, {O::kCopyPredicated, 2, D::kInt8, "predicate"},
      {O::kSelectReduce, 1, D::kInt32, "predicate"},     {O::kSelectReduce, 1, D::kBFloat16, "predicate"},
      {O::kNGather, 2, D::kInt32, "indices"},            {O::kLocalGather, 2, D::kUInt32, "index"},
      {O::kNonzeroWithCount, 1, D::kBFloat16, "src"},    {O::kNonzeroWithCount, 0, D::kUInt32, "dst"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(nk::op_name(c.op)) + " operand " + std::to_string(c.slot));
    EXPECT_BREAKS(with_dtype(c.op, c.slot, c.bad), "dtype", c.words + " ",
                  std::string("is ") + nk::dtype_name(c.bad) + "; it must be one of");
  }
  // The other dtypes of each list fit.
  for (D ok : {D::kUInt16, D::kUInt32}) EXPECT_FITS(with_dtype(O::kCopyPredicated, 2, ok));
  for (D ok : {D::kInt8, D::kInt16, D::kUInt16}) EXPECT_FITS(with_dtype(O::kSelectReduce, 1, ok));
  EXPECT_FITS(with_dtype(O::kNonzeroWithCount, 1, D::kInt32));
}

TEST(VerifierDtypes, Float32Operands) {
  const std::vector<OperandCase> cases = {
      {O::kSelectReduce, 3, "on_false"},       {O::kRangeSelect, 2, "bound0"},
      {O::kRangeSelect, 3, "bound1"},          {O::kTensorScalarReduce, 2, "operand0"},
      {O::kTensorScalarCumulative, 2, "imm0"}, {O::kTensorScalarCumulative, 3, "imm1"},
      {O::kExponential, 2, "max_value"},
  };
  for (const OperandCase& c : cases) {
    SCOPED_TRACE(trace(c));
    EXPECT_BREAKS(with_dtype(c.op, c.slot, D::kBFloat16), "dtype", c.words + " ", "is bfloat16; it must be float32");
  }
  for (size_t slot : {2, 3}) {
    EXPECT_BREAKS(with_dtype(O::kTensorScalar, slot, D::kInt32), "dtype", slot == 2 ? "operand0 " : "operand1 ",
                  "is int32; tensor_scalar's vector operands are float32");
  }
}

TEST(VerifierOperators, ReduceOperators) {
  struct Case {
    O op;
    size_t attr;
    std::vector<int64_t> ok, bad;
    std::string name;
  };
  const std::vector<Case> cases = {
      {O::kTensorScalarReduce, 1, {kAdd, kMul, kMax, alu(nk::Alu::kMinimum)}, {kSub, kDiv, kAbsMax}, "reduce_op"},
      {O::kTensorScalarCumulative, 1, {kAdd, kSub, kMul, kMax, alu(nk::Alu::kMinimum)}, {kDiv, kAbsMax}, "op1"},
      {O::kActivate2, 5, {-1, kAdd, kMax, alu(nk::Alu::kMinimum), kAbsMax, alu(nk::Alu::kAbsMin)}, {kMul, kSub},
       "reduce_op"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(nk::op_name(c.op));
    for (int64_t v : c.ok) EXPECT_FITS(with_int(c.op, c.attr, v)) << v;
    for (int64_t v : c.bad) {
      EXPECT_BREAKS(with_int(c.op, c.attr, v), "alu-op", c.name + " is not an operator this instruction supports");
    }
  }
}

TEST(VerifierOperators, NeuronCoreV4Ops) {
  for (O op : {O::kExponential, O::kActivate2}) {
    for (const char* target : {"trn1", "trn2"}) {
      nk::Kernel k = fitting(op).k;
      k.target = nk::target_for(target);
      const std::string v = target == std::string("trn1") ? "2" : "3";
      EXPECT_BREAKS(k, "nc-version", std::string(nk::op_name(op)) + " needs NeuronCore-v4 (trn3)",
                    std::string("the kernel is traced for ") + target + " (NeuronCore-v" + v + ")");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Each op's own checks, in the order of verify.cpp
// ---------------------------------------------------------------------------------------------

TEST(VerifierOps, DmaCopyMovesAsManyElementsAsItWrites) {
  EXPECT_BREAKS(with_shape(O::kDmaCopy, 1, {32, 7}), "shape-mismatch", "dma_copy: destination",
                "have different numbers of elements");
  EXPECT_FITS(with_shape(O::kDmaCopy, 1, {256}));  // any shape of as many elements
}

TEST(VerifierOps, BnStats) {
  EXPECT_FITS(with_shape(O::kBnStats, 1, {32, 512}));
  EXPECT_BREAKS(with_shape(O::kBnStats, 1, {32, 513}), "bn-stats-free", "has 513 elements per partition",
                "bn_stats takes at most 512", "nl.tile_size.bn_stats_fmax", "split it and combine with bn_aggr");
  EXPECT_BREAKS(with_shape(O::kBnStats, 0, {32, 5}), "shape-mismatch", "bn_stats: destination", "must be (32, 6)");
  EXPECT_BREAKS(with_shape(O::kBnStats, 0, {16, 6}), "shape-mismatch", "must be (32, 6)");
}

TEST(VerifierOps, BnAggr) {
  EXPECT_FITS(with_shape(O::kBnAggr, 1, {32, 12}));
  EXPECT_BREAKS(with_shape(O::kBnAggr, 1, {32, 7}), "shape-mismatch", "bn_aggr: data",
                "(count, mean, var*count) triples from bn_stats", "a multiple of 3");
  EXPECT_BREAKS(with_shape(O::kBnAggr, 0, {32, 3}), "shape-mismatch", "must be (32, 2): mean and variance");
}

TEST(VerifierOps, Max8AndFindIndex8) {
  for (O op : {O::kMax8, O::kFindIndex8}) {
    SCOPED_TRACE(nk::op_name(op));
    for (int64_t f : {8, 16384}) EXPECT_FITS(with_shape(op, 1, {32, f}));
    for (int64_t f : {7, 16385}) {
      EXPECT_BREAKS(with_shape(op, 1, {32, f}), "shape-mismatch", "must have 8 to 16384 elements per partition");
    }
    EXPECT_BREAKS(with_shape(op, 0, {32, 7}), "shape-mismatch", "destination", "must be (32, 8)");
  }
  EXPECT_BREAKS(with_shape(O::kFindIndex8, 2, {32, 7}), "shape-mismatch", "vals", "must be (32, 8)");
}

TEST(VerifierOps, PartitionReduceWritesOneRow) {
  EXPECT_BREAKS(with_shape(O::kPartitionReduce, 0, {2, 8}), "shape-mismatch", "tensor_partition_reduce: destination",
                "must be (1, 8)");
  EXPECT_BREAKS(with_shape(O::kPartitionReduce, 0, {1, 4}), "shape-mismatch", "must be (1, 8)");
}

TEST(VerifierOps, CopyPredicatedDoesNotConvert) {
  EXPECT_BREAKS(with_dtype(O::kCopyPredicated, 1, D::kBFloat16), "dtype", "source", "is bfloat16 but the destination "
                "is float32", "tensor_copy_predicated copies without conversion");
  nk::Kernel immediate = fitting(O::kCopyPredicated).k;  // src an immediate
  immediate.instrs[0].args[1] = {};
  immediate.tensors[0].dtype = D::kBFloat16;
  EXPECT_FITS(immediate);
}

TEST(VerifierOps, SelectReduceDtypes) {
  for (D d : {D::kTFloat32, D::kInt32, D::kUInt32}) {
    EXPECT_BREAKS(with_dtype(O::kSelectReduce, 2, d), "dtype", std::string("on_true ") ,
                  std::string("is ") + nk::dtype_name(d), "select_reduce takes any dtype but tfloat32, int32 and uint32");
  }
  EXPECT_FITS(with_dtype(O::kSelectReduce, 2, D::kInt16));
  EXPECT_BREAKS(with_dtype(O::kSelectReduce, 4, D::kInt32), "dtype", "reduce_res",
                "must be a floating-point tensor");
  EXPECT_FITS(with_dtype(O::kSelectReduce, 4, D::kBFloat16));
}

TEST(VerifierOps, RangeSelect) {
  EXPECT_BREAKS(with_dtype(O::kRangeSelect, 1, D::kInt32), "dtype", "on_true_tile",
                "range_select selects from floating-point tiles");
  for (size_t attr : {0, 1}) {
    for (int64_t ok : {kEq, kLt, alu(nk::Alu::kLessEqual), alu(nk::Alu::kGreater), kGe}) {
      EXPECT_FITS(with_int(O::kRangeSelect, attr, ok));
    }
    for (int64_t bad : {alu(nk::Alu::kNotEqual), kAdd}) {
      EXPECT_BREAKS(with_int(O::kRangeSelect, attr, bad), "alu-op", attr ? "comp_op1" : "comp_op0",
                    "must be one of nl.equal, nl.less, nl.less_equal, nl.greater, nl.greater_equal");
    }
  }
  nk::Kernel fill = fitting(O::kRangeSelect).k;
  fill.instrs[0].floats[0] = -3.4028234663852886e38;  // FP32_MIN as Python writes it
  EXPECT_FITS(fill);
  fill.instrs[0].floats[0] = 0.0;
  EXPECT_BREAKS(fill, "alu-op", "on_false_value must be FP32_MIN (-3.4028235e+38)",
                "the only fill value the Vector engine's range select supports");
}

TEST(VerifierOps, TensorScalarCumulativeDtypes) {
  for (size_t slot : {0, 1}) {
    for (D d : {D::kInt32, D::kUInt32, D::kTFloat32}) {
      nk::Kernel k = with_dtype(O::kTensorScalarCumulative, slot, d);
      EXPECT_BREAKS(k, "dtype", slot ? "src " : "destination ", std::string("is ") + nk::dtype_name(d),
                    "tensor_scalar_cumulative takes bf16/fp16/fp32/fp8 and 8/16-bit integers");
    }
    for (D d : {D::kBFloat16, D::kFloat8E4M3, D::kInt16, D::kUInt8}) {
      EXPECT_FITS(with_dtype(O::kTensorScalarCumulative, slot, d));
    }
  }
}

TEST(VerifierOps, Activate2OperatorPairs) {
  const int64_t fits[][2] = {{kMul, kAdd}, {kMul, kSub}, {kMul, kBypass}, {kAdd, kBypass}, {kSub, kBypass},
                             {kBypass, kBypass}};
  const int64_t breaks[][2] = {{kAdd, kAdd}, {kMul, kMul}, {kBypass, kAdd}, {kDiv, kBypass}, {kSub, kMul}};
  for (const auto& p : fits) {
    nk::Kernel k = with_int(O::kActivate2, 1, p[0]);
    k.instrs[0].ints[2] = p[1];
    EXPECT_FITS(k) << p[0] << ", " << p[1];
  }
  for (const auto& p : breaks) {
    nk::Kernel k = with_int(O::kActivate2, 1, p[0]);
    k.instrs[0].ints[2] = p[1];
    EXPECT_BREAKS(k, "alu-op", "(op0, op1) must be one of (multiply, add), (multiply, subtract), (multiply, bypass), "
                  "(add, bypass), (subtract, bypass), (bypass, bypass)");
  }
}

TEST(VerifierOps, MatchReplace8) {
  for (int64_t f : {7, 16385}) {
    nk::Kernel k = with_shape(O::kMatchReplace8, 1, {32, f});
    k.tensors[tensor_of(k, 0)].shape = {32, f};
    k.instrs[0].args[0] = whole(k, tensor_of(k, 0));
    EXPECT_BREAKS(k, "shape-mismatch", "must have 8 to 16384 elements per partition");
  }
  EXPECT_BREAKS(with_shape(O::kMatchReplace8, 2, {32, 7}), "shape-mismatch", "vals", "must be (32, 8)");
  EXPECT_BREAKS(with_shape(O::kMatchReplace8, 3, {32, 9}), "shape-mismatch", "dst_idx", "must be (32, 8)");
  nk::Kernel no_idx = fitting(O::kMatchReplace8).k;
  no_idx.instrs[0].args[3] = {};
  EXPECT_FITS(no_idx);
}

namespace {

// nc_stream_shuffle of `partitions` partitions starting at `start` of 128-partition tiles.
nk::Kernel shuffle(int64_t partitions, int64_t dst_start, int64_t src_start, std::vector<int64_t> mask = {}) {
  Kb b;
  const nk::Access dst = b.sb({128, 8});
  const nk::Access src = b.sb({128, 8});
  if (mask.empty()) mask.assign(32, 0);
  b.op(O::kStreamShuffle, {{dst.tensor, dst_start * 8, {{8, partitions}, {1, 8}}},
                           {src.tensor, src_start * 8, {{8, partitions}, {1, 8}}}},
       mask);
  return b.k;
}

}  // namespace

TEST(VerifierOps, StreamShuffle) {
  EXPECT_BREAKS(with_shape(O::kStreamShuffle, 1, {32, 4}), "shape-mismatch", "differ in elements per partition");
  EXPECT_BREAKS(with_dtype(O::kStreamShuffle, 1, D::kBFloat16), "dtype", "destination dtype float32 must equal src's "
                "bfloat16");
  // Start partitions: any multiple of 32 for 32 active partitions, 0/64 for 64, 0 for 96 or 128.
  EXPECT_FITS(shuffle(32, 96, 32));
  EXPECT_FITS(shuffle(64, 64, 0));
  EXPECT_FITS(shuffle(96, 0, 0));
  EXPECT_BREAKS(shuffle(32, 16, 0), "quadrant", "destination", "starts at partition 16",
                "with 32 active partitions the start partition must be a multiple of 32");
  EXPECT_BREAKS(shuffle(64, 0, 32), "quadrant", "src ", "starts at partition 32",
                "with 64 active partitions the start partition must be a multiple of 64");
  EXPECT_BREAKS(shuffle(96, 32, 0), "quadrant", "with 96 active partitions", "a multiple of 128");
  // Mask entries name a source partition of the quadrant, or 255 (keep).
  std::vector<int64_t> mask(32, 255);
  mask[3] = 15;
  EXPECT_FITS(shuffle(16, 0, 0, mask));
  mask[3] = 16;
  EXPECT_BREAKS(shuffle(16, 0, 0, mask), "shuffle-mask", "shuffle_mask[3] = 16 names no source partition",
                "0..31 within a quadrant, or 255 to keep");
  mask[3] = -1;
  EXPECT_BREAKS(shuffle(16, 0, 0, mask), "shuffle-mask", "shuffle_mask[3] = -1");
  mask[3] = 32;
  EXPECT_BREAKS(shuffle(32, 0, 0, mask), "shuffle-mask", "shuffle_mask[3] = 32");
}

TEST(VerifierOps, NGather) {
  EXPECT_BREAKS(with_shape(O::kNGather, 2, {32, 5}), "shape-mismatch", "must share partitions",
                "the destination has one element per index");
  EXPECT_BREAKS(with_shape(O::kNGather, 1, {16, 8}), "shape-mismatch", "must share partitions");
  EXPECT_BREAKS(with_dtype(O::kNGather, 0, D::kBFloat16), "dtype", "the destination's dtype must equal the data's");
}

namespace {

// local_gather over `partitions` partitions: index uint16 [P, index_free], src [P, 8] from partition
// `start` of a 128-partition tile, dst [P, dst_free].
nk::Kernel local_gather(int64_t partitions, int64_t index_free, int64_t n_elem, int64_t valid, int64_t dst_free,
                        int64_t start = 0) {
  Kb b;
  const nk::Access dst = b.sb({partitions, dst_free});
  const nk::Access src = b.sb({128, 8});
  const nk::Access idx = b.sb({partitions, index_free}, D::kUInt16);
  b.op(O::kLocalGather, {dst, {src.tensor, start * 8, {{8, partitions}, {1, 8}}}, idx}, {n_elem, valid});
  return b.k;
}

}  // namespace

TEST(VerifierOps, LocalGather) {
  EXPECT_FITS(local_gather(32, 2, 1, 32, 32));
  EXPECT_FITS(local_gather(16, 2, 32, 3, 96, 112));
  EXPECT_BREAKS(local_gather(8, 2, 1, 4, 4), "shape-mismatch", "must have the same number of partitions",
                "a multiple of 16", "one GpSimd core per 16 partitions");
  EXPECT_BREAKS(with_shape(O::kLocalGather, 0, {16, 4}), "shape-mismatch", "must have the same number of partitions");
  EXPECT_BREAKS(local_gather(16, 2, 1, 4, 4, 8), "quadrant", "src_buffer and index start on a 16-partition boundary");
  EXPECT_BREAKS(with_dtype(O::kLocalGather, 0, D::kBFloat16), "dtype",
                "the destination's dtype must equal src_buffer's (no conversion)");
  for (int64_t n : {0, 3, 64}) {
    EXPECT_BREAKS(local_gather(16, 2, n, 4, 4), "shape-mismatch",
                  "num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got " + std::to_string(n));
  }
  for (int64_t valid : {0, 33}) {
    EXPECT_BREAKS(local_gather(16, 2, 1, valid, 4), "shape-mismatch",
                  "num_valid_indices is " + std::to_string(valid) + "; each core has 32 indices");
  }
  EXPECT_FITS(local_gather(16, 257, 1, 4096, 4096));
  EXPECT_BREAKS(local_gather(16, 257, 1, 4097, 4097), "shape-mismatch", "at most 4096 indices per GpSimd core");
  EXPECT_BREAKS(local_gather(16, 2, 2, 4, 4), "shape-mismatch",
                "must hold num_valid_indices * num_elem_per_idx = 8 elements per partition");
}

TEST(VerifierOps, NonzeroWithCountAddsTheCount) {
  EXPECT_BREAKS(with_shape(O::kNonzeroWithCount, 0, {32, 8}), "shape-mismatch",
                "must have src's partitions and one more element per partition", "(the count)");
  EXPECT_BREAKS(with_shape(O::kNonzeroWithCount, 0, {16, 9}), "shape-mismatch", "one more element per partition");
}

TEST(VerifierOps, DmaComputeSourcesMatchTheDestination) {
  EXPECT_BREAKS(with_shape(O::kDmaCompute, 2, {32, 7}), "shape-mismatch", "dma_compute: source",
                "have different numbers of elements");
  EXPECT_FITS(with_shape(O::kDmaCompute, 2, {8, 32}));
}

TEST(VerifierOps, SendRecvTilesAgree) {
  EXPECT_BREAKS(with_dtype(O::kSendRecv, 1, D::kBFloat16), "shape-mismatch",
                "must have the same dtype, partitions and elements per partition");
  EXPECT_BREAKS(with_shape(O::kSendRecv, 1, {16, 8}), "shape-mismatch", "same dtype, partitions");
  EXPECT_BREAKS(with_shape(O::kSendRecv, 1, {32, 4}), "shape-mismatch", "same dtype, partitions");
}

// ---------------------------------------------------------------------------------------------
// dma_transpose
// ---------------------------------------------------------------------------------------------

namespace {

nk::Kernel dma_transpose(std::vector<int64_t> src_shape, std::vector<int64_t> dst_shape, int64_t mode,
                         std::vector<int64_t> axes = {}, D d = D::kBFloat16) {
  Kb b;
  const nk::Access dst = b.sb(std::move(dst_shape), d);
  const nk::Access src = b.hbm(std::move(src_shape), d);
  axes.insert(axes.begin(), mode);
  b.op(O::kDmaTranspose, {dst, src}, axes);
  return b.k;
}

}  // namespace

TEST(VerifierDmaTranspose, Permutations) {
  EXPECT_FITS(dma_transpose({4, 8}, {8, 4}, 0));
  EXPECT_FITS(dma_transpose({4, 8}, {8, 4}, 0, {1, 0}));
  EXPECT_FITS(dma_transpose({2, 3, 4}, {4, 3, 2}, 0, {2, 1, 0}));
  EXPECT_FITS(dma_transpose({2, 3, 4, 5}, {5, 3, 4, 2}, 0, {3, 1, 2, 0}));
  EXPECT_BREAKS(dma_transpose({2, 3, 4}, {4, 2, 3}, 0, {2, 0, 1}), "dma-transpose",
                "axes for a 3-D source must be (2, 1, 0)");
  EXPECT_BREAKS(dma_transpose({2, 3, 4, 5}, {5, 4, 3, 2}, 0, {3, 2, 1, 0}), "dma-transpose",
                "axes for a 4-D source must be (3, 1, 2, 0)");
  EXPECT_BREAKS(dma_transpose({2, 3, 4, 5}, {5, 4, 3, 2}, 0), "dma-transpose",
                "must have the permuted source shape [5, 3, 4, 2]");
  EXPECT_BREAKS(dma_transpose({4, 8}, {4, 8}, 0), "dma-transpose", "must have the permuted source shape [8, 4]");
  EXPECT_BREAKS(dma_transpose({32}, {32, 1}, 0), "dma-transpose", "source", "must be 2-D, 3-D or 4-D");
  EXPECT_BREAKS(dma_transpose({1, 2, 2, 2, 2}, {2, 2, 2, 2, 1}, 0), "dma-transpose", "must be 2-D, 3-D or 4-D");
}

TEST(VerifierDmaTranspose, WritesSbufWithTheSourcesDtype) {
  nk::Kernel to_hbm = dma_transpose({4, 8}, {8, 4}, 0);
  to_hbm.tensors[0].buffer = kHbm;
  EXPECT_BREAKS(to_hbm, "dma-transpose", "destination", "must be in SBUF");
  nk::Kernel convert = dma_transpose({4, 8}, {8, 4}, 0);
  convert.tensors[0].dtype = D::kFloat32;
  EXPECT_BREAKS(convert, "dma-transpose", "destination dtype float32 must equal the source's bfloat16");
}

TEST(VerifierDmaTranspose, SwdgeIsTheIndirectForm) {
  EXPECT_BREAKS(dma_transpose({4, 8}, {8, 4}, 1), "dma-transpose", "dge_mode=swdge is the indirect form",
                "give the source a vector_offset");
}

TEST(VerifierDmaTranspose, HardwareDge) {
  EXPECT_FITS(dma_transpose({16, 64}, {64, 16}, 2));
  EXPECT_FITS(dma_transpose({16, 128}, {128, 16}, 2, {}, D::kFloat16));
  EXPECT_BREAKS(dma_transpose({16, 64}, {64, 16}, 2, {}, D::kFloat32), "dma-transpose",
                "a hwdge transpose moves 2-byte elements; the source is float32");
  EXPECT_BREAKS(dma_transpose({8, 64}, {64, 8}, 2), "dma-transpose",
                "a 2-D hwdge transpose needs src.shape[0] == 16, got 8");
  EXPECT_FITS(dma_transpose({2, 8, 4}, {4, 8, 2}, 2));
  EXPECT_FITS(dma_transpose({16, 1, 3, 4}, {4, 1, 3, 16}, 2));
  EXPECT_BREAKS(dma_transpose({3, 16, 4}, {4, 16, 3}, 2), "dma-transpose",
                "a 3-D hwdge transpose needs src.shape[0] in {1, 2, 4, 8, 16}",
                "src.shape[0] * src.shape[-2] a multiple of 16");
  EXPECT_BREAKS(dma_transpose({2, 4, 4}, {4, 4, 2}, 2), "dma-transpose", "a 3-D hwdge transpose needs");
  EXPECT_BREAKS(dma_transpose({2, 1, 4, 4}, {4, 1, 4, 2}, 2), "dma-transpose", "a 4-D hwdge transpose needs");
}

TEST(VerifierDmaTranspose, HwdgeLastDimensionLimitIsUnreachable) {
  // src.shape[-1] becomes the SBUF destination's partition dimension: past 128 the destination's
  // declaration breaks partition-limit before the hwdge rule is reached.
  EXPECT_BREAKS(dma_transpose({16, 129}, {129, 16}, 2), "partition-limit", "has 129 partitions");
}

// ---------------------------------------------------------------------------------------------
// nc_matmul
// ---------------------------------------------------------------------------------------------

namespace {

// dst[M, N] (PSUM) = stationary[K, M].T @ moving[K, N]; dst_shape overrides [M, N].
nk::Kernel matmul(const char* target, int64_t K, int64_t M, int64_t N, D st = D::kBFloat16, D mv = D::kBFloat16,
                  D dst = D::kFloat32, bool transpose = false, std::vector<int64_t> dst_shape = {}) {
  Kb b(target);
  const nk::Access d = b.ps(dst_shape.empty() ? std::vector<int64_t>{M, N} : dst_shape, dst);
  const nk::Access s = b.sb({K, M}, st);
  const nk::Access m = b.sb({K, N}, mv);
  b.op(O::kMatmul, {d, s, m}, {-1, transpose ? 1 : 0});
  return b.k;
}

}  // namespace

TEST(VerifierMatmul, OperandsInSbufResultInPsum) {
  EXPECT_FITS(matmul("trn2", 128, 128, 512));
  for (size_t slot : {1, 2}) {
    for (B where : {kPs, kHbm}) {
      EXPECT_BREAKS(with_buffer(O::kMatmul, {slot}, where), "matmul-memory", slot == 1 ? "stationary " : "moving ",
                    "must be in SBUF: the Tensor engine reads its operands from SBUF");
    }
  }
  for (B where : {kSb, kHbm}) {
    EXPECT_BREAKS(with_buffer(O::kMatmul, {0}, where), "matmul-memory", "destination",
                  "must be in PSUM: the Tensor engine writes its results to PSUM",
                  "copy them to SBUF afterwards with nisa.tensor_copy");
  }
}

TEST(VerifierMatmul, Contraction) {
  nk::Kernel k = matmul("trn2", 32, 8, 16);
  k.tensors[2].shape = {16, 16};
  k.instrs[0].args[2] = whole(k, 2);
  EXPECT_BREAKS(k, "matmul-contraction", "must have the same contraction (partition) size");
}

TEST(VerifierMatmul, ContractionLimitIsUnreachable) {
  // The operands are SBUF tiles, so a 129-partition contraction breaks partition-limit at the declaration.
  EXPECT_BREAKS(matmul("trn2", 129, 8, 16), "partition-limit", "has 129 partitions");
}

TEST(VerifierMatmul, StationaryFree) {
  // (The destination stays a legal [128, 16] PSUM tile: the limit is checked before the result's shape.)
  EXPECT_BREAKS(matmul("trn2", 128, 129, 16, D::kBFloat16, D::kBFloat16, D::kFloat32, false, {128, 16}),
                "matmul-stationary-free", "has 129 free elements; at most 128",
                "nl.tile_size.gemm_stationary_fmax");
}

TEST(VerifierMatmul, MovingFree) {
  EXPECT_BREAKS(matmul("trn2", 128, 128, 513), "matmul-moving-free", "has 513 free elements; at most 512",
                "nl.tile_size.gemm_moving_fmax");
  EXPECT_BREAKS(matmul("trn1", 128, 128, 513), "matmul-moving-free", "at most 512");
  // NeuronCore-v4 writes across all 8 PSUM banks: 4096 fp32 or 8192 bf16 results.
  EXPECT_FITS(matmul("trn3", 128, 128, 4096));
  EXPECT_BREAKS(matmul("trn3", 128, 128, 4097, D::kBFloat16, D::kBFloat16, D::kFloat32, false, {128, 4096}),
                "matmul-moving-free", "has 4097 free elements; at most 4096 on trn3");
  EXPECT_FITS(matmul("trn3", 128, 128, 8192, D::kBFloat16, D::kBFloat16, D::kBFloat16));
  nk::Kernel k = matmul("trn3", 128, 128, 8192, D::kBFloat16, D::kBFloat16, D::kBFloat16);
  k.tensors[2].shape = {128, 8193};  // the destination stays [128, 8192]: the moving limit comes first
  k.instrs[0].args[2] = whole(k, 2);
  EXPECT_BREAKS(k, "matmul-moving-free", "at most 8192 on trn3");
}

TEST(VerifierMatmul, ResultShape) {
  nk::Kernel k = matmul("trn2", 32, 8, 16);
  k.tensors[0].shape = {16, 8};
  k.instrs[0].args[0] = whole(k, 0);
  EXPECT_BREAKS(k, "shape-mismatch", "destination", "must be [8, 16]: stationary.T @ moving");
}

TEST(VerifierMatmul, Dtypes) {
  const D f32 = D::kFloat32, tf32 = D::kTFloat32, bf16 = D::kBFloat16, e4m3 = D::kFloat8E4M3,
          e4m3fn = D::kFloat8E4M3FN, e5m2 = D::kFloat8E5M2;
  EXPECT_FITS(matmul("trn2", 32, 8, 16, f32, tf32));
  EXPECT_FITS(matmul("trn2", 32, 8, 16, e4m3, e5m2));
  EXPECT_FITS(matmul("trn2", 32, 8, 16, bf16, D::kFloat16));
  for (D i : {D::kInt8, D::kInt32}) {
    EXPECT_BREAKS(matmul("trn2", 32, 8, 16, i, bf16), "matmul-dtype", "operands must be floating point");
    EXPECT_BREAKS(matmul("trn2", 32, 8, 16, bf16, i), "matmul-dtype", "operands must be floating point");
  }
  EXPECT_BREAKS(matmul("trn2", 32, 8, 16, f32, bf16), "matmul-dtype",
                "a float32/tfloat32 operand pairs only with float32/tfloat32; got float32 and bfloat16");
  EXPECT_BREAKS(matmul("trn2", 32, 8, 16, e5m2, tf32), "matmul-dtype", "pairs only with float32/tfloat32");
  // float8_e4m3fn is NeuronCore-v4's, and never mixes with the legacy float8_e4m3.
  EXPECT_FITS(matmul("trn3", 32, 8, 16, e4m3fn, e5m2));
  for (const char* target : {"trn2", "trn3"}) {
    EXPECT_BREAKS(matmul(target, 32, 8, 16, e4m3fn, e4m3), "matmul-dtype",
                  "float8_e4m3fn and the legacy float8_e4m3 cannot be mixed in one matmul");
    EXPECT_BREAKS(matmul(target, 32, 8, 16, e4m3, e4m3fn), "matmul-dtype", "cannot be mixed");
  }
  EXPECT_BREAKS(matmul("trn2", 32, 8, 16, e4m3fn, e4m3fn), "matmul-dtype",
                "float8_e4m3fn operands need NeuronCore-v4 (trn3); trn2 multiplies float8_e4m3 / float8_e5m2");
  EXPECT_BREAKS(matmul("trn1", 32, 8, 16, bf16, e4m3fn), "matmul-dtype", "need NeuronCore-v4");
  // The PSUM result: fp32; also bf16 on NeuronCore-v4; a transpose's keeps the operand's dtype.
  EXPECT_BREAKS(matmul("trn2", 32, 8, 16, bf16, bf16, bf16), "matmul-dtype",
                "the PSUM result is bfloat16; the Tensor engine writes float32 on trn2");
  EXPECT_FITS(matmul("trn3", 32, 8, 16, bf16, bf16, bf16));
  EXPECT_BREAKS(matmul("trn3", 32, 8, 16, bf16, bf16, D::kFloat16), "matmul-dtype",
                "the PSUM result is float16; the Tensor engine writes float32 or bfloat16");
  EXPECT_FITS(matmul("trn2", 32, 8, 16, bf16, bf16, bf16, true));
  EXPECT_BREAKS(matmul("trn2", 32, 8, 16, bf16, bf16, D::kFloat16, true), "matmul-dtype", "the PSUM result is float16");
}

// ---------------------------------------------------------------------------------------------
// nc_transpose
// ---------------------------------------------------------------------------------------------

namespace {

nk::Kernel transpose(B dst_buf, std::vector<int64_t> dst_shape, B src_buf, std::vector<int64_t> src_shape,
                     int64_t engine = 0, D dst_dtype = D::kFloat32) {
  Kb b;
  const nk::Access d = b.decl(dst_buf, std::move(dst_shape), dst_dtype);
  const nk::Access s = b.decl(src_buf, std::move(src_shape));
  b.op(O::kTranspose, {d, s}, {engine});
  return b.k;
}

}  // namespace

TEST(VerifierTranspose, EngineLimits) {
  // SBUF -> PSUM picks the Tensor engine (128 x 128); otherwise the Vector engine (32 x 32).
  EXPECT_FITS(transpose(kPs, {128, 128}, kSb, {128, 128}));
  EXPECT_BREAKS(transpose(kPs, {128, 128}, kSb, {128, 129}), "transpose-limit",
                "is larger than the Tensor engine's transpose of at most [128, 128]");
  EXPECT_FITS(transpose(kSb, {32, 32}, kSb, {32, 32}));
  EXPECT_BREAKS(transpose(kSb, {33, 32}, kSb, {32, 33}), "transpose-limit",
                "is larger than the Vector engine's transpose of at most [32, 32]");
  EXPECT_BREAKS(transpose(kSb, {32, 33}, kPs, {33, 32}), "transpose-limit", "Vector engine's");
  EXPECT_BREAKS(transpose(kPs, {64, 64}, kSb, {64, 64}, static_cast<int64_t>(nk::Engine::kVector)),
                "transpose-limit", "Vector engine's");
}

TEST(VerifierTranspose, TensorEngineReadsSbufWritesPsum) {
  EXPECT_BREAKS(transpose(kSb, {8, 32}, kSb, {32, 8}, kTensorE), "matmul-memory",
                "a Tensor-engine transpose reads SBUF and writes PSUM");
  EXPECT_BREAKS(transpose(kPs, {8, 32}, kPs, {32, 8}, kTensorE), "matmul-memory", "reads SBUF and writes PSUM");
}

TEST(VerifierTranspose, ShapeAndDtype) {
  EXPECT_BREAKS(transpose(kPs, {32, 8}, kSb, {32, 8}), "shape-mismatch", "destination", "must be [8, 32]");
  EXPECT_BREAKS(transpose(kPs, {8, 32}, kSb, {32, 8}, 0, D::kBFloat16), "dtype",
                "destination dtype bfloat16 must equal the data's float32");
}

// ---------------------------------------------------------------------------------------------
// tensor_reduce
// ---------------------------------------------------------------------------------------------

namespace {

nk::Kernel reduce(std::vector<int64_t> axes, std::vector<int64_t> dst_shape = {32, 1}) {
  Kb b;
  const nk::Access d = b.sb(std::move(dst_shape));
  const nk::Access s = b.sb({32, 4, 8});
  axes.insert(axes.begin(), {kAdd, 0});
  b.op(O::kTensorReduce, {d, s}, axes);
  return b.k;
}

}  // namespace

TEST(VerifierReduce, Axes) {
  EXPECT_FITS(reduce({2}, {32, 4}));
  EXPECT_FITS(reduce({1, 2}));
  EXPECT_FITS(reduce({2, 1}));  // in any order
  EXPECT_BREAKS(reduce({}), "reduce-axis", "no axis to reduce");
  for (int64_t axis : {0, 3, -1}) {
    EXPECT_BREAKS(reduce({axis}), "reduce-axis", "axis " + std::to_string(axis) + " of",
                  "the partition axis 0 is never reduced by tensor_reduce",
                  "use nisa.tensor_partition_reduce or a matmul", "axes are 1..2");
  }
  EXPECT_BREAKS(reduce({1}, {32, 8}), "reduce-axis", "the reduced axes must be the trailing free axes",
                "(e.g. 2, or 1 and 2)");
}

TEST(VerifierReduce, ResultShape) {
  EXPECT_BREAKS(reduce({2}, {32, 1}), "shape-mismatch", "destination", "must hold 4 element(s) per partition over 32 "
                "partitions");
  EXPECT_BREAKS(reduce({1, 2}, {16, 1}), "shape-mismatch", "must hold 1 element(s) per partition over 32 partitions");
}

// ---------------------------------------------------------------------------------------------
// Capacity of the live tensors
// ---------------------------------------------------------------------------------------------

TEST(VerifierCapacity, LiveSbufTensorsFitTogether) {
  // Two 128 KiB-per-partition tiles fit one at a time in trn2's 224 KiB, not together.
  auto kernel = [](bool together) {
    Kb b;
    const nk::Access x = b.decl(kSb, {128, 32768}, D::kFloat32, 3);
    const nk::Access y = b.decl(kSb, {128, 32768}, D::kFloat32, 4);
    const nk::Access out = b.hbm({128, 32768});
    b.op(O::kMemset, {x}, {}, {1.0}, 10);
    b.op(O::kDmaCopy, {out, x}, {0}, {}, 11);
    b.op(O::kMemset, {y}, {}, {2.0}, 12);
    if (together) b.op(O::kTensorTensor, {y, x, y}, {kAdd, 0}, {}, 13);
    b.op(O::kDmaCopy, {out, y}, {0}, {}, 14);
    return b.k;
  };
  EXPECT_FITS(kernel(false));
  const nk::Kernel k = kernel(true);
  EXPECT_BREAKS(k, "sbuf-capacity", "memset: at this instruction the live SBUF tensors need 262144 bytes per "
                "partition; trn2 has 229376", "Live: t0[128, 32768]@kernel.py:3 t1[128, 32768]@kernel.py:4",
                "Allocate tiles inside the loop that uses them, or use smaller tiles");
  EXPECT_EQ(error_of(k).loc.line, 12) << "the instruction where the second tile becomes live";
}

TEST(VerifierCapacity, PsumTensorsTakeWholeBanks) {
  // Each [128, 1] fp32 PSUM tile takes a whole 2 KiB bank: 8 live at once fit, 9 do not.
  auto kernel = [](int tiles) {
    Kb b;
    std::vector<nk::Access> t;
    for (int i = 0; i < tiles; ++i) t.push_back(b.ps({128, 1}));
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < tiles; ++i) b.op(O::kMemset, {t[i]}, {}, {0.0}, 20 + round * tiles + i);
    }
    return b.k;
  };
  EXPECT_FITS(kernel(8));
  const nk::Kernel k = kernel(9);
  EXPECT_BREAKS(k, "psum-capacity", "the live PSUM tensors need 18432 bytes per partition; trn2 has 16384 "
                "(8 banks of 2 KiB)", " ...", "Allocate tiles inside the loop");
  EXPECT_EQ(error_of(k).loc.line, 28) << "the ninth tile's first use";
}

TEST(VerifierCapacity, AliasesTakeNoMemory) {
  // A view of a 200 KiB tile as another dtype shares its bytes.
  Kb b;
  const nk::Access x = b.sb({128, 51200});
  const nk::Access v = b.sb({128, 102400}, D::kBFloat16);
  b.k.tensors[v.tensor].alias = x.tensor;
  b.op(O::kMemset, {x}, {}, {0.0});
  b.op(O::kMemset, {v}, {}, {0.0});
  b.op(O::kMemset, {x}, {}, {0.0});
  EXPECT_FITS(b.k);
  b.k.tensors[v.tensor].alias = -1;
  EXPECT_BREAKS(b.k, "sbuf-capacity", "the live SBUF tensors need 409600 bytes per partition");
}
