// nl.device_print: the instruction hands its tensor's values to the host's sink (or stdout).
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>

#include "nki/executor.h"

namespace neuron::nki {
namespace {

PrintSink& print_hook() {
  static PrintSink hook;
  return hook;
}

}  // namespace

void set_print_sink(PrintSink f) { print_hook() = std::move(f); }

// Hands a device_print's values to the host's sink, or writes them to stdout.
void emit_print(const PrintedTensor& t) {
  if (const PrintSink& sink = print_hook()) return sink(t);
  std::cout << format_printed(t) << std::endl;  // endl flushes: in order with the host's own output
}

std::string format_printed(const PrintedTensor& t) {
  const size_t nd = t.shape.size();
  std::vector<int64_t> stride(nd + 1, 1);  // elements per index of each dimension
  for (size_t d = nd; d-- > 0;) stride[d] = stride[d + 1] * t.shape[d];
  const bool summarize = stride[0] > 1000;
  std::string out = t.label + " ";
  auto value = [&](int64_t i) {
    if (t.dtype == DType::kBool) return std::string(t.ints[i] ? "True" : "False");
    char b[40];
    if (is_float(t.dtype)) {
      std::snprintf(b, sizeof b, "%.9g", static_cast<double>(t.floats[i]));  // 9 digits tell any two fp32 apart
    } else {
      std::snprintf(b, sizeof b, "%lld", static_cast<long long>(t.ints[i]));
    }
    return std::string(b);
  };
  auto rows = [&](auto&& self, size_t d, int64_t at) -> void {
    if (d == nd) {
      out += value(at);
      return;
    }
    std::string sep(d + 1 == nd ? 1 : d + 2, ' ');  // " " between values, newline + indent between rows
    if (d + 1 < nd) sep[0] = '\n';
    out += '[';
    for (int64_t i = 0; i < t.shape[d]; ++i) {
      if (i > 0) out += sep;
      if (summarize && t.shape[d] > 6 && i == 3) {
        out += "...";
        out += sep;
        i = t.shape[d] - 3;
      }
      self(self, d + 1, at + i * stride[d + 1]);
    }
    out += ']';
  };
  rows(rows, 0, 0);
  return out;
}

void Program::State::exec_sync(const Instr& in) {
  const auto& a = in.args;
  switch (in.op) {
    case Op::kDevicePrint: {  // reads only: the program's results are the same with or without it
      PrintedTensor t{in.text, dt(a[0]), {}, {}, {}};
      for (const Dim& d : a[0].dims) t.shape.push_back(d.size);
      if (is_float(t.dtype)) {
        const float* v = gather(a[0], 0);
        t.floats.assign(v, v + a[0].elements());
      } else {
        gather_int(a[0], t.ints);
      }
      emit_print(t);
      return;
    }
    default:
      break;
  }
  throw std::logic_error(std::string("nki executor: ") + op_name(in.op) + " is not run by the executor");
}

}  // namespace neuron::nki
