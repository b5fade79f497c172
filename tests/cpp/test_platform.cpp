// GoogleTest suite for the platform model (runtime/platform.h): every chip's facts are present
// and consistent, names resolve in one place, and the NKI verifier enforces the same limits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "nki/ir.h"
#include "runtime/errors.h"
#include "runtime/platform.h"

namespace rt = neuron::rt;
namespace nk = neuron::nki;

namespace {

constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30;

// Sets (or unsets, with nullptr) an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvVar() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool near(double a, double b, double rel) { return std::abs(a - b) <= rel * std::abs(b); }

// A kernel with one SBUF tile of `bytes_per_partition` fp32 bytes on each of 128 partitions.
nk::Kernel sbuf_tile_kernel(const std::string& target, int64_t bytes_per_partition) {
  nk::Kernel k{nk::target_for(target), {}, {}};
  k.tensors.push_back({nk::Buffer::kSbuf, nk::DType::kFloat32, {128, bytes_per_partition / 4}, "t", {"kernel.py", 7}, -1});
  return k;
}

}  // namespace

TEST(PlatformModel, EveryChipIsPresentAndConsistent) {
  ASSERT_EQ(rt::all_chips().size(), 4u);
  for (const rt::ChipFacts* c : rt::all_chips()) {
    SCOPED_TRACE(c->name);
    EXPECT_EQ(&rt::chip_facts(c->chip), c);
    EXPECT_EQ(rt::find_chip(c->name), c);
    EXPECT_EQ(std::string(c->core_name), "NeuronCore-v" + std::to_string(c->nc_version));
    EXPECT_EQ(c->torch_device, c->nc_version >= 3) << "the torch device simulates trn2 and trn3 only";
    EXPECT_GT(std::string(c->product).size(), 0u);
    EXPECT_GT(c->physical_cores, 0);
    EXPECT_EQ(c->partitions, 128);
    EXPECT_EQ(c->sbuf_bytes(), static_cast<uint64_t>(c->partitions) * c->sbuf_partition_bytes);
    EXPECT_EQ(c->psum_partition_bytes, static_cast<uint64_t>(c->psum_banks) * c->psum_bank_bytes);
    EXPECT_EQ(c->psum_bytes(), 2 * kMiB);
    EXPECT_EQ(c->psum_bank_bytes / 4, 512u) << "512 fp32 per PSUM bank (nl.tile_size.psum_fmax)";
    EXPECT_EQ(c->pe_rows, c->partitions);
    EXPECT_EQ(c->pe_cols, 128);
    EXPECT_GE(c->gemm_moving_fmax, 512);
    EXPECT_GE(c->gemm_moving_fmax_bf16, c->gemm_moving_fmax);
    for (double ghz : {c->tensor_ghz, c->vector_ghz, c->engine_ghz}) EXPECT_GT(ghz, 0.5);
    EXPECT_GT(c->vector_fp32_tflops, 0);
    // Chip totals are the cores' sum within the pages' rounding (trn2: 8 x 79 = 632 vs 667).
    EXPECT_TRUE(near(c->physical_cores * c->core_bf16_tflops, c->bf16_tflops, 0.1));
    EXPECT_TRUE(near(c->physical_cores * c->core_fp32_tflops, c->fp32_tflops, 0.15));
    EXPECT_TRUE(near(c->physical_cores * c->core_fp8_tflops, c->fp8_tflops, 0.1));
    EXPECT_GT(c->hbm_bytes, 0u);
    EXPECT_GT(c->hbm_tbps, 0);
    EXPECT_TRUE(near(c->physical_cores * c->dma_engines_per_core * c->dma_engine_gbps / 1000, c->dma_tbps, 0.15));
    EXPECT_EQ(std::string(c->link_name), "NeuronLink-v" + std::to_string(c->nc_version));
    EXPECT_GE(c->link_tbps, 0);
    EXPECT_EQ(c->supports_fp8, c->nc_version >= 4);
    EXPECT_EQ(c->supports_mx, c->nc_version >= 4);
  }
}

