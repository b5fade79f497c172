// The shared-memory algorithms of the `neuron` process group, among the ranks of one host, and
// the cross-rank check that every rank issued the same op.
#include "distributed/process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "distributed/reduce.h"
#include "distributed/tensors.h"
#include "runtime/memory.h"

namespace torch_neuronx::dist {

using neuron::dist::OpDesc;

// ---- cross-rank op checks ------------------------------------------------------------------

namespace {
// How waits and errors name an op: "all_reduce(float32[4], SUM) (call #7)".
std::string what_of(const OpDesc& d) { return std::string(d.text) + " (call #" + std::to_string(d.seq) + ")"; }
}  // namespace

void ProcessGroupNeuron::publish(OpDesc& d) {
  d.seq = ++op_seq_;
  shm_->slot(shm_->rank()).desc[d.seq & 1] = d;
}

void ProcessGroupNeuron::check_descs(const OpDesc& d) {
  for (int j = 0; j < shm_->size(); ++j) {
    if (j == shm_->rank()) continue;
    const OpDesc& o = shm_->slot(j).desc[d.seq & 1];
    bool same = o.seq == d.seq && o.op == d.op && o.dtype == d.dtype && (d.bytes < 0 || o.bytes == d.bytes) &&
                o.root == d.root && o.redop == d.redop;
    if (!same) {
      // Every rank compares with every other, so all of them raise, and the group stays usable.
      TORCH_CHECK_VALUE(false, "neuron process group ", group_name_, ": mismatched collectives: rank ",
                        local_ranks_[j], " called ", o.text, " (call #", o.seq, ") while rank ", rank_, " called ",
                        d.text, " (call #", d.seq, "); every rank of a group must issue the same collectives "
                        "with the same shapes, dtypes and roots, in the same order");
    }
  }
}

void ProcessGroupNeuron::sync(OpDesc& d, bool first, Deadline dl) {
  if (first) publish(d);
  shm_->barrier(dl, [&] { return what_of(d); });
  if (first) check_descs(d);
}

// ---- shared-memory algorithms ---------------------------------------------------------------

void ProcessGroupNeuron::shm_allreduce(const at::Tensor& src, const at::Tensor& dst, const Reduction& red, OpDesc& d,
                                       Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = src.scalar_type();
  const int64_t es = src.element_size(), numel = src.numel();
  char* s = static_cast<char*>(src.data_ptr());
  char* o = static_cast<char*>(dst.data_ptr());
  if (static_cast<size_t>(numel * es) <= small_bytes_) {
    // Direct: everyone posts its whole tensor and reduces all of them, in rank order.
    int h = next_half();
    std::memcpy(shm_->buffer(me, h), s, numel * es);
    sync(d, true, dl);
    std::vector<at::Tensor> ins;
    for (int j = 0; j < n; ++j) ins.push_back(view_of(shm_->buffer(j, h), numel, dt));
    reduce_into(view_of(o, numel, dt), ins, red);
    return;
  }
  bool published = false;
  if (static_cast<size_t>(numel * es) >= zero_copy_bytes_ && s == o) {
    if (zero_copy_allreduce(src, red, d, dl)) return;
    published = true;  // some rank's tensor is not shareable: all take the copying path
  }
  // Chunked reduce-scatter + all-gather through the buffers: rank j reduces slice j of each chunk.
  const int64_t chunk = static_cast<int64_t>(shm_->half_bytes()) / es;
  for (int64_t c0 = 0, it = 0; it == 0 || c0 < numel; c0 += chunk, ++it) {
    int64_t ce = std::min(chunk, numel - c0);
    auto lo = [&](int j) { return c0 + ce * j / n; };
    int h = next_half();
    for (int j = 0; j < n; ++j)
      if (j != me) std::memcpy(shm_->buffer(me, h) + (lo(j) - c0) * es, s + lo(j) * es, (lo(j + 1) - lo(j)) * es);
    sync(d, it == 0 && !published, dl);
    int64_t b = lo(me), m = lo(me + 1) - b;
    std::vector<at::Tensor> ins;
    for (int j = 0; j < n; ++j)
      ins.push_back(view_of(j == me ? s + b * es : shm_->buffer(j, h) + (b - c0) * es, m, dt));
    reduce_into(view_of(shm_->buffer(me, h) + (b - c0) * es, m, dt), ins, red);
    sync(d, false, dl);
    for (int j = 0; j < n; ++j)
      std::memcpy(o + lo(j) * es, shm_->buffer(j, h) + (lo(j) - c0) * es, (lo(j + 1) - lo(j)) * es);
  }
}

bool ProcessGroupNeuron::map_peers(const void* p, size_t bytes, bool eligible, OpDesc& d, Deadline dl,
                                   std::vector<char*>& ptrs) {
  // Device memory is host memory, and large allocations are shareable: each rank maps the
  // others' buffers and works on them directly, with no staging copies. Publishes and
  // checks the op (first barrier); all ranks return the same answer.
  const int n = shm_->size(), me = shm_->rank();
  neuron::rt::ShareableHandle h{};
  bool ok = eligible && neuron::rt::shareable_handle(p, bytes, &h);
  const int par = static_cast<int>((op_seq_ + 1) & 1);  // the seq publish() gives this op
  auto& mine = shm_->slot(me).peer_buffer[par];
  mine = neuron::dist::PeerBuffer{ok, 0, h.pid, h.fd, h.id, h.size, h.offset};
  sync(d, true, dl);
  for (int j = 0; j < n; ++j)
    if (!shm_->slot(j).peer_buffer[par].ok) return false;
  ptrs.assign(n, nullptr);
  peer_memory_.new_op();
  bool mapped = true;
  for (int j = 0; j < n && mapped; ++j) {
    const auto& q = shm_->slot(j).peer_buffer[par];
    char* base = j == me ? nullptr : peer_memory_.map(q.pid, q.fd, q.id, q.size);
    ptrs[j] = j == me ? static_cast<char*>(const_cast<void*>(p)) : (base ? base + q.offset : nullptr);
    mapped = ptrs[j] != nullptr;
  }
  mine.mapped = mapped;
  shm_->barrier(dl, [&] { return what_of(d); });
  for (int j = 0; j < n; ++j)
    if (!shm_->slot(j).peer_buffer[par].mapped) return false;
  return true;
}

void ProcessGroupNeuron::peers_done(OpDesc& d, Deadline dl) {
  // No rank may return (and change its buffer) while another still reads or writes it.
  shm_->barrier(dl, [&] { return what_of(d); });
}

bool ProcessGroupNeuron::zero_copy_allreduce(const at::Tensor& t, const Reduction& red, OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = t.scalar_type();
  const int64_t es = t.element_size(), numel = t.numel();
  std::vector<char*> ptrs;
  if (!map_peers(t.data_ptr(), t.nbytes(), true, d, dl, ptrs)) return false;
  // Rank r reduces slice r from every rank's tensor, in cache-sized pieces into a scratch,
  // and writes each piece into every rank's tensor.
  const int64_t b = numel * me / n, e = numel * (me + 1) / n;
  const int64_t piece = std::max<int64_t>(1, (int64_t(512) << 10) / es);
  at::Tensor scratch = at::empty({std::min(piece, std::max<int64_t>(e - b, 1))}, at::TensorOptions().dtype(dt));
  std::vector<at::Tensor> ins(n);
  for (int64_t off = b; off < e; off += piece) {
    int64_t k = std::min(piece, e - off);
    for (int j = 0; j < n; ++j) ins[j] = view_of(ptrs[j] + off * es, k, dt);
    at::Tensor out = scratch.narrow(0, 0, k);
    reduce_into(out, ins, red);
    for (int j = 0; j < n; ++j) std::memcpy(ptrs[j] + off * es, out.data_ptr(), k * es);
  }
  peers_done(d, dl);
  return true;
}

void ProcessGroupNeuron::shm_reduce(const at::Tensor& src, const at::Tensor& dst, int root, const Reduction& red,
                                    OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = src.scalar_type();
  const int64_t es = src.element_size(), numel = src.numel();
  const int64_t chunk = static_cast<int64_t>(shm_->half_bytes()) / es;
  char* s = static_cast<char*>(src.data_ptr());
  bool first = true;
  for (int64_t c0 = 0; first || c0 < numel; c0 += chunk) {
    int64_t ce = std::min(chunk, numel - c0);
    int h = next_half();
    if (me != root) std::memcpy(shm_->buffer(me, h), s + c0 * es, ce * es);
    sync(d, first, dl);
    if (me == root) {
      std::vector<at::Tensor> ins;
      for (int j = 0; j < n; ++j) ins.push_back(view_of(j == me ? s + c0 * es : shm_->buffer(j, h), ce, dt));
      reduce_into(view_of(static_cast<char*>(dst.data_ptr()) + c0 * es, ce, dt), ins, red);
    }
    first = false;
  }
}

void ProcessGroupNeuron::shm_broadcast(const at::Tensor& t, int root, OpDesc& d, Deadline dl) {
  const int me = shm_->rank();
  const int64_t bytes = t.nbytes(), chunk = shm_->half_bytes();
  char* p = static_cast<char*>(t.data_ptr());
  bool first = true;
  for (int64_t c0 = 0; first || c0 < bytes; c0 += chunk) {
    int64_t k = std::min(chunk, bytes - c0);
    int h = next_half();
    if (me == root) std::memcpy(shm_->buffer(me, h), p + c0, k);
    sync(d, first, dl);
    if (me != root) std::memcpy(p + c0, shm_->buffer(root, h), k);
    first = false;
  }
}

void ProcessGroupNeuron::shm_gather(const at::Tensor& src, const std::vector<at::Tensor>& outs, int root, OpDesc& d,
                                    Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const int64_t bytes = src.nbytes(), chunk = shm_->half_bytes();
  char* s = static_cast<char*>(src.data_ptr());
  bool receive = root < 0 || root == me;
  bool published = false;
  if (static_cast<size_t>(bytes) >= zero_copy_bytes_) {
    std::vector<char*> ptrs;
    if (map_peers(s, bytes, true, d, dl, ptrs)) {
      if (receive)
        for (int j = 0; j < n; ++j) std::memcpy(outs[j].data_ptr(), ptrs[j], bytes);
      peers_done(d, dl);
      return;
    }
    published = true;
  }
  bool first = true;
  for (int64_t c0 = 0; first || c0 < bytes; c0 += chunk) {
    int64_t k = std::min(chunk, bytes - c0);
    int h = next_half();
    std::memcpy(shm_->buffer(me, h), s + c0, k);
    sync(d, first && !published, dl);
    if (receive)
      for (int j = 0; j < n; ++j)
        std::memcpy(static_cast<char*>(outs[j].data_ptr()) + c0, j == me ? s + c0 : shm_->buffer(j, h), k);
    first = false;
  }
}

void ProcessGroupNeuron::shm_scatter(const std::vector<at::Tensor>& ins, const at::Tensor& dst, int root, OpDesc& d,
                                     Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const int64_t bytes = dst.nbytes();
  const int64_t chunk = static_cast<int64_t>(shm_->half_bytes()) / n / 64 * 64;
  char* o = static_cast<char*>(dst.data_ptr());
  bool first = true;
  for (int64_t c0 = 0; first || c0 < bytes; c0 += chunk) {
    int64_t k = std::min(chunk, bytes - c0);
    int h = next_half();
    if (me == root)
      for (int j = 0; j < n; ++j)
        std::memcpy(shm_->buffer(me, h) + j * chunk, static_cast<char*>(ins[j].data_ptr()) + c0, k);
    sync(d, first, dl);
    std::memcpy(o + c0, shm_->buffer(root, h) + me * chunk, k);
    first = false;
  }
}

void ProcessGroupNeuron::shm_reduce_scatter(const std::vector<at::Tensor>& ins, const at::Tensor& dst,
                                            const Reduction& red, OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = dst.scalar_type();
  const int64_t es = dst.element_size(), numel = dst.numel();
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(shm_->half_bytes()) / n / es);
  char* o = static_cast<char*>(dst.data_ptr());
  bool published = false;
  if (static_cast<size_t>(numel * es * n) >= zero_copy_bytes_) {
    // The inputs as one buffer, when they are consecutive parts of one tensor (as in
    // reduce_scatter_tensor): then each rank reduces its part straight from the peers'.
    char* base = static_cast<char*>(ins[0].data_ptr());
    bool one_buffer = true;
    for (int j = 0; j < n; ++j) one_buffer &= static_cast<char*>(ins[j].data_ptr()) == base + j * numel * es;
    std::vector<char*> ptrs;
    if (map_peers(base, numel * es * n, one_buffer, d, dl, ptrs)) {
      std::vector<at::Tensor> v;
      for (int j = 0; j < n; ++j) v.push_back(view_of(ptrs[j] + me * numel * es, numel, dt));
      reduce_into(view_of(o, numel, dt), v, red);
      peers_done(d, dl);
      return;
    }
    published = true;
  }
  bool first = true;
  for (int64_t c0 = 0; first || c0 < numel; c0 += chunk) {
    int64_t ce = std::min(chunk, numel - c0);
    int h = next_half();
    for (int j = 0; j < n; ++j)
      if (j != me)
        std::memcpy(shm_->buffer(me, h) + j * chunk * es, static_cast<char*>(ins[j].data_ptr()) + c0 * es, ce * es);
    sync(d, first && !published, dl);
    std::vector<at::Tensor> v;
    for (int j = 0; j < n; ++j)
      v.push_back(view_of(j == me ? static_cast<char*>(ins[me].data_ptr()) + c0 * es
                                  : shm_->buffer(j, h) + me * chunk * es,
                          ce, dt));
    reduce_into(view_of(o + c0 * es, ce, dt), v, red);
    first = false;
  }
}

