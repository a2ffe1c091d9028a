// A load's arena: the placing CPU allocator (`c10::SetCPUAllocator` while an arena is open), a thread's open arenas
// and their ranges of one memfd (punched on free, remapped private at the close, detached where dedup found the
// bytes elsewhere); another thread's large allocations as mappings of their own, unmapped when freed. See
// load_arena.h and overmind/shm/arena.py.
#include "load_arena.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace overmind {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kHeader = kPage;  // [0, kHeader) of the memfd is the entry's header (shm/layout.py)

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

struct Arena {
  int fd = -1;
  uint64_t threshold = 0;
  std::mutex mu;
  uint64_t end = kHeader;  // the next free offset
  bool open = true;         // receives allocations and punches the ranges freed
  bool failed = false;      // the memfd could not grow: allocations go to the heap from now on
  std::map<uintptr_t, struct Range*> live;
  ~Arena() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
};

struct Range {
  std::shared_ptr<Arena> arena;
  void* address;
  uint64_t size;
  uint64_t offset;
  bool detached = false;  // its pages are anonymous now, not the memfd's
};

std::mutex g_mu;                                 // guards the two maps below and the install count
std::unordered_map<void*, Range*> g_ranges;      // address -> range, for the deleter (raw_allocate-compatible)
std::unordered_map<void*, uint64_t> g_own;       // address -> size of another thread's own mappings (below)
std::unordered_map<int64_t, std::shared_ptr<Arena>> g_handles;
int64_t g_next_handle = 1;
int64_t g_open = 0;  // arenas open in this process: the allocator is installed while > 0
std::atomic<uint64_t> g_own_threshold{UINT64_MAX};  // the smallest threshold of the open arenas (g_mu writes)

thread_local std::vector<std::shared_ptr<Arena>> t_arenas;  // this thread's open arenas, innermost last

c10::DeleterFnPtr g_base_raw_deleter = nullptr;

void release_range(void* ptr) {
  Range* r = nullptr;
  uint64_t own_size = 0;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_ranges.find(ptr);
    if (it != g_ranges.end()) {
      r = it->second;
      g_ranges.erase(it);
    } else if (auto own = g_own.find(ptr); own != g_own.end()) {
      own_size = own->second;
      g_own.erase(own);
    }
  }
  if (own_size > 0) {  // another thread's own mapping: its pages go back to the system now
    ::munmap(ptr, own_size);
    return;
  }
  if (r == nullptr) {  // an allocation of the allocator beneath (reached through raw_deallocate)
    if (g_base_raw_deleter != nullptr) {
      g_base_raw_deleter(ptr);
    }
    return;
  }
  ::munmap(r->address, r->size);
  {
    std::lock_guard<std::mutex> g(r->arena->mu);
    r->arena->live.erase(reinterpret_cast<uintptr_t>(r->address));
    if (r->arena->open && !r->detached && r->arena->fd >= 0) {
      // A temporary of the loader: its pages go back now, and the entry keeps a hole there.
      ::fallocate(r->arena->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r->offset),
                  static_cast<off_t>(r->size));
    }
  }
  delete r;  // drops its share of the arena (the last one closes the memfd)
}

struct PlacingAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;

  c10::DataPtr allocate(size_t n) override {
    if (!t_arenas.empty() && n >= t_arenas.back()->threshold && n > 0) {
      if (void* p = place(t_arenas.back(), n)) {
        // context == data, as raw_allocate requires; release_range finds the range by address
        return {p, p, &release_range, c10::Device(c10::DeviceType::CPU)};
      }
    } else if (t_arenas.empty() && n >= own_threshold() && n > 0) {
      if (void* p = own_mapping(n)) {
        return {p, p, &release_range, c10::Device(c10::DeviceType::CPU)};
      }
    }
    return base->allocate(n);
  }

  static uint64_t own_threshold() { return g_own_threshold.load(std::memory_order_relaxed); }

  // Another thread's large allocation while an arena is open (a loader's worker threads: transformers 5
  // converts in a thread pool): a private anonymous mapping of its own, so that freeing it gives its pages
  // back. From the heap, it would come from that thread's malloc arena, whose freed top glibc keeps (the miss
  // frees the loader's result once it is rebuilt from the entry; malloc_trim does not trim a thread's arena).
  static void* own_mapping(uint64_t n) {
    uint64_t size = round_up(n, kPage);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return nullptr;  // the heap, as before
    }
    std::lock_guard<std::mutex> g(g_mu);
    g_own[p] = size;
    return p;
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release_range; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void* place(const std::shared_ptr<Arena>& a, uint64_t n) {
    uint64_t size = round_up(n, kPage);
    uint64_t offset;
    {
      std::lock_guard<std::mutex> g(a->mu);
      if (!a->open || a->failed) {
        return nullptr;
      }
      offset = a->end;
      if (::ftruncate(a->fd, static_cast<off_t>(offset + size)) != 0) {
        a->failed = true;
        return nullptr;
      }
      a->end = offset + size;
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, static_cast<off_t>(offset));
    if (p == MAP_FAILED) {
      return nullptr;  // the range stays a hole of the memfd
    }
    auto* r = new Range{a, p, size, offset};
    {
      std::lock_guard<std::mutex> g(g_mu);
      g_ranges[p] = r;
    }
    std::lock_guard<std::mutex> g(a->mu);
    a->live[reinterpret_cast<uintptr_t>(p)] = r;
    return p;
  }
};