TEST(PlatformModel, DocumentedSizes) {
  // NeuronCore-v2 has 24 MiB of SBUF (128 x 192 KiB), v3 28 MiB (128 x 224 KiB), v4 32 MiB.
  for (rt::Chip c : {rt::Chip::kTrn1, rt::Chip::kInf2}) {
    EXPECT_EQ(rt::chip_facts(c).sbuf_bytes(), 24 * kMiB);
    EXPECT_EQ(rt::chip_facts(c).physical_cores, 2);
    EXPECT_EQ(rt::chip_facts(c).hbm_bytes, 32 * kGiB);
    EXPECT_EQ(rt::chip_facts(c).nc_version, 2);
  }
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn2).sbuf_bytes(), 28 * kMiB);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn2).sbuf_partition_bytes, 224 * kKiB);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn3).sbuf_bytes(), 32 * kMiB);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn2).hbm_bytes, 96 * kGiB);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn3).hbm_bytes, 144 * kGiB);
}

TEST(PlatformModel, InstanceFacts) {
  // What the step estimate maps ranks onto: trn1.32xlarge / trn2.48xlarge have 16 chips (trn2: a 4x4
  // 2-D torus, 3,200 Gbps EFA); inf2.48xlarge 12 chips and no EFA; the Trn3 UltraServer 64 chips.
  const rt::ChipFacts& t2 = rt::chip_facts(rt::Chip::kTrn2);
  EXPECT_EQ(std::string(t2.instance_name), "trn2.48xlarge");
  EXPECT_EQ(t2.chips_per_instance, 16);
  EXPECT_EQ(t2.link_dims, 2);
  EXPECT_EQ(t2.efa_gbps, 3200);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn1).chips_per_instance, 16);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn1).efa_gbps, 800);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kInf2).chips_per_instance, 12);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kInf2).efa_gbps, 0);
  EXPECT_EQ(rt::chip_facts(rt::Chip::kTrn3).chips_per_instance, 64);
  for (const rt::ChipFacts* c : rt::all_chips()) {
    EXPECT_GT(c->link_latency_us, 0) << c->name;
    EXPECT_EQ(c->efa_latency_us > 0, c->efa_gbps > 0) << c->name;
  }
}

TEST(PlatformModel, Trn2AndTrn3Facts) {
  const rt::ChipFacts& t2 = rt::chip_facts(rt::Chip::kTrn2);
  const rt::ChipFacts& t3 = rt::chip_facts(rt::Chip::kTrn3);
  EXPECT_EQ(t2.chip, rt::Chip::kTrn2);
  EXPECT_STREQ(t2.name, "trn2");
  EXPECT_STREQ(t2.core_name, "NeuronCore-v3");
  EXPECT_EQ(t2.physical_cores, 8);
  EXPECT_EQ(t2.hbm_bytes, 96 * kGiB);
  EXPECT_FALSE(t2.supports_fp8);
  EXPECT_EQ(t3.chip, rt::Chip::kTrn3);
  EXPECT_STREQ(t3.name, "trn3");
  EXPECT_STREQ(t3.core_name, "NeuronCore-v4");
  EXPECT_EQ(t3.physical_cores, 8);
  EXPECT_EQ(t3.hbm_bytes, 144 * kGiB);
  EXPECT_TRUE(t3.supports_fp8);
  EXPECT_TRUE(t3.supports_mx);
}

TEST(PlatformModel, FindChipNamesAndGenerations) {
  EXPECT_EQ(rt::find_chip(" TRN1 "), &rt::chip_facts(rt::Chip::kTrn1));
  EXPECT_EQ(rt::find_chip("inf2"), &rt::chip_facts(rt::Chip::kInf2));
  EXPECT_EQ(rt::find_chip("gen2"), &rt::chip_facts(rt::Chip::kTrn1));
  EXPECT_EQ(rt::find_chip("gen3"), &rt::chip_facts(rt::Chip::kTrn2));
  EXPECT_EQ(rt::find_chip("Gen4"), &rt::chip_facts(rt::Chip::kTrn3));
  EXPECT_EQ(rt::find_chip("trn9"), nullptr);
  EXPECT_EQ(rt::find_chip(""), nullptr);
}

