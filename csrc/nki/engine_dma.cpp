// The DMA engines: copies (converting dtypes), transposes and dma_compute's sums.
#include <cstring>
#include <stdexcept>
#include <string>

#include "nki/executor.h"

namespace neuron::nki {

void Program::State::exec_dma(const Instr& in) {
  const auto& a = in.args;
  switch (in.op) {
    case Op::kDmaCopy:
      copy(a[0], a[1]);
      return;
    case Op::kDmaTranspose: {
      const Access &dst = a[0], &src = a[1];
      const size_t nd = src.dims.size(), es = dtype_size(dt(src));
      std::vector<int64_t> perm = nd == 2 ? std::vector<int64_t>{1, 0} : nd == 3 ? std::vector<int64_t>{2, 1, 0}
                                                                                 : std::vector<int64_t>{3, 1, 2, 0};
      gather_raw(src, raw_[1]);
      std::vector<int64_t> sstride(nd, 1);
      for (int64_t i = static_cast<int64_t>(nd) - 2; i >= 0; --i) sstride[i] = sstride[i + 1] * src.dims[i + 1].size;
      raw_[0].resize(raw_[1].size());
      std::vector<int64_t> j(nd, 0);
      for (int64_t k = 0, n = dst.elements(); k < n; ++k) {
        int64_t from = 0;
        for (size_t i = 0; i < nd; ++i) from += j[i] * sstride[perm[i]];
        std::memcpy(raw_[0].data() + k * es, raw_[1].data() + from * es, es);
        for (int64_t i = static_cast<int64_t>(nd) - 1; i >= 0; --i) {
          if (++j[i] < dst.dims[i].size) break;
          j[i] = 0;
        }
      }
      scatter_raw(dst, raw_[0]);
      return;
    }
    case Op::kDmaCompute: {  // dst = sum of scale * src, in fp32
      std::vector<float>& acc = buf[4];
      const std::vector<double> scales = float_tail(in, "scales");
      acc.assign(a[0].elements(), 0.0f);
      for (size_t i = 1; i < a.size(); ++i) {
        const float* v = gather(a[i], 0);
        const float scale = static_cast<float>(scales.at(i - 1));
        for (size_t e = 0; e < acc.size(); ++e) acc[e] += v[e] * scale;
      }
      scatter(a[0], acc.data());
      return;
    }
    default:
      break;
  }
  throw std::logic_error(std::string("nki executor: ") + op_name(in.op) + " is not a DMA instruction");
}

}  // namespace neuron::nki
