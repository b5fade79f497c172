// The NKI op table and name tables (csrc/nki/ir.h): every enum value has exactly one entry, every
// name round-trips name -> code -> name, attribute accessors resolve names through the table, and
// an instruction that does not fit its row is a verifier error, not a crash.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>

#include "nki/execute.h"
#include "nki/ir.h"
#include "nki_builders.h"

namespace {

using namespace nki_test;

TEST(NkiOpTable, EveryOpHasOneRowAndItsNameRoundTrips) {
  std::set<std::string> names;
  for (int i = 0; i < nk::kNumOps; ++i) {
    const nk::Op op = static_cast<nk::Op>(i);
    const nk::OpInfo& info = nk::op_info(op);
    EXPECT_EQ(info.op, op) << info.name;
    ASSERT_NE(info.name, nullptr);
    EXPECT_TRUE(names.insert(info.name).second) << "duplicate op name " << info.name;
    ASSERT_TRUE(nk::op_from_name(info.name).has_value()) << info.name;
    EXPECT_EQ(*nk::op_from_name(info.name), op);
    EXPECT_STREQ(nk::op_name(op), info.name);
    EXPECT_NE(info.engine, nk::Engine::kUnknown) << info.name;
    ASSERT_FALSE(info.operands.empty()) << info.name;
    EXPECT_STREQ(info.operands[0].name, op == nk::Op::kCoreBarrier     ? "data"
                                        : op == nk::Op::kDevicePrint ? "tensor"
                                                                       : "dst");
    // Names are unique per list; a variadic parameter is the last of its list.
    for (const auto* list : {&info.operands, &info.ints, &info.floats}) {
      std::set<std::string> seen;
      for (size_t j = 0; j < list->size(); ++j) {
        EXPECT_TRUE(seen.insert((*list)[j].name).second) << info.name << ": " << (*list)[j].name;
        if ((*list)[j].arity == nk::Arity::kVariadic) EXPECT_EQ(j + 1, list->size()) << info.name;
        EXPECT_GE((*list)[j].group, 1);
      }
    }
    for (size_t j = 0; j < info.ints.size(); ++j) EXPECT_EQ(nk::int_index(op, info.ints[j].name), static_cast<int>(j));
    for (size_t j = 0; j < info.floats.size(); ++j) {
      EXPECT_EQ(nk::float_index(op, info.floats[j].name), static_cast<int>(j));
    }
    for (size_t j = 0; j < info.operands.size(); ++j) {
      EXPECT_EQ(nk::operand_index(op, info.operands[j].name), static_cast<int>(j));
    }
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(nk::kNumOps));
  EXPECT_FALSE(nk::op_from_name("no_such_op").has_value());
}

TEST(NkiOpTable, EnginesAreTheHardwareOnes) {
  EXPECT_EQ(nk::engine_of(nk::Op::kMatmul), nk::Engine::kTensor);
  EXPECT_EQ(nk::engine_of(nk::Op::kActivation), nk::Engine::kScalar);
  EXPECT_EQ(nk::engine_of(nk::Op::kTensorTensor), nk::Engine::kVector);
  EXPECT_EQ(nk::engine_of(nk::Op::kIota), nk::Engine::kGpSimd);
  EXPECT_EQ(nk::engine_of(nk::Op::kDmaCopy), nk::Engine::kDma);
  EXPECT_EQ(nk::engine_of(nk::Op::kCoreBarrier), nk::Engine::kSync);
}

TEST(NkiNameTables, EveryEnumsNamesRoundTrip) {
  std::set<std::string> seen;
  for (int i = 0; i < nk::kNumDTypes; ++i) {
    const auto d = static_cast<nk::DType>(i);
    EXPECT_TRUE(seen.insert(nk::dtype_name(d)).second);
    ASSERT_TRUE(nk::dtype_from_name(nk::dtype_name(d)).has_value()) << nk::dtype_name(d);
    EXPECT_EQ(*nk::dtype_from_name(nk::dtype_name(d)), d);
  }
  seen.clear();
  for (int i = 0; i < nk::kNumAlu; ++i) {
    const auto a = static_cast<nk::Alu>(i);
    EXPECT_TRUE(seen.insert(nk::alu_name(a)).second);
    ASSERT_TRUE(nk::alu_from_name(nk::alu_name(a)).has_value()) << nk::alu_name(a);
    EXPECT_EQ(*nk::alu_from_name(nk::alu_name(a)), a);
  }
  seen.clear();
  for (int i = 0; i < nk::kNumAct; ++i) {
    const auto a = static_cast<nk::Act>(i);
    EXPECT_TRUE(seen.insert(nk::act_name(a)).second);
    ASSERT_TRUE(nk::act_from_name(nk::act_name(a)).has_value()) << nk::act_name(a);
    EXPECT_EQ(*nk::act_from_name(nk::act_name(a)), a);
  }
  seen.clear();
  for (int i = 0; i < nk::kNumEngines; ++i) {
    const auto e = static_cast<nk::Engine>(i);
    EXPECT_TRUE(seen.insert(nk::engine_name(e)).second);
    EXPECT_EQ(*nk::engine_from_name(nk::engine_name(e)), e);
  }
  // Reduce commands, DGE and out-of-bounds modes, memories: nki.isa's / nki.language's names.
  auto round_trip = [](int count, auto name, auto from_name, const char* what) {
    std::set<std::string> names;
    for (int i = 0; i < count; ++i) {
      using E = decltype(*from_name(""));
      const auto e = static_cast<std::decay_t<E>>(i);
      SCOPED_TRACE(std::string(what) + " " + std::to_string(i));
      ASSERT_NE(name(e), nullptr);
      EXPECT_TRUE(names.insert(name(e)).second) << name(e);
      ASSERT_TRUE(from_name(name(e)).has_value()) << name(e);
      EXPECT_EQ(*from_name(name(e)), e);
    }
    EXPECT_FALSE(from_name("no_such_name").has_value());
  };
  round_trip(nk::kNumReduceCmds, nk::reduce_cmd_name, nk::reduce_cmd_from_name, "reduce_cmd");
  round_trip(nk::kNumDgeModes, nk::dge_mode_name, nk::dge_mode_from_name, "dge_mode");
  round_trip(nk::kNumOobModes, nk::oob_mode_name, nk::oob_mode_from_name, "oob_mode");
  seen.clear();
  for (int i = 0; i < nk::kNumBuffers; ++i) {
    EXPECT_TRUE(seen.insert(nk::buffer_name(static_cast<nk::Buffer>(i))).second);
  }
  // The names the front end spells.
  EXPECT_EQ(*nk::reduce_cmd_from_name("reset_reduce"), nk::ReduceCmd::kResetReduce);
  EXPECT_EQ(*nk::dge_mode_from_name("swdge"), nk::DgeMode::kSwdge);
  EXPECT_EQ(*nk::oob_mode_from_name("skip"), nk::OobMode::kSkip);
  EXPECT_TRUE(nk::accumulates(nk::ReduceCmd::kLoadReduce) && !nk::accumulates(nk::ReduceCmd::kReset));
  EXPECT_TRUE(nk::resets(nk::ReduceCmd::kResetReduce) && !nk::resets(nk::ReduceCmd::kLoadReduce));
  EXPECT_EQ(*nk::dtype_from_name("bfloat16"), nk::DType::kBFloat16);
  EXPECT_EQ(*nk::alu_from_name("bitwise_xor"), nk::Alu::kBitwiseXor);
  EXPECT_EQ(*nk::act_from_name("gelu_apprx_tanh"), nk::Act::kGeluApprxTanh);
  EXPECT_FALSE(nk::dtype_from_name("float64").has_value());
  EXPECT_FALSE(nk::alu_from_name("exp").has_value());
}

TEST(NkiOpTable, AttributesAreReadByName) {
  nk::Instr in{nk::Op::kTensorReduce, {}, {static_cast<int64_t>(nk::Alu::kMaximum), 1, 2, 3}, {}, {}};
  EXPECT_EQ(nk::int_attr(in, "op"), static_cast<int64_t>(nk::Alu::kMaximum));
  EXPECT_EQ(nk::int_attr(in, "negate"), 1);
  EXPECT_EQ(nk::int_tail(in, "axis"), (std::vector<int64_t>{2, 3}));
  EXPECT_THROW(nk::int_attr(in, "no_such_attribute"), std::logic_error);

  nk::Instr mm{nk::Op::kMatmul, {}, {}, {}, {}};  // optional attributes left off
  EXPECT_EQ(nk::int_attr(mm, "accumulate", -1), -1);
  EXPECT_THROW(nk::int_attr(mm, "accumulate"), std::invalid_argument);

  nk::Instr ts{nk::Op::kTensorScalar, {}, {0, 0, -1, 0}, {2.5, 0.0}, {}};
  EXPECT_EQ(nk::float_attr(ts, "operand0"), 2.5);
  EXPECT_EQ(nk::layout_problem(ts), "0 operands; expected dst, data, operand0?, operand1?");
}

// An instruction whose attribute list does not fit its row is refused by the verifier with the
// row's names, before anything reads an attribute.
TEST(NkiOpTable, AnInstructionThatDoesNotFitItsRowIsAVerifierError) {
  nk::Kernel k;
  k.target = nk::target_for("trn2");
  const int a = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {4, 8});
  const int b = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {4, 8});
  instr(k, nk::Op::kTensorScalar, {whole(k, b), whole(k, a), {}, {}}, {0, 0}, {1.0, 0.0}, 7);
  try {
    nk::verify(k);
    FAIL() << "expected a VerifyError";
  } catch (const nk::VerifyError& e) {
    EXPECT_EQ(e.rule, "instr-layout");
    EXPECT_EQ(e.loc.line, 7);
    EXPECT_NE(std::string(e.what()).find("op0, reverse0, op1, reverse1"), std::string::npos) << e.what();
  }
  // Optional operands left off the end are absent ones: the kernel verifies and runs.
  k.instrs.clear();
  instr(k, nk::Op::kMemset, {whole(k, a)}, {}, {3.0});
  instr(k, nk::Op::kTensorScalar, {whole(k, b), whole(k, a)}, {static_cast<int64_t>(nk::Alu::kMultiply), 0, -1, 0},
        {2.0, 0.0});
  const int out = tensor(k, nk::Buffer::kPrivateHbm, nk::DType::kFloat32, {4, 8}, /*external=*/0);
  instr(k, nk::Op::kDmaCopy, {whole(k, out), whole(k, b)}, {0});
  nk::Program p(k);
  std::vector<float> result(32, 0.0f);
  p.run({result.data()});
  for (float v : result) EXPECT_EQ(v, 6.0f);
}

}  // namespace
