// The launch scheduler: the programs of one SPMD launch (the cores of a logical NeuronCore)
// run in turns, each until its next sendrecv or core_barrier, which completes once its
// partner(s) reach theirs; programs that wait for each other forever raise.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "nki/executor.h"

namespace neuron::nki {

void Program::run(const std::vector<void*>& external) { run_launch({this}, {external}); }

void run_launch(const std::vector<Program*>& programs, const std::vector<std::vector<void*>>& external) {
  const int n = static_cast<int>(programs.size());
  if (external.size() != programs.size()) throw std::invalid_argument("nki: one memory list per program");
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<std::unique_ptr<Program::State>> st;
  for (int r = 0; r < n; ++r) {
    locks.emplace_back(programs[r]->mu_);
    programs[r]->check_external(external[r]);
    st.emplace_back(new Program::State{*programs[r], external[r]});
  }
  enum Status { kRunning, kWaiting, kDone };
  std::vector<Status> status(n, kRunning);
  std::vector<size_t> pc(n, 0);
  std::vector<bool> sent(n, false);
  std::map<std::tuple<int, int, int64_t>, std::deque<std::vector<uint8_t>>> mail;  // (from, to, pipe_id)
  auto at = [&](int r) -> const Instr& { return programs[r]->k_.instrs[pc[r]]; };
  auto where = [&](int r) { return at(r).loc.file + ":" + std::to_string(at(r).loc.line); };
  auto rank_ok = [&](int r, int64_t rank, const char* what) {
    if (rank < 0 || rank >= n) {
      throw std::out_of_range(where(r) + ": " + op_name(at(r).op) + ": " + what + " " + std::to_string(rank) +
                              " is not a program of this launch (" + std::to_string(n) + " programs; launch the "
                              "kernel as kernel[2] for the two cores of a logical NeuronCore)");
    }
  };
  for (;;) {
    bool progress = false, all_done = true;
    for (int r = 0; r < n; ++r) {
      if (status[r] == kDone) continue;
      all_done = false;
      Program& p = *programs[r];
      if (status[r] == kRunning) {  // to the end or the next instruction that waits for other programs
        for (; pc[r] < p.k_.instrs.size(); ++pc[r]) {
          p.prepare(pc[r]);
          if (synchronizes(p.k_.instrs[pc[r]].op)) break;
          if (p.k_.instrs[pc[r]].op == Op::kMatmul) {
            pc[r] += st[r]->run_matmuls(pc[r]) - 1;  // with the matmuls that continue its K sum
          } else {
            st[r]->run(p.k_.instrs[pc[r]]);
          }
        }
        progress = true;
        if (pc[r] == p.k_.instrs.size()) {
          status[r] = kDone;
          continue;
        }
        status[r] = kWaiting;
      }
      const Instr& in = at(r);
      if (in.op != Op::kSendRecv) continue;
      const int to = static_cast<int>(int_attr(in, "send_to_rank")), from = static_cast<int>(int_attr(in, "recv_from_rank"));
      const int64_t pipe = int_attr(in, "pipe_id");
      rank_ok(r, to, "send_to_rank");
      rank_ok(r, from, "recv_from_rank");
      if (!sent[r]) {
        std::vector<uint8_t> bytes;
        st[r]->gather_raw(in.args[1], bytes);
        mail[{r, to, pipe}].push_back(std::move(bytes));
        sent[r] = true;
        progress = true;
      }
      auto box = mail.find({from, r, pipe});
      if (box == mail.end() || box->second.empty()) continue;
      const size_t want = in.args[0].elements() * dtype_size(st[r]->dt(in.args[0]));
      if (box->second.front().size() != want) {
        throw std::invalid_argument(where(r) + ": sendrecv: program " + std::to_string(from) + " sent " +
                                    std::to_string(box->second.front().size()) + " bytes; this dst holds " +
                                    std::to_string(want));
      }
      st[r]->scatter_raw(in.args[0], box->second.front());
      ++st[r]->version_[in.args[0].tensor];
      box->second.pop_front();
      sent[r] = false;
      status[r] = kRunning;
      ++pc[r];
      progress = true;
    }
    // A barrier opens when every core it names waits at a barrier.
    for (int r = 0; r < n; ++r) {
      if (status[r] != kWaiting || at(r).op != Op::kCoreBarrier) continue;
      std::vector<int64_t> cores = int_tail(at(r), "cores");  // and the program itself
      if (std::find(cores.begin(), cores.end(), r) == cores.end()) cores.push_back(r);
      bool open = true;
      for (int64_t c : cores) {
        rank_ok(r, c, "core");
        open = open && status[c] == kWaiting && at(static_cast<int>(c)).op == Op::kCoreBarrier;
      }
      if (!open) continue;
      for (int64_t c : cores) status[c] = kRunning, ++pc[c];
      progress = true;
    }
    if (all_done) return;
    if (!progress) {
      std::string msg = "nki: the programs of this launch wait for each other forever:";
      for (int r = 0; r < n; ++r) {
        msg += "\n  program " + std::to_string(r) + ": ";
        if (status[r] == kDone) {
          msg += "has ended";
        } else if (at(r).op == Op::kSendRecv) {
          msg += "waits in sendrecv for program " + std::to_string(int_attr(at(r), "recv_from_rank")) + " (pipe_id " +
                 std::to_string(int_attr(at(r), "pipe_id")) + ") at " + where(r);
        } else {
          msg += "waits in core_barrier at " + where(r);
        }
      }
      throw std::runtime_error(msg);
    }
  }
}

}  // namespace neuron::nki
