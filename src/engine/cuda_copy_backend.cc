// A CopyBackend over the CUDA runtime, loaded with dlopen at run time (see
// tensorizer/staged_load.h): the library torch already loaded is found by its soname, so builds
// need no CUDA toolkit and CPU-only machines never touch one. Page-locked staging
// (cudaHostAlloc), cudaMemcpyAsync on non-blocking streams, one event per staging slot.
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/staged_load.h"

namespace tensorizer {
namespace {

// The few runtime entry points used, with the ABI's plain types (no CUDA headers needed).
using cudaError_t = int;
using cudaStream_t = void*;
using cudaEvent_t = void*;
constexpr unsigned kHostAllocPortable = 1;   // cudaHostAllocPortable
constexpr unsigned kStreamNonBlocking = 1;   // cudaStreamNonBlocking
constexpr unsigned kEventDisableTiming = 2;  // cudaEventDisableTiming
constexpr int kMemcpyDefault = 4;            // cudaMemcpyDefault (unified addressing decides)

struct CudaRuntime {
  void* handle = nullptr;
  std::string path;
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*GetDevice)(int*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*HostAlloc)(void**, size_t, unsigned);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  cudaError_t (*StreamSynchronize)(cudaStream_t);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t);
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned);
  cudaError_t (*EventDestroy)(cudaEvent_t);
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*EventSynchronize)(cudaEvent_t);
  const char* (*GetErrorString)(cudaError_t);

  void check(cudaError_t rc, const char* what) const {
    if (rc != 0)
      fail(ErrorCode::kIO, std::string("CUDA ") + what + " failed: " + GetErrorString(rc));
  }
};

template <typename F>
void load_symbol(void* handle, const std::string& path, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!fn) fail(ErrorCode::kUnsupported, "the CUDA runtime '" + path + "' has no " + name);
}

// Opens and binds a runtime: `library` when given, else TENSORIZER_CUDART, else one already in
// the process (torch's), else one found by name.
std::unique_ptr<CudaRuntime> open_runtime(const std::string& library) {
  std::vector<std::string> names;
  if (!library.empty())
    names.push_back(library);
  else if (const char* env = std::getenv("TENSORIZER_CUDART"); env && *env)
    names.emplace_back(env);
  for (const char* n : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"})
    if (library.empty()) names.emplace_back(n);
  auto rt = std::make_unique<CudaRuntime>();
  for (int flags : {RTLD_NOW | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const auto& n : names)
      if ((rt->handle = dlopen(n.c_str(), flags))) {
        rt->path = n;
        break;
      }
    if (rt->handle) break;
  }
  if (!rt->handle)
    fail(ErrorCode::kUnsupported,
         library.empty() ? "no CUDA runtime (libcudart) is loaded or can be found; set "
                           "TENSORIZER_CUDART to its path"
                         : "cannot load the CUDA runtime '" + library + "'");
  load_symbol(rt->handle, rt->path, "cudaGetDeviceCount", rt->GetDeviceCount);
  load_symbol(rt->handle, rt->path, "cudaGetDevice", rt->GetDevice);
  load_symbol(rt->handle, rt->path, "cudaSetDevice", rt->SetDevice);
  load_symbol(rt->handle, rt->path, "cudaHostAlloc", rt->HostAlloc);
  load_symbol(rt->handle, rt->path, "cudaFreeHost", rt->FreeHost);
  load_symbol(rt->handle, rt->path, "cudaStreamCreateWithFlags", rt->StreamCreateWithFlags);
  load_symbol(rt->handle, rt->path, "cudaStreamDestroy", rt->StreamDestroy);
  load_symbol(rt->handle, rt->path, "cudaStreamSynchronize", rt->StreamSynchronize);
  load_symbol(rt->handle, rt->path, "cudaMemcpyAsync", rt->MemcpyAsync);
  load_symbol(rt->handle, rt->path, "cudaMemsetAsync", rt->MemsetAsync);
  load_symbol(rt->handle, rt->path, "cudaEventCreateWithFlags", rt->EventCreateWithFlags);
  load_symbol(rt->handle, rt->path, "cudaEventDestroy", rt->EventDestroy);
  load_symbol(rt->handle, rt->path, "cudaEventRecord", rt->EventRecord);
  load_symbol(rt->handle, rt->path, "cudaEventSynchronize", rt->EventSynchronize);
  load_symbol(rt->handle, rt->path, "cudaGetErrorString", rt->GetErrorString);
  return rt;
}

// One runtime per library asked for, opened on first use and kept for the process (never
// unloaded: torch's is shared, and backends may outlive a call).
const CudaRuntime& runtime(const std::string& library) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<CudaRuntime>> opened;
  std::lock_guard<std::mutex> lock(mu);
  auto& rt = opened[library];
  if (!rt) rt = open_runtime(library);
  return *rt;
}

