// Device guard, PrivateUse1 hooks and generators of the `neuron` device.
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/CallOnce.h>

#include <pthread.h>

#include <deque>
#include <mutex>
#include <vector>

#include "aten/neuron.h"
#include "runtime/memory.h"
#include "runtime/platform.h"
#include "runtime/stream.h"

namespace torch_neuronx {

namespace rt = neuron::rt;

void rethrow_runtime_error(const rt::Error& e) {
  switch (e.code()) {
    case rt::ErrorCode::kOutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    case rt::ErrorCode::kInvalidArgument:
      TORCH_CHECK_VALUE(false, e.what());
    default:
      TORCH_CHECK(false, e.what());
  }
}

// ---- devices ------------------------------------------------------------------------

namespace {
// The device a thread starts on. A launcher (torchrun, accelerate, mpirun-style tools)
// starts one process per NeuronCore and says which in LOCAL_RANK; as with AWS's runtime,
// that process starts on its own core, so code that never calls set_device (accelerate's
// neuron path does not) still puts rank i on neuron:i. Without LOCAL_RANK: neuron:0.
c10::DeviceIndex initial_device() {
  static const c10::DeviceIndex d = [] {
    const char* v = std::getenv("LOCAL_RANK");
    if (!v || !*v) return c10::DeviceIndex(0);
    char* end = nullptr;
    long r = std::strtol(v, &end, 10);
    long n = device_count();
    if (*end != 0 || r < 0 || n <= 0) return c10::DeviceIndex(0);
    return static_cast<c10::DeviceIndex>(r % n);  // more ranks than cores share them
  }();
  return d;
}
thread_local c10::DeviceIndex tls_device = initial_device();
// Current stream per device on this thread (CUDA semantics: thread-local).
thread_local std::vector<rt::StreamId> tls_streams;

rt::StreamId& current_stream_slot(c10::DeviceIndex d) {
  if (tls_streams.size() <= static_cast<size_t>(d)) tls_streams.resize(static_cast<size_t>(d) + 1, rt::kDefaultStream);
  return tls_streams[static_cast<size_t>(d)];
}
}  // namespace

c10::DeviceIndex device_count() noexcept { return static_cast<c10::DeviceIndex>(rt::device_count()); }

void check_device_index(c10::DeviceIndex index) { rt_call([&] { rt::check_device(index); }); }

c10::DeviceIndex current_device() { return tls_device; }

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  tls_device = index;
}

std::atomic<bool> g_runtime_ready{false};

void lazy_init_slow() {
  if (!rt::is_initialized() || rt::in_bad_fork()) {
    rt_call([] { rt::initialize(); });  // raises in a forked child
    install_kernel_cpu_allocator();
  }
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, [] { g_runtime_ready.store(false); }); });
  g_runtime_ready.store(true);
}

