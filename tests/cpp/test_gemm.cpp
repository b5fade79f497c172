// The host GEMM behind every simulated Tensor-engine product (csrc/cpu/gemm.h): each path this
// CPU runs against a float64 oracle and against the scalar path, over odd shapes, transposed and
// strided operands, fp32 / bf16 / fp16; paths the CPU lacks are skipped, naming what it lacks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/transpose.h"

namespace {

using namespace neuron::cpu;

uint16_t top_bits(float f) {  // bf16 bits by truncation: the tests draw values exact in bf16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t half_bits(float f) {  // fp16 bits of a value exact in fp16 (normal or zero)
  if (f == 0.0f) return std::signbit(f) ? 0x8000 : 0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, exp = ((u >> 23) & 0xffu) - 112, man = (u >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | exp << 10 | man);
}

const char* dtype_name(Dtype d) {
  return d == Dtype::kFloat32 ? "float32" : d == Dtype::kBFloat16 ? "bfloat16" : "float16";
}

// A logical [R, C] matrix of values exact in `dtype`, stored row-major or transposed, with its
// leading dimension padded (strided), as the callers' operands come.
struct Stored {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  MatrixRef ref;
};

Stored store(const std::vector<float>& v, int64_t R, int64_t C, Dtype dtype, bool transposed) {
  Stored s;
  const int64_t pad = 3, ld = (transposed ? R : C) + pad, outer = transposed ? C : R;
  const size_t n = static_cast<size_t>(outer * ld);
  if (dtype == Dtype::kFloat32) s.f32.assign(n, std::nanf("")); else s.u16.assign(n, 0x7fc1);  // NaN padding
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      const int64_t at = transposed ? j * ld + i : i * ld + j;
      const float x = v[i * C + j];
      if (dtype == Dtype::kFloat32) s.f32[at] = x;
      else s.u16[at] = dtype == Dtype::kBFloat16 ? top_bits(x) : half_bits(x);
    }
  }
  const void* data = dtype == Dtype::kFloat32 ? static_cast<const void*>(s.f32.data()) : s.u16.data();
  s.ref = transposed ? MatrixRef{data, dtype, 1, ld} : MatrixRef{data, dtype, ld, 1};
  return s;
}

// Values exact in every dtype (8 significant bits, exponents -13..-1), or for fp32 any float.
std::vector<float> draw(int64_t n, Dtype dtype, std::mt19937& rng) {
  std::uniform_int_distribution<int> mant(-255, 255), ex(-6, 6);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = dtype == Dtype::kFloat32 ? normal(rng) : std::ldexp(static_cast<float>(mant(rng)), ex(rng) - 7);
  return v;
}

// A ParallelFor that runs [0, n) split into `count` ranges on as many threads at once.
ParallelFor split_over_threads(int count) {
  return [count](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    std::vector<std::thread> ts;
    for (int64_t t = 0; t < count; ++t) {
      if (n * t / count < n * (t + 1) / count) ts.emplace_back(body, n * t / count, n * (t + 1) / count);
    }
    for (auto& t : ts) t.join();
  };
}

struct Shape {
  int64_t M, N, K;
};
const Shape kShapes[] = {{1, 1, 1},    {7, 13, 31},   {13, 7, 257},  {31, 257, 13}, {257, 31, 7},
                         {6, 16, 256}, {12, 32, 513}, {1, 300, 257}, {300, 1, 129}, {100, 70, 300}};

std::vector<float> run(GemmPath path, const Shape& s, const MatrixRef& a, const MatrixRef& b, int64_t ldc,
                       const ParallelFor* par = nullptr, const std::vector<float>* c0 = nullptr) {
  std::vector<float> c(s.M * ldc, -7.0f);  // columns past N must stay -7
  if (c0) c = *c0;
  GemmOptions o;
  o.path = path;
  o.parallel = par;
  o.accumulate = c0 != nullptr;
  gemm(s.M, s.N, s.K, a, b, c.data(), ldc, o);
  return c;
}

