// GoogleTest suite for the NKI simulator core (csrc/nki): kernels built by hand in the IR,
// verified and executed without Python or torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "nki/execute.h"
#include "nki/numerics.h"
#include "nki_builders.h"

using namespace nki_test;

TEST(NkiExecutor, MatmulFirstWriteOverwritesLaterWritesAccumulate) {
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int a = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {2, 3}, 0);
  const int b = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {2, 3}, 1);
  const int out = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {3, 3}, 2);
  const int sa = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {2, 3});
  const int sb = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {2, 3});
  const int ps = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {3, 3});
  const int r = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {3, 3});
  instr(k, nk::Op::kDmaCopy, {whole(k, sa), whole(k, a)});
  instr(k, nk::Op::kDmaCopy, {whole(k, sb), whole(k, b)});
  for (int i = 0; i < 2; ++i) instr(k, nk::Op::kMatmul, {whole(k, ps), whole(k, sa), whole(k, sb)}, {-1, 0});
  instr(k, nk::Op::kTensorCopy, {whole(k, r), whole(k, ps)}, {0});
  instr(k, nk::Op::kDmaCopy, {whole(k, out), whole(k, r)});
  nk::Program p(std::move(k));
  std::vector<float> A{1, 2, 3, 4, 5, 6}, B{1, 0, 2, 0, 1, 1}, O(9, -1);
  p.run({A.data(), B.data(), O.data()});
  for (int m = 0; m < 3; ++m)
    for (int n = 0; n < 3; ++n) {
      const float want = 2 * (A[m] * B[n] + A[3 + m] * B[3 + n]);  // two matmuls: overwrite, then add
      EXPECT_EQ(O[m * 3 + n], want) << m << "," << n;
    }
  p.run({A.data(), B.data(), O.data()});  // a second run starts from fresh PSUM again
  EXPECT_EQ(O[0], 2 * (A[0] * B[0] + A[3] * B[3]));
}

// A [P, n_k, F] SBUF tile's [0:P, kt, 0:F] slice: one K tile of a stationary or moving operand,
// as the shipped matmul kernel slices it.
nk::Access k_tile(const nk::Kernel& k, int t, int64_t kt) {
  const auto& s = k.tensors[t].shape;
  return {t, kt * s[2], {{s[1] * s[2], s[0]}, {1, s[2]}}};
}

// The matmul kernel's block: a and b loaded to SBUF as K tiles, n_k matmuls accumulating into one
// PSUM tile (accumulate=None), copied out. With `break_chain`, a memset of an unrelated tile
// between the matmuls keeps the executor from running them as one GEMM.
nk::Kernel k_tiled_matmul(int64_t P, int64_t n_k, int64_t M, int64_t N, bool break_chain) {
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int a = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {P, n_k, M}, 0);
  const int b = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {P, n_k, N}, 1);
  const int out = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {M, N}, 2);
  const int sa = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {P, n_k, M});
  const int sb = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {P, n_k, N});
  const int other = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {1, 1});
  const int ps = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {M, N});
  const int r = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {M, N});
  instr(k, nk::Op::kDmaCopy, {whole(k, sa), whole(k, a)});
  instr(k, nk::Op::kDmaCopy, {whole(k, sb), whole(k, b)});
  instr(k, nk::Op::kMemset, {whole(k, other)}, {}, {0.0});
  for (int64_t kt = 0; kt < n_k; ++kt) {
    instr(k, nk::Op::kMatmul, {whole(k, ps), k_tile(k, sa, kt), k_tile(k, sb, kt)}, {-1, 0});
    if (break_chain) instr(k, nk::Op::kMemset, {whole(k, other)}, {}, {1.0});
  }
  instr(k, nk::Op::kTensorCopy, {whole(k, r), whole(k, ps)}, {0});
  instr(k, nk::Op::kDmaCopy, {whole(k, out), whole(k, r)});
  return k;
}

