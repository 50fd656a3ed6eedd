// The allocation log behind ckpt_viz's memory probe (ckpt_viz/probe/native.py, NOTE [ Native log ]).
//
// Wraps torch's CPU allocator (c10::SetAllocator) and logs (ptr, nbytes) for each allocation made on a
// thread whose logging flag is on, and (ptr, -nbytes) when such an allocation is freed, on any thread.
// Plain extern "C" functions, called through ctypes; no Python API here.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

struct Logged {
  c10::DataPtr inner;
  int64_t nbytes;
};

std::mutex g_mutex;                                // guards everything below it
std::vector<int64_t> g_log;                        // ptr, nbytes pairs (nbytes < 0: a free)
std::vector<int64_t> g_taken;                      // the last drained pairs, valid until the next drain
std::unordered_map<void*, Logged> g_live;          // logged allocations not freed yet
std::atomic<int64_t> g_position{0};                // pairs logged since the log was reset
std::atomic<int> g_open{0};                        // open logs: frees are logged only while one is
c10::Allocator* g_inner = nullptr;
thread_local int t_logging = 0;  // open streams on this thread

void append(void* ptr, int64_t nbytes) {  // with g_mutex held
  g_log.push_back(reinterpret_cast<int64_t>(ptr));
  g_log.push_back(nbytes);
  g_position.store(g_position.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void logged_free(void* ptr) {
  c10::DataPtr inner;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto found = g_live.find(ptr);
    if (found == g_live.end()) {
      // An allocation made while logging was off (raw_allocate): the inner allocator's own deleter.
      auto deleter = g_inner->raw_deleter();
      if (deleter != nullptr) {
        deleter(ptr);
      }
      return;
    }
    if (g_open.load(std::memory_order_relaxed) > 0) {
      append(ptr, -found->second.nbytes);
    }
    inner = std::move(found->second.inner);
    g_live.erase(found);
  }
  // `inner` frees the memory here, outside the lock.
}

struct LoggingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = g_inner->allocate(n);
    if (t_logging <= 0 || inner.get() == nullptr) {
      return inner;
    }
    void* ptr = inner.get();
    c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      append(ptr, static_cast<int64_t>(n));
      g_live.emplace(ptr, Logged{std::move(inner), static_cast<int64_t>(n)});
    }
    // The context is the data pointer itself, as the inner allocator's, so raw_allocate keeps working.
    return c10::DataPtr(ptr, ptr, &logged_free, device);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &logged_free;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_inner->copy_data(dest, src, count);
  }
};

LoggingAllocator g_wrapper;

}  // namespace

extern "C" {

// Put the wrapper in front of the CPU allocator (once per process). 1: installed now or before; 0: a
// higher-priority allocator is set, so the wrapper is not the one CPU tensors use.
int ckpt_alloc_log_install(int priority) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_inner == nullptr) {
    c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
    if (current == &g_wrapper) {
      return 1;
    }
    g_inner = current;
    c10::SetAllocator(c10::DeviceType::CPU, &g_wrapper, static_cast<uint8_t>(priority));
  }
  return c10::GetAllocator(c10::DeviceType::CPU) == &g_wrapper ? 1 : 0;
}

// One more (+1) or one fewer (-1) stream logging this thread's allocations; return how many now.
int ckpt_alloc_log_thread(int delta) {
  t_logging += delta;
  return t_logging;
}

// A log opens (frees are logged from now) or closes; opening the first one empties the log.
void ckpt_alloc_log_open(int open) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (open) {
    if (g_open.fetch_add(1) == 0) {
      g_log.clear();
      g_taken.clear();
      g_position.store(0);
    }
  } else {
    g_open.fetch_sub(1);
  }
}

// The address of the position counter (pairs logged so far), for a read without a call.
const int64_t* ckpt_alloc_log_position_address() {
  static_assert(sizeof(std::atomic<int64_t>) == sizeof(int64_t), "a plain int64 read");
  return reinterpret_cast<const int64_t*>(&g_position);
}

// Move every pair logged since the last drain out of the log: *count pairs at the returned address,
// valid until the next drain; *first is the position of the first of them.
const int64_t* ckpt_alloc_log_drain(int64_t* count, int64_t* first) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_taken.swap(g_log);
  g_log.clear();
  *count = static_cast<int64_t>(g_taken.size() / 2);
  *first = g_position.load() - *count;
  return g_taken.data();
}

// Logged allocations not freed yet (for tests).
int64_t ckpt_alloc_log_live() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int64_t>(g_live.size());
}

}  // extern "C"
