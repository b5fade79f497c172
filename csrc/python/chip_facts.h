// The platform model's facts of one chip as a Python dict: what torch.neuron.get_platform()
// reports and what nki.language.tile_size reads, from the one owner (runtime/platform.h).
#pragma once

#include <pybind11/pybind11.h>

#include "runtime/platform.h"

namespace torch_neuronx {

inline pybind11::dict chip_facts_dict(const neuron::rt::ChipFacts& c) {
  pybind11::dict d;
  d["platform"] = c.name;
  d["product"] = c.product;
  d["core"] = c.core_name;
  d["nc_version"] = c.nc_version;
  d["torch_device"] = c.torch_device;
  d["physical_cores_per_chip"] = c.physical_cores;
  d["partitions"] = c.partitions;
  d["sbuf_partition_bytes"] = c.sbuf_partition_bytes;
  d["sbuf_bytes_per_core"] = c.sbuf_bytes();
  d["psum_partition_bytes"] = c.psum_partition_bytes;
  d["psum_banks"] = c.psum_banks;
  d["psum_bank_bytes"] = c.psum_bank_bytes;
  d["psum_bytes_per_core"] = c.psum_bytes();
  d["pe_rows"] = c.pe_rows;
  d["pe_cols"] = c.pe_cols;
  d["gemm_moving_fmax"] = c.gemm_moving_fmax;
  d["gemm_moving_fmax_bf16"] = c.gemm_moving_fmax_bf16;
  d["tensor_ghz"] = c.tensor_ghz;
  d["vector_ghz"] = c.vector_ghz;
  d["engine_ghz"] = c.engine_ghz;
  d["vector_fp32_tflops_per_core"] = c.vector_fp32_tflops;
  d["bf16_tflops_per_core"] = c.core_bf16_tflops;
  d["fp32_tflops_per_core"] = c.core_fp32_tflops;
  d["fp8_tflops_per_core"] = c.core_fp8_tflops;
  d["bf16_tflops"] = c.bf16_tflops;
  d["fp32_tflops"] = c.fp32_tflops;
  d["fp8_tflops"] = c.fp8_tflops;
  d["hbm_per_chip"] = c.hbm_bytes;
  d["hbm_tbps"] = c.hbm_tbps;
  d["dma_engines_per_core"] = c.dma_engines_per_core;
  d["dma_engine_gbps"] = c.dma_engine_gbps;
  d["dma_tbps"] = c.dma_tbps;
  d["link"] = c.link_name;
  d["link_tbps"] = c.link_tbps;
  d["supports_fp8"] = c.supports_fp8;
  d["supports_mx"] = c.supports_mx;
  d["instance"] = c.instance_name;
  d["chips_per_instance"] = c.chips_per_instance;
  d["link_topology"] = c.link_topology;
  d["link_dims"] = c.link_dims;
  d["efa_gbps"] = c.efa_gbps;
  d["link_latency_us"] = c.link_latency_us;
  d["efa_latency_us"] = c.efa_latency_us;
  return d;
}

}  // namespace torch_neuronx
