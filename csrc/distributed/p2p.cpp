// Point-to-point of the `neuron` process group: sends and receives progress on a per-group
// thread over the shared-memory rings (gloo between hosts); a send to this rank meets its
// receive directly.
#include "distributed/process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "distributed/tensors.h"
#include "distributed/work.h"

namespace torch_neuronx::dist {

using neuron::dist::Clock;
using neuron::dist::CommError;

// ---- point-to-point op ------------------------------------------------------------------

struct MsgHeader {
  uint64_t bytes;
  int64_t tag;
};

struct P2POp {
  bool is_send;
  int peer;  // local index; -1 = any source (until matched)
  Flat data;
  size_t total;  // header + payload bytes
  size_t pos = 0;
  MsgHeader hdr{};  // what this op sends, or expects
  MsgHeader got{};  // header received
  Clock::time_point deadline;
  std::vector<c10::intrusive_ptr<NeuronWork>> works;
  std::string what;
};

// ---- lifetime of the p2p thread ------------------------------------------------------------

void ProcessGroupNeuron::shutdown() {
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    p2p_stop_ = true;
  }
  if (p2p_thread_.joinable()) {
    if (shm_) shm_->ring_doorbell(shm_->rank());
    p2p_thread_.join();
  }
  fail_all_p2p("the process group was destroyed");
}

// ---- point-to-point -----------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return submit_p2p(true, tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return submit_p2p(false, tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return submit_p2p(false, tensors, -1, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::submit_p2p(bool is_send, std::vector<at::Tensor>& tensors, int peer,
                                                              int tag) {
  const char* name = is_send ? "send" : "recv";
  check_single(tensors, name);
  TORCH_CHECK_VALUE(peer == -1 || (peer >= 0 && peer < size_), name, ": peer rank ", peer,
                    " is outside the group of size ", size_);
  at::Tensor t = tensors[0];
  std::string what = c10::str(name, is_send ? " to rank " : " from rank ", peer < 0 ? std::string("any") : std::to_string(peer),
                              " (", shape_str(t), ")");
  if (peer == rank_) return self_p2p(is_send, t, what);
  if (peer >= 0 && host_of_[peer] != my_host_) {
    need_gloo(name);
    count(name, "gloo");
    Flat f = Flat::of(t, is_send);
    TORCH_CHECK_VALUE(is_send || !f.copied, "recv: a tensor received from another host must be contiguous");
    std::vector<at::Tensor> v{f.flat};
    return is_send ? gloo_->send(v, peer, tag) : gloo_->recv(v, peer, tag);
  }
  TORCH_CHECK_VALUE(peer >= 0 || local_only(), "recv from any source: supported within one host only "
                    "(this group spans ", hosts_.size(), " hosts)");
  if (size_ == 1 || !shm_) TORCH_CHECK_VALUE(false, name, ": a group of one rank has no peer");
  auto op = std::make_shared<P2POp>();
  op->is_send = is_send;
  op->peer = peer < 0 ? -1 : local_index_[peer];
  op->data = Flat::of(t, is_send);
  op->hdr = MsgHeader{static_cast<uint64_t>(op->data.bytes()), tag};
  op->total = sizeof(MsgHeader) + op->data.bytes();
  op->deadline = deadline(c10d::kUnsetTimeout);
  op->what = what;
  auto work = c10::make_intrusive<NeuronWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                              std::vector<at::Tensor>{t}, 1, what,
                                              is_send ? "send" : (peer < 0 ? "recvAnySource" : "recv"),
                                              std::vector<at::Tensor>{t});
  op->works.push_back(work);
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    if (!p2p_broken_.empty())
      C10_THROW_ERROR(DistBackendError, c10::str("neuron process group ", group_name_, ": ", what, ": ", p2p_broken_));
    if (coalesced_) {
      coalesced_->add_pending();
      op->works.push_back(coalesced_);
    }
    if (is_send) sends_[op->peer].push_back(op);
    else if (op->peer >= 0) recvs_[op->peer].push_back(op);
    else any_recvs_.push_back(op);
    if (!p2p_thread_.joinable()) p2p_thread_ = std::thread([this] { p2p_loop(); });
  }
  count(name, "shm");
  shm_->ring_doorbell(shm_->rank());
  return work;
}

// A send to this rank and a receive from it meet here, first with first, as NCCL lets them
// (e.g. in batch_isend_irecv). The send's data is taken when it is issued.
struct SelfMsg {
  at::Tensor data;  // send: a snapshot; recv: the user's tensor
  std::string what;
  std::vector<c10::intrusive_ptr<NeuronWork>> works;
};

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::self_p2p(bool is_send, const at::Tensor& t, const std::string& what) {
  auto msg = std::make_shared<SelfMsg>();
  msg->data = is_send ? t.clone(at::MemoryFormat::Contiguous) : t;
  msg->what = what;
  auto work = c10::make_intrusive<NeuronWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                              std::vector<at::Tensor>{t}, 1, what, is_send ? "send" : "recv",
                                              std::vector<at::Tensor>{t});
  msg->works.push_back(work);
  std::vector<std::pair<std::shared_ptr<SelfMsg>, std::shared_ptr<SelfMsg>>> matched;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    if (!p2p_broken_.empty())
      C10_THROW_ERROR(DistBackendError, c10::str("neuron process group ", group_name_, ": ", what, ": ", p2p_broken_));
    if (coalesced_) {
      coalesced_->add_pending();
      msg->works.push_back(coalesced_);
    }
    (is_send ? self_sends_ : self_recvs_).push_back(msg);
    while (!self_sends_.empty() && !self_recvs_.empty()) {
      matched.emplace_back(self_sends_.front(), self_recvs_.front());
      self_sends_.pop_front();
      self_recvs_.pop_front();
    }
  }
  count(is_send ? "send" : "recv", "self");
  for (auto& [snd, rcv] : matched) {
    std::exception_ptr e;
    if (snd->data.nbytes() != rcv->data.nbytes()) {
      e = std::make_exception_ptr(c10::DistBackendError(
          c10::str("neuron process group ", group_name_, " (rank ", rank_, "): ", rcv->what, ": the matching ",
                   snd->what, " has ", snd->data.nbytes(), " bytes but this recv expects ", rcv->data.nbytes(),
                   " bytes; send and recv tensors must have the same size"),
          nullptr));
    } else {
      Flat src = Flat::of(snd->data, true), dst = Flat::of(rcv->data, false);
      std::memcpy(dst.ptr(), src.ptr(), src.bytes());
      dst.writeback();
    }
    // As between ranks: the send has done its part; the receive reports the mismatch.
    for (auto& w : snd->works) w->part_done(nullptr);
    for (auto& w : rcv->works) w->part_done(e);
  }
  return work;
}