TEST(NkiExecutor, MatmulsAccumulatingIntoOneTileGiveTheFloat64SumAsOneChainOrOneByOne) {
  // Consecutive matmuls into one PSUM tile run as one host GEMM over their K tiles (threaded
  // here, on a hook with two threads): the float64 sum within fp32 rounding, and bit for bit what
  // the same matmuls give one at a time.
  nk::set_parallel_for([](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    std::thread t(body, 0, n / 2);
    body(n / 2, n);
    t.join();
  });
  const int64_t P = 128, n_k = 5, M = 96, N = 200;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> A(P * n_k * M), B(P * n_k * N);  // A [K, M] = a.T, B [K, N] with K = (p, kt)
  for (auto& x : A) x = normal(rng);
  for (auto& x : B) x = normal(rng);
  std::vector<float> chained(M * N, -1), single(M * N, -1);
  nk::Program(k_tiled_matmul(P, n_k, M, N, false)).run({A.data(), B.data(), chained.data()});
  nk::Program(k_tiled_matmul(P, n_k, M, N, true)).run({A.data(), B.data(), single.data()});
  nk::set_parallel_for(nullptr);
  EXPECT_EQ(std::memcmp(chained.data(), single.data(), chained.size() * 4), 0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double want = 0, mag = 0;
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t kt = 0; kt < n_k; ++kt) {
          const double x = static_cast<double>(A[(p * n_k + kt) * M + m]) * B[(p * n_k + kt) * N + n];
          want += x, mag += std::fabs(x);
        }
      }
      ASSERT_NEAR(chained[m * N + n], want, mag * (P * n_k + 1) * std::ldexp(1.0, -24)) << m << "," << n;
    }
  }
}

TEST(NkiExecutor, AWriteBetweenMatmulsIsSeenByTheNextOneAndAccumulateFalseRestartsTheSum) {
  // matmul(S, V); S <- S2 (DMA); matmul(S, V); V <- V2 (DMA); matmul(S, V); matmul(S, V, accumulate=False);
  // matmul(S, V): the writes between matmuls end their K sum and the later ones read the new
  // data; accumulate=False overwrites what the earlier matmuls summed.
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int64_t K = 4, M = 3, N = 5;
  const int s_in = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {2, K, M}, 0);
  const int v_in = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {2, K, N}, 1);
  const int out = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {2, M, N}, 2);
  const int s = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {K, M});
  const int v = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {K, N});
  const int ps = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {M, N});
  const int r = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {M, N});
  auto hbm = [&](int t, int64_t i) {  // t[i] of a [2, R, C] HBM tensor
    const auto& sh = k.tensors[t].shape;
    return nk::Access{t, i * sh[1] * sh[2], {{sh[2], sh[1]}, {1, sh[2]}}};
  };
  auto matmul = [&](int64_t acc) { instr(k, nk::Op::kMatmul, {whole(k, ps), whole(k, s), whole(k, v)}, {acc, 0}); };
  auto store = [&](int64_t i) {
    instr(k, nk::Op::kTensorCopy, {whole(k, r), whole(k, ps)}, {0});
    instr(k, nk::Op::kDmaCopy, {hbm(out, i), whole(k, r)});
  };
  instr(k, nk::Op::kDmaCopy, {whole(k, s), hbm(s_in, 0)});
  instr(k, nk::Op::kDmaCopy, {whole(k, v), hbm(v_in, 0)});
  matmul(-1);
  instr(k, nk::Op::kDmaCopy, {whole(k, s), hbm(s_in, 1)});
  matmul(-1);
  instr(k, nk::Op::kDmaCopy, {whole(k, v), hbm(v_in, 1)});
  matmul(-1);
  store(0);
  matmul(1);
  matmul(0);
  matmul(-1);
  store(1);
  nk::Program p(std::move(k));
  std::vector<float> S(2 * K * M), V(2 * K * N), O(2 * M * N, -1);
  for (size_t i = 0; i < S.size(); ++i) S[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  for (size_t i = 0; i < V.size(); ++i) V[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
  p.run({S.data(), V.data(), O.data()});
  auto prod = [&](int si, int vi, int64_t m, int64_t n) {  // (S_si.T @ V_vi)[m, n], exact in small integers
    float x = 0;
    for (int64_t kk = 0; kk < K; ++kk) x += S[(si * K + kk) * M + m] * V[(vi * K + kk) * N + n];
    return x;
  };
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(O[m * N + n], prod(0, 0, m, n) + prod(1, 0, m, n) + prod(1, 1, m, n)) << m << "," << n;
      EXPECT_EQ(O[M * N + m * N + n], 2 * prod(1, 1, m, n)) << m << "," << n;  // accumulate=False restarted it
    }
  }
}