class GemmPaths : public ::testing::TestWithParam<std::tuple<GemmPath, Dtype>> {
 protected:
  void SetUp() override {
    const std::string missing = gemm_path_missing(std::get<0>(GetParam()));
    if (!missing.empty()) {
      GTEST_SKIP() << "this CPU lacks " << missing << " for the " << gemm_path_name(std::get<0>(GetParam()))
                   << " path";
    }
  }
};

TEST_P(GemmPaths, MatchesFloat64AndTheScalarPathOnOddShapesAndLayouts) {
  const auto [path, dtype] = GetParam();
  for (const Shape& s : kShapes) {
    std::mt19937 rng(static_cast<unsigned>(s.M * 1000003 + s.N * 1009 + s.K));
    const auto av = draw(s.M * s.K, dtype, rng), bv = draw(s.K * s.N, dtype, rng);
    std::vector<double> ref(s.M * s.N), mag(s.M * s.N);
    for (int64_t m = 0; m < s.M; ++m) {
      for (int64_t n = 0; n < s.N; ++n) {
        double r = 0, g = 0;
        for (int64_t k = 0; k < s.K; ++k) {
          const double p = static_cast<double>(av[m * s.K + k]) * bv[k * s.N + n];
          r += p, g += std::fabs(p);
        }
        ref[m * s.N + n] = r, mag[m * s.N + n] = g;
      }
    }
    for (int layout = 0; layout < 4; ++layout) {
      SCOPED_TRACE(std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + " a" +
                   (layout & 1 ? "ᵀ" : "") + " b" + (layout & 2 ? "ᵀ" : ""));
      const Stored a = store(av, s.M, s.K, dtype, layout & 1), b = store(bv, s.K, s.N, dtype, layout & 2);
      const int64_t ldc = s.N + 5;
      const auto got = run(path, s, a.ref, b.ref, ldc);
      const auto scalar = run(GemmPath::kScalar, s, a.ref, b.ref, ldc);
      for (int64_t m = 0; m < s.M; ++m) {
        for (int64_t n = 0; n < ldc; ++n) {
          const float x = got[m * ldc + n];
          if (n >= s.N) {
            ASSERT_EQ(x, -7.0f) << "wrote past N at " << m << "," << n;
            continue;
          }
          // fp32 accumulation (and fp32 products for fp32 operands): each of the K + 1
          // roundings is within 2^-24 of a partial sum bounded by the sum of |products|.
          const double bound = mag[m * s.N + n] * static_cast<double>(s.K + 1) * std::ldexp(1.0, -24) + 1e-30;
          ASSERT_NEAR(x, ref[m * s.N + n], bound) << m << "," << n;
          ASSERT_NEAR(x, scalar[m * ldc + n], 2 * bound) << m << "," << n;
        }
      }
    }
  }
}

TEST_P(GemmPaths, SmallIntegerProductsAreExactOnEveryPath) {
  // Integers below 2^8 are exact in every dtype, their sums below 2^24 exact in fp32: any order
  // of summation gives the exact result, so every element must equal the scalar path's.
  const auto [path, dtype] = GetParam();
  for (const Shape& s : kShapes) {
    std::vector<float> av(s.M * s.K), bv(s.K * s.N);
    for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<float>(static_cast<int64_t>(i % 13) - 6);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<float>(static_cast<int64_t>(i % 7) - 3);
    const Stored a = store(av, s.M, s.K, dtype, false), b = store(bv, s.K, s.N, dtype, true);
    const auto got = run(path, s, a.ref, b.ref, s.N);
    for (int64_t m = 0; m < s.M; ++m) {
      for (int64_t n = 0; n < s.N; ++n) {
        float want = 0;
        for (int64_t k = 0; k < s.K; ++k) want += av[m * s.K + k] * bv[k * s.N + n];
        ASSERT_EQ(got[m * s.N + n], want) << s.M << "x" << s.N << "x" << s.K << " at " << m << "," << n;
      }
    }
  }
}