bool ProcessGroupNeuron::advance(P2POp& op) {
  bool moved = false;
  while (op.pos < op.total) {
    size_t k;
    const size_t H = sizeof(MsgHeader);
    if (op.is_send) {
      k = op.pos < H ? shm_->ring_write(op.peer, reinterpret_cast<const char*>(&op.hdr) + op.pos, H - op.pos)
                     : shm_->ring_write(op.peer, op.data.ptr() + (op.pos - H), op.total - op.pos);
    } else if (op.pos < H) {
      // The header may arrive in pieces.
      k = shm_->ring_read(op.peer, reinterpret_cast<char*>(&op.got) + op.pos, H - op.pos);
      if (k && op.pos + k == H && op.got.bytes != op.hdr.bytes) {
        throw CommError(c10::str(op.what, ": rank ", local_ranks_[op.peer], " sent ", op.got.bytes,
                                 " bytes but this recv expects ", op.hdr.bytes,
                                 " bytes; send and recv tensors must have the same size"));
      }
    } else {
      k = shm_->ring_read(op.peer, op.data.ptr() + (op.pos - H), op.total - op.pos);
    }
    if (k == 0) break;
    op.pos += k;
    moved = true;
  }
  return moved;
}

void ProcessGroupNeuron::fail_all_p2p(const std::string& msg) {
  std::vector<std::shared_ptr<P2POp>> all;
  std::vector<std::shared_ptr<SelfMsg>> selfs;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    if (p2p_broken_.empty()) p2p_broken_ = msg;
    for (auto* qs : {&sends_, &recvs_})
      for (auto& q : *qs) {
        all.insert(all.end(), q.begin(), q.end());
        q.clear();
      }
    all.insert(all.end(), any_recvs_.begin(), any_recvs_.end());
    any_recvs_.clear();
    for (auto* q : {&self_sends_, &self_recvs_}) {
      selfs.insert(selfs.end(), q->begin(), q->end());
      q->clear();
    }
  }
  for (auto& m : selfs) {
    auto e = std::make_exception_ptr(c10::DistBackendError(
        c10::str("neuron process group ", group_name_, " (rank ", rank_, "): ", m->what, ": ", msg), nullptr));
    for (auto& w : m->works) w->part_done(e);
  }
  for (auto& op : all) {
    auto e = std::make_exception_ptr(c10::DistBackendError(
        c10::str("neuron process group ", group_name_, " (rank ", rank_, "): ", op->what, ": ", msg), nullptr));
    for (auto& w : op->works) w->part_done(e);
  }
}

void ProcessGroupNeuron::p2p_loop() {
  auto next_check = Clock::now();
  while (true) {
    uint32_t bell = shm_->doorbell();
    std::vector<std::shared_ptr<P2POp>> done;
    bool moved = false;
    std::string failure;
    {
      std::lock_guard<std::mutex> g(p2p_mu_);
      if (p2p_stop_) return;
      try {
        shm_->check_abort();
        // Match receives from any source with the first peer that has data in flight.
        for (auto it = any_recvs_.begin(); it != any_recvs_.end();) {
          int found = -1;
          for (int j = 0; j < shm_->size() && found < 0; ++j)
            if (j != shm_->rank() && recvs_[j].empty() && shm_->ring_readable(j) > 0) found = j;
          if (found < 0) break;
          (*it)->peer = found;
          (*it)->works.front()->set_source(local_ranks_[found]);
          recvs_[found].push_back(*it);
          it = any_recvs_.erase(it);
        }
        for (auto* qs : {&sends_, &recvs_})
          for (auto& q : *qs)
            while (!q.empty()) {
              moved |= advance(*q.front());
              if (q.front()->pos < q.front()->total) break;
              done.push_back(q.front());
              q.pop_front();
            }
        auto now = Clock::now();
        if (now >= next_check) {
          next_check = now + std::chrono::milliseconds(50);
          bool pending = !any_recvs_.empty();
          for (auto* qs : {&sends_, &recvs_})
            for (auto& q : *qs)
              if (!q.empty()) {
                pending = true;
                if (now >= q.front()->deadline)
                  throw CommError("caught collective operation timeout: " + q.front()->what +
                                  " timed out: the process group's timeout elapsed");
              }
          if (pending) shm_->check_peers([] { return std::string("point-to-point"); });
        }
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    for (auto& op : done) {
      op->data.writeback();
      for (auto& w : op->works) w->part_done(nullptr);
    }
    if (!failure.empty()) {
      // A failed transfer leaves the byte streams out of step: no further p2p on this group.
      fail_all_p2p(failure);
      continue;
    }
    if (!moved && done.empty()) shm_->wait_doorbell(bell, std::chrono::milliseconds(20));
  }
}

}  // namespace torch_neuronx::dist