TEST(NkiExecutor, WritesRoundToNearestEvenAndCopiesKeepBits) {
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int in = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {1, 4}, 0);
  const int out = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {1, 4}, 1);
  const int bf = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {1, 4});
  instr(k, nk::Op::kDmaCopy, {whole(k, bf), whole(k, in)});
  instr(k, nk::Op::kDmaCopy, {whole(k, out), whole(k, bf)});
  nk::Program p(std::move(k));
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0); 1 + 3*2^-8 to 1 + 2^-6.
  std::vector<float> I{1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -2.5f, 65504.0f}, O(4);
  p.run({I.data(), O.data()});
  EXPECT_EQ(O[0], 1.0f);
  EXPECT_EQ(O[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(O[2], -2.5f);
  EXPECT_EQ(O[3], 65536.0f);
}

TEST(NkiNumerics, Fp8EncodingsRoundAndOverflowAsSpecified) {
  EXPECT_EQ(nk::encode_minifloat(448.0f, nk::kE4M3FN), 0x7eu);
  EXPECT_EQ(nk::encode_minifloat(460.0f, nk::kE4M3FN), 0x7eu);         // rounds down to 448
  EXPECT_TRUE(std::isnan(nk::decode_minifloat(nk::encode_minifloat(500.0f, nk::kE4M3FN), nk::kE4M3FN)));
  EXPECT_TRUE(std::isinf(nk::decode_minifloat(nk::encode_minifloat(1e6f, nk::kE5M2), nk::kE5M2)));
  EXPECT_EQ(nk::decode_minifloat(nk::encode_minifloat(0.3f, nk::kE5M2), nk::kE5M2), 0.3125f);
  for (int c = 0; c < 256; ++c) {  // every finite code decodes and re-encodes to itself
    const float v = nk::decode_minifloat(c, nk::kE4M3FN);
    if (!std::isnan(v) && v != 0.0f) EXPECT_EQ(nk::encode_minifloat(v, nk::kE4M3FN), static_cast<uint32_t>(c));
  }
  EXPECT_EQ(nk::saturate_round<int8_t>(2.5f), 2);
  EXPECT_EQ(nk::saturate_round<int8_t>(300.0f), 127);
  EXPECT_EQ(nk::saturate_round<int32_t>(NAN), 0);
}

TEST(NkiVerifier, RejectsTooManyPartitionsAtTheDeclaration) {
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int in = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {256, 512}, 0);
  const int t = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {256, 512}, -1, 7);
  instr(k, nk::Op::kDmaCopy, {whole(k, t), whole(k, in)}, {}, {}, 8);
  try {
    nk::verify(k);
    FAIL() << "a [256, 512] SBUF tile was accepted";
  } catch (const nk::VerifyError& e) {
    EXPECT_EQ(e.rule, "partition-limit");
    EXPECT_EQ(e.loc.line, 7);
    EXPECT_NE(std::string(e.what()).find("at most 128"), std::string::npos);
  }
}

TEST(NkiVerifier, MatmulMovingFreeLimit) {
  // trn3 writes up to 4096 fp32 results (all 8 PSUM banks); one more column is rejected.
  nk::Kernel k{nk::target_for("trn3"), {}, {}};
  const int s = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 128});
  const int m = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 4097});
  const int d = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {128, 4096});
  instr(k, nk::Op::kMatmul, {whole(k, d), whole(k, s), whole(k, m)}, {-1, 0}, {}, 3);
  try {
    nk::verify(k);
    FAIL();
  } catch (const nk::VerifyError& e) {
    EXPECT_EQ(e.rule, "matmul-moving-free");
    EXPECT_EQ(e.loc.line, 3);
  }
}

