// GoogleTest suite for the engine model (csrc/nki/cost_model.h): schedules of hand-built kernels
// against schedules computed by hand from the cost rules and the chip facts, and properties.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "nki/cost_model.h"
#include "nki_builders.h"
#include "runtime/platform.h"

using namespace nki_test;
namespace rt = neuron::rt;

namespace {

const rt::ChipFacts& chip(const char* name) { return *rt::find_chip(name); }

// One DMA queue's rate: the chip's per-engine DMA rate, capped so the core's queues together
// stay within the core's share of HBM bandwidth (bytes per ns).
double queue_rate(const rt::ChipFacts& c) {
  return std::min(c.dma_engine_gbps, c.hbm_tbps * 1000.0 / c.physical_cores / c.dma_engines_per_core);
}

const nk::InstrTiming& at(const nk::Estimate& e, int program, int index) {
  for (const auto& t : e.instrs)
    if (t.program == program && t.index == index) return t;
  throw std::out_of_range("no such instruction");
}

nk::Estimate run(const nk::Kernel& k, const rt::ChipFacts& c) { return nk::estimate({&k}, c); }

// A [128, 512] fp32 load HBM -> SBUF: 16 queues x 8 partition rows of 2 KiB after the DGE's 600 ns.
double load_ns(const rt::ChipFacts& c) { return 600.0 + 8 * 512 * 4 / queue_rate(c); }

}  // namespace

TEST(EngineModel, IndependentDmaAndMatmulOverlap) {
  const auto& c = chip("trn1");  // no power throttle: the matmul runs at full rate
  nk::Kernel k{nk::target_for("trn1"), {}, {}};
  const int x = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {128, 512}, 0);
  const int t = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {128, 512});
  const int s = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 128});
  const int m = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 512});
  const int ps = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {128, 512});
  instr(k, nk::Op::kDmaCopy, {whole(k, t), whole(k, x)});
  instr(k, nk::Op::kMatmul, {whole(k, ps), whole(k, s), whole(k, m)}, {-1, 0});
  const nk::Estimate e = run(k, c);
  // matmul: max(N=512, 64) cycles + LoadStationary 128 at 2.8 GHz, from t=0 beside the DMA.
  const double mm = (512 + 128) / c.tensor_ghz;
  EXPECT_DOUBLE_EQ(at(e, 0, 1).start_ns, 0);
  EXPECT_NEAR(at(e, 0, 1).end_ns, mm, 1e-9);
  EXPECT_NEAR(at(e, 0, 0).end_ns, load_ns(c), 1e-9);
  EXPECT_NEAR(e.total_ns, std::max(mm, load_ns(c)), 1e-9);
  EXPECT_EQ(e.hbm_read_bytes, 128 * 512 * 4);
  EXPECT_EQ(e.hbm_write_bytes, 0);
  EXPECT_DOUBLE_EQ(e.model_flops, 2.0 * 128 * 128 * 512);
  // Every queue carried one slice of the load.
  EXPECT_EQ(e.dma.size(), static_cast<size_t>(c.dma_engines_per_core));

  // The same matmul reading the loaded tile waits for the DMA.
  nk::Kernel k2 = k;
  k2.instrs[1].args[2] = whole(k2, t);
  k2.tensors[t].dtype = nk::DType::kBFloat16;
  const nk::Estimate e2 = run(k2, c);
  const double load_bf16 = 600.0 + 8 * 512 * 2 / queue_rate(c);
  EXPECT_NEAR(at(e2, 0, 1).start_ns, load_bf16, 1e-9);
  EXPECT_NEAR(e2.total_ns, load_bf16 + mm, 1e-9);
}

TEST(EngineModel, DependentChainPaysTheFixedLatencyIndependentWorkPipelines) {
  const auto& c = chip("trn2");
  auto chain = [&](bool dependent) {
    nk::Kernel k{nk::target_for("trn2"), {}, {}};
    std::vector<int> t;
    for (int i = 0; i < 4; ++i) t.push_back(tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {128, 512}));
    for (int i = 0; i < 3; ++i) {
      const int src = dependent ? t[i] : t[0];
      const int dst = dependent ? t[i + 1] : t[1 + i];
      // tensor_scalar (one tensor input): dst = src * 2
      instr(k, nk::Op::kTensorScalar, {whole(k, dst), whole(k, src), nk::Access{}, nk::Access{}}, {2, 0, -1, 0}, {2.0, 0.0});
    }
    return run(k, c);
  };
  const double op = (60 + 512) / c.vector_ghz;  // SBUF access + N cycles (fp32: no performance mode)
  const double dep = 100 / c.vector_ghz;
  const nk::Estimate d = chain(true), i = chain(false);
  for (int n = 0; n < 3; ++n) {
    EXPECT_NEAR(at(d, 0, n).start_ns, n * (op + dep), 1e-9) << n;
    EXPECT_NEAR(at(i, 0, n).start_ns, n * op, 1e-9) << n;
  }
  EXPECT_NEAR(d.total_ns, 3 * op + 2 * dep, 1e-9);
  EXPECT_NEAR(i.total_ns, 3 * op, 1e-9);
  EXPECT_EQ(d.tracks[static_cast<int>(nk::Track::kVector)].instructions, 3);
  EXPECT_NEAR(i.active_percent(nk::Track::kVector), 100.0, 1e-9);
}