PlacingAllocator g_allocator;  // never destroyed before exit: a storage may outlive any arena

void forget_arenas_in_child() { t_arenas.clear(); }  // a forked child's allocations are its own

void install_locked() {
  if (g_open++ > 0) {
    return;
  }
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, &forget_arenas_in_child); });
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != &g_allocator) {
    g_allocator.base = current;
    g_base_raw_deleter = current->raw_deleter();
    c10::SetCPUAllocator(&g_allocator, 0);
  }
  if (c10::GetCPUAllocator() != &g_allocator) {
    g_open--;
    throw std::runtime_error("another CPU allocator of higher priority is installed in torch");
  }
}

void uninstall_locked() {
  if (--g_open > 0) {
    return;
  }
  g_own_threshold = UINT64_MAX;
  if (c10::GetCPUAllocator() == &g_allocator && g_allocator.base != nullptr) {
    c10::SetCPUAllocator(g_allocator.base, 0);  // g_allocator keeps its base: cached pointers still work
  }
}

std::shared_ptr<Arena> by_handle(int64_t handle) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_handles.find(handle);
  if (it == g_handles.end()) {
    throw std::invalid_argument("no open arena has handle " + std::to_string(handle));
  }
  return it->second;
}

}  // namespace

int64_t arena_open(int64_t threshold) {
  int fd = ::memfd_create("overmind-load", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    throw std::runtime_error(std::string("memfd_create failed: ") + std::strerror(errno));
  }
  if (::ftruncate(fd, static_cast<off_t>(kHeader)) != 0) {
    int code = errno;
    ::close(fd);
    throw std::runtime_error(std::string("ftruncate of the arena failed: ") + std::strerror(code));
  }
  auto arena = std::make_shared<Arena>();
  arena->fd = fd;
  arena->threshold = threshold > 0 ? static_cast<uint64_t>(threshold) : 1;
  int64_t handle;
  {
    std::lock_guard<std::mutex> g(g_mu);
    install_locked();  // throws before anything is registered
    handle = g_next_handle++;
    g_handles[handle] = arena;
    g_own_threshold = std::min(g_own_threshold.load(), arena->threshold);
  }
  t_arenas.push_back(arena);
  return handle;
}

std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>> arena_close(int64_t handle) {
  auto arena = by_handle(handle);
  if (t_arenas.empty() || t_arenas.back() != arena) {
    throw std::logic_error("arena_close: the arena is not this thread's innermost open one");
  }
  t_arenas.pop_back();
  std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>> out;
  {
    std::lock_guard<std::mutex> g(arena->mu);
    if (arena->open) {
      arena->open = false;
      std::lock_guard<std::mutex> gg(g_mu);
      uninstall_locked();
    }
    for (auto& [address, r] : arena->live) {
      // Same pages, now copy-on-write: a later write by this process lands in a page of its own, and no
      // writable shared mapping stands in the way of the seal.
      void* p = ::mmap(r->address, r->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, arena->fd,
                       static_cast<off_t>(r->offset));
      if (p == MAP_FAILED) {
        throw std::runtime_error(std::string("remapping a range of the arena private failed: ") +
                                 std::strerror(errno));
      }
      out.emplace_back(address, r->size, r->offset);
    }
  }
  return out;
}

void arena_detach(int64_t handle, uintptr_t address) {
  auto arena = by_handle(handle);
  std::lock_guard<std::mutex> g(arena->mu);
  auto it = arena->live.find(address);
  if (it == arena->live.end()) {
    throw std::invalid_argument("arena_detach: no live range of the arena starts at that address");
  }
  Range* r = it->second;
  if (r->detached) {
    return;
  }
  void* copy = ::mmap(nullptr, r->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) {
    throw std::runtime_error(std::string("arena_detach: no memory for the copy: ") + std::strerror(errno));
  }
  std::memcpy(copy, r->address, r->size);
  // Atomically replaces the range's mapping: its address (the tensor's data pointer) never goes unmapped.
  void* moved = ::mremap(copy, r->size, r->size, MREMAP_MAYMOVE | MREMAP_FIXED, r->address);
  if (moved == MAP_FAILED) {
    int code = errno;
    ::munmap(copy, r->size);
    throw std::runtime_error(std::string("arena_detach: mremap failed: ") + std::strerror(code));
  }
  r->detached = true;
  ::fallocate(arena->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r->offset),
              static_cast<off_t>(r->size));
}

int arena_fd(int64_t handle) { return by_handle(handle)->fd; }

void arena_release(int64_t handle) {
  std::shared_ptr<Arena> arena;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_handles.find(handle);
    if (it == g_handles.end()) {
      return;
    }
    arena = it->second;
    g_handles.erase(it);
  }
  {
    std::lock_guard<std::mutex> g(arena->mu);
    if (arena->open) {  // released without closing (an exception between open and close): stop placing now
      arena->open = false;
      for (auto it = t_arenas.begin(); it != t_arenas.end(); ++it) {
        if (*it == arena) {
          t_arenas.erase(it);
          break;
        }
      }
      std::lock_guard<std::mutex> gg(g_mu);
      uninstall_locked();
    }
    if (arena->fd >= 0) {
      ::close(arena->fd);  // the ranges keep their pages mapped; the sealed entry has its own fd
      arena->fd = -1;
    }
  }
}

int64_t arena_live_ranges() {
  std::lock_guard<std::mutex> g(g_mu);
  return static_cast<int64_t>(g_ranges.size());
}

}  // namespace overmind