TEST(NkiExecutor, DevicePrintHandsOverValuesInProgramOrderAndChangesNothing) {
  // memset 1.5 -> print -> memset -2 -> print a bf16 copy, an int32 copy and a strided view -> store.
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int out = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {2, 3}, 0);
  const int t = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {2, 3});
  const int bf = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {2, 3});
  const int i32 = tensor(k, nk::Buffer::kSbuf, nk::DType::kInt32, {2, 3});
  auto print = [&](nk::Access a, const char* label) {
    k.instrs.push_back({nk::Op::kDevicePrint, {std::move(a)}, {}, {}, {"kernel.py", 0}, label});
  };
  instr(k, nk::Op::kMemset, {whole(k, t)}, {}, {1.5});
  print(whole(k, t), "first:");
  instr(k, nk::Op::kMemset, {whole(k, t)}, {}, {-2.0});
  instr(k, nk::Op::kIota, {whole(k, i32)}, {7, 10, 1, 3});  // 7 + 10 * partition + column
  instr(k, nk::Op::kTensorCopy, {whole(k, bf), whole(k, t)}, {0});
  print(whole(k, bf), "bf16:");
  print(whole(k, i32), "ints:");
  print({t, 1, {{3, 2}, {1, 1}}}, "column 1:");  // t[:, 1:2]
  instr(k, nk::Op::kDmaCopy, {whole(k, out), whole(k, t)});
  nk::Program p(std::move(k));

  std::vector<nk::PrintedTensor> got;
  nk::set_print_sink([&](const nk::PrintedTensor& x) { got.push_back(x); });
  std::vector<float> O(6, 0);
  p.run({O.data()});
  nk::set_print_sink(nullptr);
  for (float v : O) EXPECT_EQ(v, -2.0f);  // the store after the prints sees the kernel's values
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].label, "first:");
  EXPECT_EQ(got[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(got[0].floats, std::vector<float>(6, 1.5f));  // the value at that point, not the final one
  EXPECT_EQ(got[1].dtype, nk::DType::kBFloat16);
  EXPECT_EQ(got[1].floats, std::vector<float>(6, -2.0f));
  EXPECT_EQ(got[2].ints, (std::vector<int64_t>{7, 8, 9, 17, 18, 19}));
  EXPECT_TRUE(got[2].floats.empty());
  EXPECT_EQ(got[3].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(got[3].floats, std::vector<float>(2, -2.0f));
}

TEST(NkiExecutor, DevicePrintFormatsLikeNumpyAndSummarizesLargeTensors) {
  nk::PrintedTensor small{"x:", nk::DType::kFloat32, {2, 2}, {1.0f, 0.5f, -3.0f, 0.1f}, {}};
  EXPECT_EQ(nk::format_printed(small), "x: [[1 0.5]\n [-3 0.100000001]]");
  nk::PrintedTensor flags{"b", nk::DType::kBool, {3}, {}, {1, 0, 1}};
  EXPECT_EQ(nk::format_printed(flags), "b [True False True]");
  nk::PrintedTensor big{"big", nk::DType::kInt32, {100, 20}, {}, std::vector<int64_t>(2000)};
  for (int64_t i = 0; i < 2000; ++i) big.ints[i] = i;
  const std::string s = nk::format_printed(big);
  EXPECT_EQ(s.rfind("big [[0 1 2 ... 17 18 19]\n [20 21 22 ... 37 38 39]\n [40 ", 0), 0u) << s;
  EXPECT_NE(s.find(" ...\n [1940 1941 1942 ... 1957 1958 1959]"), std::string::npos) << s;
  EXPECT_EQ(s.substr(s.size() - 20), "... 1997 1998 1999]]") << s;
  EXPECT_EQ(s.find("100 101"), std::string::npos);  // rows 3..96 are elided
}