TEST(EngineModel, PsumAccumulationGroupRunsBackToBackThenIsEvicted) {
  const auto& c = chip("trn1");
  nk::Kernel k{nk::target_for("trn1"), {}, {}};
  const int st = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 4, 128});
  const int mv = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 4, 512});
  const int ps = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {128, 512});
  const int out = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {128, 512});
  for (int kt = 0; kt < 4; ++kt) {
    nk::Access s{st, kt * 128, {{4 * 128, 128}, {1, 128}}}, m{mv, kt * 512, {{4 * 512, 128}, {1, 512}}};
    instr(k, nk::Op::kMatmul, {whole(k, ps), s, m}, {-1, 0});
  }
  // The same stationary again: no LoadStationary.
  instr(k, nk::Op::kMatmul, {whole(k, ps), nk::Access{st, 3 * 128, {{4 * 128, 128}, {1, 128}}},
                             nk::Access{mv, 0, {{4 * 512, 128}, {1, 512}}}}, {1, 0});
  instr(k, nk::Op::kTensorCopy, {whole(k, out), whole(k, ps)}, {0});
  const nk::Estimate e = run(k, c);
  const double mm = (512 + 128) / c.tensor_ghz, mm_same = 512 / c.tensor_ghz;
  for (int kt = 0; kt < 4; ++kt) EXPECT_NEAR(at(e, 0, kt).start_ns, kt * mm, 1e-9) << kt;
  EXPECT_NEAR(at(e, 0, 4).end_ns, 4 * mm + mm_same, 1e-9);
  // The eviction waits for the group's last matmul and TensorE's fixed latency.
  const double evict = 4 * mm + mm_same + 100 / c.tensor_ghz;
  EXPECT_NEAR(at(e, 0, 5).start_ns, evict, 1e-9);
  EXPECT_NEAR(e.total_ns, evict + (60 + 512) / c.vector_ghz, 1e-9);
  EXPECT_DOUBLE_EQ(e.model_flops, 5 * 2.0 * 128 * 128 * 512);
}

TEST(EngineModel, TwoProgramsSendRecv) {
  const auto& c = chip("trn2");
  auto program = [&](bool produce) {
    nk::Kernel k{nk::target_for("trn2"), {}, {}};
    const int src = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {128, 512});
    const int dst = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {128, 512});
    if (produce) instr(k, nk::Op::kMemset, {whole(k, src)}, {}, {1.0});
    instr(k, nk::Op::kSendRecv, {whole(k, dst), whole(k, src)}, {produce ? 1 : 0, produce ? 1 : 0, 0});
    return k;
  };
  const nk::Kernel p0 = program(true), p1 = program(false);
  const nk::Estimate e = nk::estimate({&p0, &p1}, c);
  // Program 0's payload is ready after the memset and VectorE's fixed latency; both receives then
  // move 128 rows of 2 KiB over the 16 queues after the DGE's 600 ns.
  const double memset = (60 + 512) / c.vector_ghz, ready = memset + 100 / c.vector_ghz;
  const double xfer = 8 * 512 * 4 / queue_rate(c);
  EXPECT_NEAR(at(e, 0, 0).end_ns, memset, 1e-9);
  EXPECT_NEAR(at(e, 1, 0).start_ns, ready + 600, 1e-9);
  EXPECT_NEAR(at(e, 1, 0).end_ns, ready + 600 + xfer, 1e-9);
  EXPECT_NEAR(at(e, 0, 1).end_ns, ready + 600 + xfer, 1e-9);  // its own source is the memset's tile
  EXPECT_NEAR(e.total_ns, ready + 600 + xfer, 1e-9);

  // A receive nobody sends to waits forever: an error naming where, as run_launch raises.
  const nk::Kernel lone = program(true);
  EXPECT_THROW(nk::estimate({&lone, &p0}, c), std::runtime_error);
}

TEST(EngineModel, PowerThrottleStartsAtHalfRateAndRampsOver3us) {
  const auto& c = chip("trn2");
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int s = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 128});
  const int m = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 512});
  const int ps = tensor(k, nk::Buffer::kPsum, nk::DType::kFloat32, {128, 512});
  for (int i = 0; i < 200; ++i) instr(k, nk::Op::kMatmul, {whole(k, ps), whole(k, s), whole(k, m)}, {-1, 0});
  const nk::Estimate e = run(k, c);
  const double full = 512 / c.tensor_ghz;
  EXPECT_NEAR(at(e, 0, 0).end_ns, (512 + 128) / c.tensor_ghz / 0.5, 1e-9);  // first: half rate
  EXPECT_NEAR(at(e, 0, 199).end_ns - at(e, 0, 199).start_ns, full, 1e-9);  // after the ramp: full rate
  EXPECT_GT(e.throttled_flops, 0);
  EXPECT_LT(e.throttled_flops, e.model_flops);
}

