// A stand-in for the CUDA runtime, built as a shared library for the tests only: the dozen entry
// points the CUDA copy backend loads with dlopen, over host memory (two "devices"; copies are done
// at once, and refused unless the calling thread made device 0 current, where the tests load), with
// a switch that makes a chosen copy fail and counters the tests read. It lets the backend's
// loading, binding, device scoping and error paths run where there is no GPU.
//
// No thread_local here: the sanitizers' leak check at exit (LSan) crashed now and then ("Tracer
// caught signal 11") walking the dynamic TLS that the backend's exited workers had in this
// dlopen'ed library. The current device is a pthread key's value instead.
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {
pthread_key_t device_key;
pthread_once_t device_key_once = PTHREAD_ONCE_INIT;
int current_device() {
  pthread_once(&device_key_once, [] { pthread_key_create(&device_key, nullptr); });
  return static_cast<int>(reinterpret_cast<intptr_t>(pthread_getspecific(device_key)));
}
void set_current_device(int d) {
  current_device();  // creates the key
  pthread_setspecific(device_key, reinterpret_cast<void*>(static_cast<intptr_t>(d)));
}
std::atomic<int> copies{0};
std::atomic<int> fail_at{0};  // 0: never
std::atomic<int> live_host_allocs{0};
std::atomic<int> live_streams{0};
std::atomic<int> live_events{0};
constexpr int kInvalidDevice = 101;
constexpr int kIllegalAddress = 700;
}  // namespace

extern "C" {

// Test controls.
void fake_cudart_fail_copy(int nth) {
  copies = 0;
  fail_at = nth;
}
int fake_cudart_live_host_allocs() { return live_host_allocs; }
int fake_cudart_live_streams() { return live_streams; }
int fake_cudart_live_events() { return live_events; }

int cudaGetDeviceCount(int* n) {
  *n = 2;
  return 0;
}
int cudaGetDevice(int* d) {
  *d = current_device();
  return 0;
}
int cudaSetDevice(int d) {
  if (d < 0 || d > 1) return kInvalidDevice;
  set_current_device(d);
  return 0;
}
int cudaHostAlloc(void** p, size_t n, unsigned) {
  *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  ++live_host_allocs;
  return 0;
}
int cudaFreeHost(void* p) {
  std::free(p);
  --live_host_allocs;
  return 0;
}
int cudaStreamCreateWithFlags(void** s, unsigned) {
  *s = new int(0);
  ++live_streams;
  return 0;
}
int cudaStreamDestroy(void* s) {
  delete static_cast<int*>(s);
  --live_streams;
  return 0;
}
int cudaStreamSynchronize(void*) { return 0; }
int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, void*) {
  if (kind != 4) return 1;  // the backend asks for cudaMemcpyDefault
  if (current_device() != 0) return kInvalidDevice;
  if (++copies == fail_at) return kIllegalAddress;
  std::memcpy(dst, src, n);
  return 0;
}
int cudaMemsetAsync(void* dst, int value, size_t n, void*) {
  if (current_device() != 0) return kInvalidDevice;
  std::memset(dst, value, n);
  return 0;
}
int cudaEventCreateWithFlags(void** e, unsigned) {
  *e = new int(0);
  ++live_events;
  return 0;
}
int cudaEventDestroy(void* e) {
  delete static_cast<int*>(e);
  --live_events;
  return 0;
}
int cudaEventRecord(void*, void*) { return 0; }
int cudaEventSynchronize(void*) { return 0; }
const char* cudaGetErrorString(int rc) {
  static std::mutex mu;
  static std::map<int, std::string> texts;  // kept: callers hold the pointer
  std::lock_guard<std::mutex> lock(mu);
  std::string& s = texts[rc];
  if (s.empty()) s = "fake CUDA error " + std::to_string(rc);
  return s.c_str();
}

}  // extern "C"