TEST_P(GemmPaths, AccumulatesIntoCAndIsIndependentOfTheThreadSplit) {
  const auto [path, dtype] = GetParam();
  const Shape s{257, 300, 129};  // above the size where threads are used
  std::mt19937 rng(7);
  const auto av = draw(s.M * s.K, dtype, rng), bv = draw(s.K * s.N, dtype, rng);
  const Stored a = store(av, s.M, s.K, dtype, true), b = store(bv, s.K, s.N, dtype, false);
  const ParallelFor ones = [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    for (int64_t i = n - 1; i >= 0; --i) body(i, i + 1);  // one task at a time, backwards
  };
  const ParallelFor threads = split_over_threads(3);
  const auto serial = run(path, s, a.ref, b.ref, s.N);
  for (const ParallelFor* par : {&ones, &threads}) {
    const auto split = run(path, s, a.ref, b.ref, s.N, par);
    ASSERT_EQ(std::memcmp(serial.data(), split.data(), serial.size() * 4), 0);
  }
  std::vector<float> c0(s.M * s.N);
  for (auto& x : c0) x = std::normal_distribution<float>()(rng);
  const auto acc = run(path, s, a.ref, b.ref, s.N, &threads, &c0);
  for (size_t i = 0; i < acc.size(); ++i) {
    ASSERT_NEAR(acc[i], c0[i] + serial[i], 1e-5 * (std::fabs(c0[i]) + std::fabs(serial[i]) + 1)) << i;
  }
}

TEST_P(GemmPaths, PrepackedBGivesTheSameResults) {
  const auto [path, dtype] = GetParam();
  for (const Shape& s : {Shape{13, 257, 129}, Shape{300, 31, 7}, Shape{1, 1, 1}}) {
    std::mt19937 rng(static_cast<unsigned>(s.M + s.N + s.K));
    const auto av = draw(s.M * s.K, dtype, rng), bv = draw(s.K * s.N, dtype, rng);
    const Stored a = store(av, s.M, s.K, dtype, true), b = store(bv, s.K, s.N, dtype, false);
    PackedB packed;
    pack_b(s.K, s.N, b.ref, dtype, path, packed);
    for (bool accumulate : {false, true}) {
      std::vector<float> c0(s.M * s.N, 0.25f);
      const auto want = run(path, s, a.ref, b.ref, s.N, nullptr, accumulate ? &c0 : nullptr);
      std::vector<float> got = accumulate ? c0 : std::vector<float>(s.M * s.N, -7.0f);
      GemmOptions o;
      o.path = path;
      o.accumulate = accumulate;
      gemm(s.M, a.ref, packed, got.data(), s.N, o);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
    }
    if (path != GemmPath::kScalar) {  // packed for another path: refused
      GemmOptions o;
      o.path = GemmPath::kScalar;
      std::vector<float> c(s.M * s.N);
      EXPECT_THROW(gemm(s.M, a.ref, packed, c.data(), s.N, o), std::invalid_argument);
    }
  }
}

TEST_P(GemmPaths, PackingSeveralBAtOnceOverThreadsGivesWhatEachPackGives) {
  // The NKI executor packs a chain's moving tiles together over the host's threads, into
  // PackedB it packed before (same shape: storage kept): each must hold pack_b's panels.
  const auto [path, dtype] = GetParam();
  const ParallelFor threads = split_over_threads(3);
  const Shape shapes[] = {{0, 512, 128}, {0, 257, 300}, {0, 31, 7}, {0, 16, 1}, {0, 700, 128}};
  std::mt19937 rng(5);
  std::vector<Stored> bs;
  std::vector<PackedB> want(std::size(shapes)), got(std::size(shapes));
  std::vector<PackBJob> jobs;
  for (size_t j = 0; j < std::size(shapes); ++j) {
    const Shape& s = shapes[j];
    bs.push_back(store(draw(s.K * s.N, dtype, rng), s.K, s.N, dtype, j % 2 == 1));  // row-major and transposed
    pack_b(s.K, s.N, bs[j].ref, dtype, path, want[j]);
    jobs.push_back({s.K, s.N, bs[j].ref, dtype, &got[j]});
  }
  for (int round = 0; round < 2; ++round) {
    for (auto& g : got) std::fill(g.words.begin(), g.words.end(), 0xdeadbeefu);
    const uint32_t* storage = got[0].words.data();
    pack_b(jobs, path, &threads);
    if (round == 1) EXPECT_EQ(got[0].words.data(), storage);  // packed again in place
    for (size_t j = 0; j < std::size(shapes); ++j) {
      ASSERT_EQ(got[j].words, want[j].words) << "job " << j << " round " << round;
      EXPECT_EQ(got[j].K, want[j].K);
      EXPECT_EQ(got[j].N, want[j].N);
    }
  }
}