// Makes `device` current on this thread for its lifetime, then puts back the previous one.
class DeviceScope {
 public:
  DeviceScope(const CudaRuntime& rt, int device) : rt_(rt) {
    rt_.check(rt_.GetDevice(&previous_), "cudaGetDevice");
    rt_.check(rt_.SetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { rt_.SetDevice(previous_); }

 private:
  const CudaRuntime& rt_;
  int previous_ = 0;
};

class CudaEvent : public CopyEvent {
 public:
  CudaEvent(const CudaRuntime& rt, const std::vector<cudaStream_t>& streams)
      : rt_(rt), streams_(streams) {
    rt_.check(rt_.EventCreateWithFlags(&event_, kEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~CudaEvent() override { rt_.EventDestroy(event_); }
  void record(int stream) override {
    rt_.check(rt_.EventRecord(event_, streams_[static_cast<size_t>(stream)]), "cudaEventRecord");
  }
  void wait() override { rt_.check(rt_.EventSynchronize(event_), "cudaEventSynchronize"); }

 private:
  const CudaRuntime& rt_;
  const std::vector<cudaStream_t>& streams_;
  cudaEvent_t event_ = nullptr;
};

class CudaCopyBackend : public CopyBackend {
 public:
  CudaCopyBackend(const CudaRuntime& rt, int device, int streams) : rt_(rt), device_(device) {
    int count = 0;
    if (const cudaError_t rc = rt_.GetDeviceCount(&count); rc != 0)
      fail(ErrorCode::kUnsupported,
           std::string("no usable CUDA device: ") + rt_.GetErrorString(rc));
    if (device < 0 || device >= count)
      fail(ErrorCode::kUnsupported, "CUDA device " + std::to_string(device) + " does not exist (" +
                                        std::to_string(count) + " visible)");
    DeviceScope scope(rt_, device_);
    for (int i = 0; i < std::max(streams, 1); ++i) {
      cudaStream_t s = nullptr;
      rt_.check(rt_.StreamCreateWithFlags(&s, kStreamNonBlocking), "cudaStreamCreateWithFlags");
      streams_.push_back(s);
    }
  }
  ~CudaCopyBackend() override {
    for (cudaStream_t s : streams_) rt_.StreamSynchronize(s), rt_.StreamDestroy(s);
  }
  std::string name() const override {
    return "cuda:" + std::to_string(device_) + " (" + rt_.path + ")";
  }
  void* alloc_staging(size_t bytes) override {
    void* p = nullptr;
    rt_.check(rt_.HostAlloc(&p, bytes, kHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void free_staging(void* data, size_t) noexcept override { rt_.FreeHost(data); }
  int bind_thread() override {
    int previous = 0;
    rt_.check(rt_.GetDevice(&previous), "cudaGetDevice");
    rt_.check(rt_.SetDevice(device_), "cudaSetDevice");
    return previous;
  }
  void unbind_thread(int previous) noexcept override { rt_.SetDevice(previous); }
  int streams() const override { return static_cast<int>(streams_.size()); }
  void copy_async(void* dst, const void* src, size_t size, int stream) override {
    rt_.check(
        rt_.MemcpyAsync(dst, src, size, kMemcpyDefault, streams_[static_cast<size_t>(stream)]),
        "cudaMemcpyAsync");
  }
  void zero_async(void* dst, size_t size, int stream) override {
    rt_.check(rt_.MemsetAsync(dst, 0, size, streams_[static_cast<size_t>(stream)]),
              "cudaMemsetAsync");
  }
  std::unique_ptr<CopyEvent> make_event() override {
    return std::make_unique<CudaEvent>(rt_, streams_);
  }
  void synchronize() override {
    for (cudaStream_t s : streams_) rt_.check(rt_.StreamSynchronize(s), "cudaStreamSynchronize");
  }

 private:
  const CudaRuntime& rt_;
  int device_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace

std::unique_ptr<CopyBackend> cuda_copy_backend(int device, int streams,
                                               const std::string& library) {
  return std::make_unique<CudaCopyBackend>(runtime(library), device, streams);
}

}  // namespace tensorizer