TEST(PlatformModel, NkiTargetFromEnvironment) {
  {
    EnvVar o("NEURON_PLATFORM_TARGET_OVERRIDE", nullptr), p("NEURON_PLATFORM", nullptr);
    EXPECT_EQ(&rt::nki_target_from_env(), &rt::chip_facts(rt::Chip::kTrn2));
  }
  {
    EnvVar o("NEURON_PLATFORM_TARGET_OVERRIDE", ""), p("NEURON_PLATFORM", "trn3");
    EXPECT_EQ(&rt::nki_target_from_env(), &rt::chip_facts(rt::Chip::kTrn3));
  }
  {
    EnvVar o("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1"), p("NEURON_PLATFORM", "trn3");
    EXPECT_EQ(&rt::nki_target_from_env(), &rt::chip_facts(rt::Chip::kTrn1)) << "the override wins";
  }
  {
    EnvVar o("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9"), p("NEURON_PLATFORM", nullptr);
    try {
      rt::nki_target_from_env();
      ADD_FAILURE() << "trn9 was accepted";
    } catch (const rt::Error& e) {
      EXPECT_EQ(e.code(), rt::ErrorCode::kConfig);
      const std::string m = e.what();
      EXPECT_NE(m.find("NKI target 'trn9'"), std::string::npos) << m;
      EXPECT_NE(m.find("NEURON_PLATFORM_TARGET_OVERRIDE"), std::string::npos) << m;
      EXPECT_NE(m.find("trn1"), std::string::npos) << m;
    }
  }
}

TEST(PlatformModel, TorchDeviceRefusesNkiOnlyChips) {
  for (const char* name : {"trn1", "inf2", "gen2"}) {
    EnvVar p("NEURON_PLATFORM", name);
    rt::reset_platform_for_testing();
    const std::string err = rt::config_error();
    EXPECT_NE(err.find("NEURON_PLATFORM='" + std::string(name) + "' is not a known platform"), std::string::npos) << err;
    EXPECT_EQ(rt::device_count(), 0);
  }
  rt::reset_platform_for_testing();
}

TEST(PlatformModel, NkiTargetsCarryThePlatformLimits) {
  for (const rt::ChipFacts* c : rt::all_chips()) {
    SCOPED_TRACE(c->name);
    const nk::Target t = nk::target_for(c->name);
    EXPECT_EQ(t.name, c->name);
    EXPECT_EQ(t.nc_version, c->nc_version);
    EXPECT_EQ(t.partitions, c->partitions);
    EXPECT_EQ(t.sbuf_partition_bytes, static_cast<int64_t>(c->sbuf_partition_bytes));
    EXPECT_EQ(t.psum_partition_bytes, static_cast<int64_t>(c->psum_partition_bytes));
    EXPECT_EQ(t.psum_bank_bytes, static_cast<int64_t>(c->psum_bank_bytes));
    EXPECT_EQ(t.gemm_moving_fmax, c->gemm_moving_fmax);
    // The verifier's SBUF limit is the model's: a full partition fits, one more element does not.
    EXPECT_NO_THROW(nk::verify(sbuf_tile_kernel(c->name, t.sbuf_partition_bytes)));
    try {
      nk::verify(sbuf_tile_kernel(c->name, t.sbuf_partition_bytes + 4));
      ADD_FAILURE() << "an SBUF tile over " << t.sbuf_partition_bytes << " bytes per partition was accepted";
    } catch (const nk::VerifyError& e) {
      EXPECT_EQ(e.rule, "sbuf-capacity");
    }
  }
  EXPECT_THROW(nk::target_for("trn9"), std::invalid_argument);
}

TEST(PlatformModel, Trn1RefusesATileThatFitsTrn2) {
  const int64_t bytes = 200 * 1024;  // over NeuronCore-v2's 192 KiB, under v3's 224 KiB
  EXPECT_NO_THROW(nk::verify(sbuf_tile_kernel("trn2", bytes)));
  for (const char* v2 : {"trn1", "inf2"}) {
    try {
      nk::verify(sbuf_tile_kernel(v2, bytes));
      ADD_FAILURE() << v2 << " accepted a 200 KiB partition";
    } catch (const nk::VerifyError& e) {
      EXPECT_EQ(e.rule, "sbuf-capacity");
      EXPECT_NE(std::string(e.what()).find(std::string(v2) + " has 196608 bytes per partition"), std::string::npos)
          << e.what();
    }
  }
}