TEST_P(GemmPaths, SumOfTermsIsOneGemmPerTermBitForBit) {
  // gemm_sum over K tiles (the NKI executor's chain of matmuls into one PSUM tile) equals gemm()
  // per term, accumulating after the first, whatever the thread split.
  const auto [path, dtype] = GetParam();
  const ParallelFor threads = split_over_threads(2);
  const int64_t M = 70, N = 200;
  const int64_t Ks[] = {128, 128, 37, 300};  // odd and over one K block
  std::mt19937 rng(11);
  std::vector<Stored> as, bs;
  std::vector<PackedB> packed(std::size(Ks));
  std::vector<GemmTerm> terms;
  for (size_t t = 0; t < std::size(Ks); ++t) {
    as.push_back(store(draw(M * Ks[t], dtype, rng), M, Ks[t], dtype, true));  // S [K, M], as NKI stores it
    bs.push_back(store(draw(Ks[t] * N, dtype, rng), Ks[t], N, dtype, false));
    pack_b(Ks[t], N, bs[t].ref, dtype, path, packed[t]);
  }
  for (size_t t = 0; t < std::size(Ks); ++t) terms.push_back({as[t].ref, &packed[t]});
  for (bool accumulate : {false, true}) {
    std::vector<float> want(M * N, 0.5f);
    for (size_t t = 0; t < std::size(Ks); ++t) {
      GemmOptions o;
      o.path = path;
      o.accumulate = accumulate || t > 0;
      gemm(M, N, Ks[t], as[t].ref, bs[t].ref, want.data(), N, o);
    }
    for (const ParallelFor* par : {static_cast<const ParallelFor*>(nullptr), &threads}) {
      std::vector<float> got(M * N, 0.5f);
      GemmOptions o;
      o.path = path;
      o.parallel = par;
      o.accumulate = accumulate;
      gemm_sum(M, terms, got.data(), N, o);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "accumulate=" << accumulate;
    }
  }
  // With A packed beforehand (pack_a, over threads): the same bits; A packed for another M refused.
  std::vector<PackedA> packed_a(std::size(Ks));
  std::vector<PackAJob> a_jobs;
  for (size_t t = 0; t < std::size(Ks); ++t) a_jobs.push_back({M, Ks[t], as[t].ref, dtype, &packed_a[t]});
  pack_a(a_jobs, path, &threads);
  for (const size_t every : {size_t{2}, size_t{1}}) {  // every other term's A packed beforehand, then all
    std::vector<GemmTerm> prepacked = terms;
    for (size_t t = 0; t < std::size(Ks); t += every) prepacked[t].packed_a = &packed_a[t];
    for (const ParallelFor* par : {static_cast<const ParallelFor*>(nullptr), &threads}) {
      std::vector<float> want(M * N, 0.5f), got(M * N, 0.5f);
      GemmOptions o;
      o.path = path;
      o.parallel = par;
      gemm_sum(M, terms, want.data(), N, o);
      gemm_sum(M, prepacked, got.data(), N, o);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << "every " << every;
    }
  }
  {
    PackedA short_a;
    pack_a({PackAJob{M - 1, Ks[0], as[0].ref, dtype, &short_a}}, path, nullptr);
    std::vector<GemmTerm> wrong{{as[0].ref, &packed[0], &short_a}};
    std::vector<float> c(M * N);
    GemmOptions o;
    o.path = path;
    EXPECT_THROW(gemm_sum(M, wrong, c.data(), N, o), std::invalid_argument);
  }
  PackedB narrow;  // another N: refused
  pack_b(Ks[0], N - 1, bs[0].ref, dtype, path, narrow);
  std::vector<GemmTerm> mixed{terms[0], {as[0].ref, &narrow}};
  std::vector<float> c(M * N);
  GemmOptions o;
  o.path = path;
  EXPECT_THROW(gemm_sum(M, mixed, c.data(), N, o), std::invalid_argument);
}

