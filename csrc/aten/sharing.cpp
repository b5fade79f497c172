// Sharing neuron tensors between processes (torch.multiprocessing queues, pipes).
//
// Device memory is host memory, so a neuron storage can be shared the way CPU storages
// are: its bytes move (once) into a shared-memory file that the storage keeps using, and
// the receiving process maps the same file as a neuron storage on the same device index.
// Writes on either side are seen by the other, as with CUDA IPC. Shared storages live
// outside the caching allocator's pools (like memory a CUDA process opened by IPC).
#include <ATen/MapAllocator.h>
#include <ATen/StorageUtils.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>

#include <cstring>
#include <unistd.h>

#include "aten/neuron.h"

namespace torch_neuronx {

std::pair<int, size_t> share_storage_fd(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kNeuron, "share_storage_fd: expected a neuron tensor, got ", t.device());
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (at::MapAllocator* m = at::MapAllocator::fromDataPtr(s->data_ptr())) return {m->fd(), s->nbytes()};
  size_t nbytes = s->nbytes();
  c10::intrusive_ptr<c10::StorageImpl> shm = at::new_shm_fd_storage(nbytes);
  if (nbytes > 0) std::memcpy(shm->mutable_data(), s->data(), nbytes);
  c10::DataPtr moved = shm->set_data_ptr(c10::DataPtr());
  moved.unsafe_set_device(s->device());
  // The old device block is released here; every view of the storage now reads the file.
  s->set_data_ptr_noswap(std::move(moved));
  at::MapAllocator* m = at::MapAllocator::fromDataPtr(s->data_ptr());
  TORCH_INTERNAL_ASSERT(m != nullptr);
  return {m->fd(), nbytes};
}

at::Tensor tensor_from_shared_fd(int fd, size_t nbytes, c10::DeviceIndex device, c10::ScalarType dtype,
                                 c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  check_device_index(device);
  lazy_init();
  int own = ::dup(fd);
  TORCH_CHECK(own != -1, "could not duplicate the file descriptor of a shared neuron tensor: ", std::strerror(errno));
  int flags = at::ALLOCATOR_MAPPED_SHAREDMEM | at::ALLOCATOR_MAPPED_NOCREATE | at::ALLOCATOR_MAPPED_KEEPFD |
              at::ALLOCATOR_MAPPED_FROMFD;
  c10::DataPtr data = at::MapAllocator::makeDataPtr(at::WITH_FD, "", own, flags, nbytes, nullptr);
  data.unsafe_set_device(c10::Device(kNeuron, device));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), neuron_allocator(),
                       /*resizable=*/false);
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(dtype).device(c10::Device(kNeuron, device)));
  out.set_(std::move(storage), offset, sizes, strides);
  return out;
}

}  // namespace torch_neuronx