TEST(EngineModel, MoreWorkNeverTakesLessTimeMoreBandwidthNeverMore) {
  auto kernel = [](int tiles) {
    nk::Kernel k{nk::target_for("trn2"), {}, {}};
    const int x = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kBFloat16, {128 * tiles, 512}, 0);
    const int y = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kBFloat16, {128 * tiles, 512}, 1);
    for (int i = 0; i < tiles; ++i) {
      const int t = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 512});
      const int u = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, {128, 512});
      instr(k, nk::Op::kDmaCopy, {whole(k, t), nk::Access{x, i * 128 * 512, {{512, 128}, {1, 512}}}});
      instr(k, nk::Op::kActivation, {whole(k, u), whole(k, t), {}, {}, {}}, {1, 0}, {1.0, 0.0});
      instr(k, nk::Op::kDmaCopy, {nk::Access{y, i * 128 * 512, {{512, 128}, {1, 512}}}, whole(k, u)});
    }
    return k;
  };
  const auto& c = chip("trn2");
  double prev = 0;
  for (int tiles = 1; tiles <= 8; ++tiles) {
    const nk::Kernel k = kernel(tiles);
    const double t = run(k, c).total_ns;
    EXPECT_GE(t, prev) << tiles;
    prev = t;
    rt::ChipFacts fast = c;  // twice the HBM and DMA bandwidth
    fast.hbm_tbps *= 2;
    fast.dma_engine_gbps *= 2;
    EXPECT_LE(run(k, fast).total_ns, t) << tiles;
    // Deterministic: the same kernel, the same schedule.
    const nk::Estimate a = run(k, c), b = run(k, c);
    ASSERT_EQ(a.instrs.size(), b.instrs.size());
    for (size_t i = 0; i < a.instrs.size(); ++i) {
      EXPECT_EQ(a.instrs[i].start_ns, b.instrs[i].start_ns);
      EXPECT_EQ(a.instrs[i].end_ns, b.instrs[i].end_ns);
    }
    EXPECT_EQ(a.hbm_read_bytes, int64_t{128} * tiles * 512 * 2);
    EXPECT_EQ(a.hbm_write_bytes, a.hbm_read_bytes);
  }
}

TEST(EngineModel, SmallDescriptorsAndTransposingDmasAreSlower) {
  const auto& c = chip("trn2");
  auto load = [&](nk::Access src, std::vector<int64_t> dst_shape) {
    nk::Kernel k{nk::target_for("trn2"), {}, {}};
    tensor(k, nk::Buffer::kSharedHbm, nk::DType::kBFloat16, {128, 128}, 0);
    const int t = tensor(k, nk::Buffer::kSbuf, nk::DType::kBFloat16, std::move(dst_shape));
    instr(k, nk::Op::kDmaCopy, {whole(k, t), src});
    return run(k, c).total_ns;
  };
  const double plain = load(nk::Access{0, 0, {{128, 128}, {1, 128}}}, {128, 128});
  const double transposed = load(nk::Access{0, 0, {{1, 128}, {128, 128}}}, {128, 128});
  // 128 rows of 256 B: each descriptor costs 512 B of time.
  EXPECT_NEAR(plain, 600 + 8 * 512 / queue_rate(c), 1e-9);
  // A transposing DMA on NeuronCore-v3 runs at 90%.
  EXPECT_NEAR(transposed, 600 + 8 * 512 / (queue_rate(c) * 0.9), 1e-9);
}

TEST(EngineModel, ChromeTraceNamesInstructionsAndSourceLines) {
  nk::Kernel k{nk::target_for("trn2"), {}, {}};
  const int x = tensor(k, nk::Buffer::kSharedHbm, nk::DType::kFloat32, {128, 512}, 0);
  const int t = tensor(k, nk::Buffer::kSbuf, nk::DType::kFloat32, {128, 512});
  instr(k, nk::Op::kDmaCopy, {whole(k, t), whole(k, x)}, {}, {}, 17);
  const nk::Estimate e = run(k, chip("trn2"));
  const std::string j = nk::chrome_trace(e, {&k});
  EXPECT_NE(j.find("\"source\":\"kernel.py:17\""), std::string::npos);
  EXPECT_NE(j.find("\"dma queue 15\""), std::string::npos);
  EXPECT_NE(j.find("\"name\":\"dma_copy\""), std::string::npos);
}