TEST_P(GemmPaths, EmptyContractionGivesZerosOrLeavesC) {
  const auto [path, dtype] = GetParam();
  const Shape s{5, 9, 0};
  const Stored a = store({}, 5, 0, dtype, false), b = store({}, 0, 9, dtype, false);
  for (float x : run(path, s, a.ref, b.ref, 9)) EXPECT_EQ(x, 0.0f);
  const std::vector<float> c0(45, 2.5f);
  for (float x : run(path, s, a.ref, b.ref, 9, nullptr, &c0)) EXPECT_EQ(x, 2.5f);
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, GemmPaths,
    ::testing::Combine(::testing::ValuesIn(kAllGemmPaths),
                       ::testing::Values(Dtype::kFloat32, Dtype::kBFloat16, Dtype::kFloat16)),
    [](const ::testing::TestParamInfo<std::tuple<GemmPath, Dtype>>& i) {
      return std::string(gemm_path_name(std::get<0>(i.param))) + "_" + dtype_name(std::get<1>(i.param));
    });

TEST(GemmPath, EnvironmentNamesAPathOrGetsAClearError) {
  EXPECT_EQ(parse_gemm_path(nullptr), best_gemm_path());
  EXPECT_EQ(parse_gemm_path(""), best_gemm_path());
  EXPECT_EQ(parse_gemm_path("auto"), best_gemm_path());
  EXPECT_EQ(parse_gemm_path("scalar"), GemmPath::kScalar);
  try {
    parse_gemm_path("avx3");
    FAIL() << "an unknown path was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("scalar, avx2, avx512 or avx512bf16"), std::string::npos) << e.what();
  }
  for (GemmPath p : kAllGemmPaths) {
    if (gemm_path_supported(p)) {
      EXPECT_EQ(parse_gemm_path(gemm_path_name(p)), p);
      continue;
    }
    try {
      parse_gemm_path(gemm_path_name(p));
      FAIL() << gemm_path_name(p) << " was accepted on a CPU that lacks " << gemm_path_missing(p);
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("lacks " + gemm_path_missing(p)), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(gemm_path_supported(GemmPath::kScalar));
  EXPECT_TRUE(gemm_path_supported(best_gemm_path()));
}

TEST(GemmPath, HalfToFloatIsExact) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(half_to_float(0xfc00)) && half_to_float(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
}

}  // namespace

// The executor's transposing copies (cpu/transpose.h): every path that runs here moves every bit
// pattern (NaNs included) to its transposed place, on full 8 x 8 blocks, ragged edges and padded
// leading dimensions.
TEST(Transpose32, EveryPathMatchesTheDefinitionBitForBit) {
  std::mt19937 rng(7);
  for (GemmPath path : {GemmPath::kScalar, GemmPath::kAvx2}) {
    if (!gemm_path_supported(path)) continue;
    for (auto [na, nb] : {std::pair<int64_t, int64_t>{8, 8}, {16, 24}, {13, 7}, {1, 30}, {33, 1}, {64, 129}}) {
      const int64_t lds = na + 3, ldd = nb + 5;
      std::vector<uint32_t> src(nb * lds), dst(na * ldd, 0xdeadbeefu);
      for (auto& v : src) v = rng();
      transpose32(src.data(), lds, dst.data(), ldd, na, nb, path);
      for (int64_t a = 0; a < na; ++a) {
        for (int64_t b = 0; b < nb; ++b) {
          ASSERT_EQ(dst[a * ldd + b], src[b * lds + a]) << gemm_path_name(path) << " " << na << "x" << nb;
        }
        for (int64_t b = nb; b < ldd; ++b) ASSERT_EQ(dst[a * ldd + b], 0xdeadbeefu) << "wrote past a row";
      }
    }
  }
}