void ProcessGroupNeuron::shm_alltoall(const std::vector<at::Tensor>& sends, const std::vector<at::Tensor>& recvs,
                                      OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const int64_t per = static_cast<int64_t>(shm_->half_bytes()) / n / 64 * 64;
  // Publish how much goes to and comes from each peer, so every rank validates the whole
  // matrix and all of them agree on the number of rounds.
  d.seq = op_seq_ + 1;
  auto& mine = shm_->slot(me);
  for (int j = 0; j < n; ++j) mine.a2a_send[d.seq & 1][j] = static_cast<int64_t>(sends[j].nbytes());
  for (int j = 0; j < n; ++j) mine.a2a_recv[d.seq & 1][j] = static_cast<int64_t>(recvs[j].nbytes());
  // Zero-copy when every rank's sends are consecutive parts of one shareable buffer (as
  // all_to_all_single's are): each rank copies its parts straight out of the peers' inputs.
  char* base = static_cast<char*>(sends[0].data_ptr());
  size_t total = 0;
  bool one_buffer = true;
  for (int j = 0; j < n; ++j) {
    one_buffer &= static_cast<char*>(sends[j].data_ptr()) == base + total;
    total += sends[j].nbytes();
  }
  int64_t rounds = 1;
  for (int64_t round = 0; round < rounds; ++round) {
    int h = next_half();
    for (int j = 0; j < n; ++j) {
      int64_t len = sends[j].nbytes(), off = round * per;
      if (off < len) std::memcpy(shm_->buffer(me, h) + j * per, static_cast<char*>(sends[j].data_ptr()) + off,
                                 std::min(per, len - off));
    }
    // Round 0's data is posted before the first barrier either way, so trying zero-copy
    // costs no barrier when it does not apply (the staged rounds then go on from here).
    std::vector<char*> ptrs;
    bool zero_copy = false;
    if (round == 0) zero_copy = map_peers(base, total, one_buffer && total > 0, d, dl, ptrs);
    else sync(d, false, dl);
    if (round == 0) {
      int64_t longest = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          int64_t sent = shm_->slot(i).a2a_send[d.seq & 1][j], expect = shm_->slot(j).a2a_recv[d.seq & 1][i];
          TORCH_CHECK_VALUE(sent == expect, "neuron process group ", group_name_, ": all_to_all split mismatch: rank ",
                            local_ranks_[i], " sends ", sent, " bytes to rank ", local_ranks_[j], ", which expects ",
                            expect, " bytes; input_split_sizes on the sender must equal output_split_sizes on the "
                            "receiver");
          longest = std::max(longest, sent);
        }
      rounds = std::max<int64_t>(1, (longest + per - 1) / per);
    }
    if (zero_copy) {
      for (int j = 0; j < n; ++j) {
        int64_t at = 0;  // where rank j's part for this rank starts in its input
        for (int k = 0; k < me; ++k) at += shm_->slot(j).a2a_send[d.seq & 1][k];
        std::memcpy(recvs[j].data_ptr(), ptrs[j] + at, recvs[j].nbytes());
      }
      peers_done(d, dl);
      return;
    }
    for (int j = 0; j < n; ++j) {
      int64_t len = recvs[j].nbytes(), off = round * per;
      if (off < len)
        std::memcpy(static_cast<char*>(recvs[j].data_ptr()) + off,
                    j == me ? static_cast<char*>(sends[me].data_ptr()) + off : shm_->buffer(j, h) + me * per,
                    std::min(per, len - off));
    }
  }
}

}  // namespace torch_neuronx::dist