namespace {

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNeuron, tls_device); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { tls_device = d.index(); }

  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, current_stream_slot(d.index()));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, rt::kDefaultStream);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return getNewStream(d, high_priority ? rt::kHighestPriority : rt::kLowestPriority);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    lazy_init();
    c10::DeviceIndex idx = d.has_index() ? d.index() : tls_device;
    auto id = rt_call([&] { return rt::stream_create(idx, priority); });
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, idx), id);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    check_device_index(s.device_index());
    TORCH_CHECK(rt::stream_exists(s.device_index(), s.id()), "Stream ", s.id(), " does not exist on neuron:",
                static_cast<int>(s.device_index()), ".");
    rt::StreamId& slot = current_stream_slot(s.device_index());
    c10::Stream old(c10::Stream::UNSAFE, s.device(), slot);
    slot = s.id();
    return old;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*unused*/) const noexcept override {
    delete static_cast<rt::Event*>(event);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) *event = new rt::Event(flag == c10::EventFlag::BACKEND_DEFAULT);
    auto* ev = static_cast<rt::Event*>(*event);
    rt_call([&] { ev->record(stream.device_index(), stream.id()); });
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    rt_call([&] { rt::stream_wait_event(stream.device_index(), stream.id(), *static_cast<rt::Event*>(event)); });
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || static_cast<rt::Event*>(event)->query();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) static_cast<rt::Event*>(event)->synchronize();
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*unused*/) const override {
    TORCH_CHECK_VALUE(start != nullptr && end != nullptr,
                      "Both events must be recorded before calculating elapsed time.");
    return rt_call([&] { return static_cast<rt::Event*>(start)->elapsed_ms(*static_cast<rt::Event*>(end)); });
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  bool queryStream(const c10::Stream& s) const override {
    return rt_call([&] { return rt::stream_query(s.device_index(), s.id()); });
  }
  void synchronizeStream(const c10::Stream& s) const override {
    rt_call([&] { rt::stream_synchronize(s.device_index(), s.id()); });
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    rt_call([&] { rt::device_synchronize(d); });
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*unused*/, const c10::Stream& /*unused*/) const override {}

  // torch.accelerator.get_device_capability: the dtypes the simulated chip takes. FP8 and
  // the MX formats only where the platform has them (trn3); quantized tensors nowhere.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    if (d.has_index()) check_device_index(d.index());
    const rt::Platform& p = rt_call([] { return std::cref(rt::platform()); }).get();
    c10::DeviceCapability cap;  // every dtype
    auto& t = cap.capability_data.supported_scalar_types;
    t.has_QInt8 = t.has_QUInt8 = t.has_QInt32 = t.has_QUInt4x2 = t.has_QUInt2x4 = 0;
    t.has_Float8_e5m2 = t.has_Float8_e4m3fn = p.chip->supports_fp8 ? 1 : 0;
    t.has_Float8_e5m2fnuz = t.has_Float8_e4m3fnuz = 0;  // AMD's FP8 variants; not Trainium formats
    t.has_Float8_e8m0fnu = t.has_Float4_e2m1fn_x2 = p.chip->supports_mx ? 1 : 0;
    return cap;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

// ---- generators ---------------------------------------------------------------------

// A neuron generator owns a CPU (mt19937) generator. Random kernels run as CPU code
// on device memory and draw from it, so a seed gives the same numbers whichever path
// (explicit kernel or fallback) an op takes, and the same numbers as CPU.
//
// Its state, as CUDA's, is 16 bytes: (seed, offset), each a little-endian uint64. DTensor's
// random ops (and code written for CUDA) read and write the offset to give each shard its own
// numbers. The engine runs the stream keyed by (seed, offset): offset 0 is the plain seed (the
// CPU's numbers after manual_seed); any other offset seeds the engine from a mix of both.
// Reading the state after the engine has drawn moves to a fresh offset first (the engine's
// position is not expressible in 16 bytes), so a saved state always replays what follows it.
struct NeuronGeneratorImpl final : public c10::GeneratorImpl {
  NeuronGeneratorImpl(c10::DeviceIndex d, uint64_t seed)
      : c10::GeneratorImpl(c10::Device(kNeuron, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu(at::make_generator<at::CPUGeneratorImpl>(seed)) {
    rekey(seed, 0);
  }

  void set_current_seed(uint64_t seed) override { rekey(seed, 0); }
  void set_offset(uint64_t offset) override { rekey(seed_, offset); }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = cpu.seed();  // a non-deterministic seed, as the CPU generator picks it
    rekey(s, 0);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_TYPE(state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                     "the neuron RNG state must be a torch.ByteTensor, as returned by get_rng_state()");
    const int64_t n = state.numel();
    if (n == kStateBytes) {
      uint64_t v[2];
      std::memcpy(v, state.data(), kStateBytes);
      rekey(v[0], v[1]);
      return;
    }
    // The CPU generator's own state (earlier releases saved it): the engine continues from it.
    auto probe = at::Tensor(cpu.unsafeGetGeneratorImpl()->get_state());
    TORCH_CHECK(n == probe.numel(), "the neuron RNG state must have ", kStateBytes,
                " bytes (seed and offset, as returned by get_rng_state()), got ", n);
    cpu.unsafeGetGeneratorImpl()->set_state(state);
    seed_ = cpu.current_seed();
    offset_ = next_fresh_offset();
    snapshot_.reset();  // the engine is not at a keyed position: the next read moves to a fresh one
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto* self = const_cast<NeuronGeneratorImpl*>(this);
    if (self->drawn_since_keyed()) self->rekey(seed_, next_fresh_offset());
    auto out = at::detail::empty_cpu({kStateBytes}, at::kByte, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    uint64_t v[2] = {seed_, offset_};
    std::memcpy(out.data_ptr(), v, kStateBytes);
    return out.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return kNeuron; }

  at::Generator cpu;

 private:
  static constexpr int64_t kStateBytes = 16;

  static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  void rekey(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
    cpu.set_current_seed(offset == 0 ? seed : splitmix64(seed ^ splitmix64(offset)));
    snapshot_ = at::Tensor(cpu.unsafeGetGeneratorImpl()->get_state());
    max_offset_ = std::max(max_offset_, offset);
  }

  // Past every offset this generator has keyed, so the new stream is one it has not used.
  uint64_t next_fresh_offset() const { return max_offset_ + 1; }

  bool drawn_since_keyed() {
    if (!snapshot_.defined()) return true;
    auto now = at::Tensor(cpu.unsafeGetGeneratorImpl()->get_state());
    return std::memcmp(now.data_ptr(), snapshot_.data_ptr(), static_cast<size_t>(now.nbytes())) != 0;
  }

  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
  uint64_t max_offset_ = 0;
  at::Tensor snapshot_;  // the engine's state when it was last keyed

  NeuronGeneratorImpl* clone_impl() const override {
    auto* g = new NeuronGeneratorImpl(device().index(), 0);
    g->cpu = cpu.clone();
    g->seed_ = seed_;
    g->offset_ = offset_;
    g->max_offset_ = max_offset_;
    g->snapshot_ = snapshot_.defined() ? snapshot_.clone() : snapshot_;
    return g;
  }
};

std::mutex g_gen_mu;
std::deque<at::Generator>& default_gens() {
  static std::deque<at::Generator> g;
  return g;
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  c10::DeviceIndex d = device < 0 ? current_device() : device;
  check_device_index(d);
  std::lock_guard<std::mutex> lock(g_gen_mu);
  auto& gens = default_gens();
  while (gens.size() < static_cast<size_t>(device_count())) {
    gens.emplace_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(gens.size()),
                                                              c10::default_rng_seed_val));
  }
  return gens[static_cast<size_t>(d)];
}

at::Generator new_generator(c10::DeviceIndex device) {
  c10::DeviceIndex d = device < 0 ? current_device() : device;
  check_device_index(d);
  return at::make_generator<NeuronGeneratorImpl>(d, c10::default_rng_seed_val);
}

at::Generator cpu_generator_of(const at::Generator& g) {
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(g.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a 'neuron' device type for generator but found '", g.device().type(), "'");
  return impl->cpu;
}

// ---- hooks --------------------------------------------------------------------------

namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_generator(d); }
  at::Device getDeviceFromPtr(void* data) const override { return device_of_ptr(data); }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex /*unused*/) const override { return rt::is_initialized(); }
  void init() const override { lazy_init(); }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    c10::DeviceIndex old = current_device();
    if (d != old) set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* s = storage.unsafeGetStorageImpl();
    TORCH_CHECK(s->resizable(), "Trying to resize storage that is not resizable");
    c10::DeviceIndex d = s->device().index();
    c10::DataPtr fresh = allocate_device_memory(d, newsize, c10::Device(kNeuron, d));
    size_t keep = std::min(newsize, s->nbytes());
    if (keep > 0) std::memcpy(fresh.get(), s->data(), keep);
    s->set_data_ptr_noswap(std::move(fresh));
    s->set_nbytes(newsize);
  }
};

NeuronHooks g_hooks;

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(&g_hooks); }
} g_register_hooks;

}  // namespace
}  // namespace torch_neuronx
