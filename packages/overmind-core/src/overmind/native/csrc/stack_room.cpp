// How many bytes of C stack the calling thread has left below the current frame (`pthread_getattr_np`), so that
// overmind/entries/deep_recursion.py pickles in the caller's thread where the recursion limit fits.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>

#include "zerocopy.h"

namespace overmind {

namespace {

// A thread's stack bounds, asked of glibc once per thread. For the process's first thread glibc derives them
// from RLIMIT_STACK and the mapping below the stack, reading /proc/self/maps: ~1.5 ms in a process that has
// imported torch (a thousand mappings), paid by every publish's pickle. They stay what glibc reports while the
// process (a fork's child has its own cache entry), the thread and the soft limit stay the same; with no limit
// glibc bounds the stack by the nearest mapping below it, which can change, so that case asks every time.
struct Bounds {
  pid_t pid = 0;
  rlim_t limit = 0;
  uintptr_t low = 0;
  size_t size = 0;
};

thread_local Bounds cached;

bool ask(Bounds& out) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) {
    return false;
  }
  void* low = nullptr;
  size_t size = 0;
  int rc = pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0 || low == nullptr) {
    return false;
  }
  out.low = reinterpret_cast<uintptr_t>(low);
  out.size = size;
  return true;
}

}  // namespace

int64_t stack_room() {
  struct rlimit rl;
  bool limited = getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
  pid_t pid = getpid();
  Bounds bounds;
  if (limited && cached.low != 0 && cached.pid == pid && cached.limit == rl.rlim_cur) {
    bounds = cached;
  } else {
    if (!ask(bounds)) {
      return -1;
    }
    bounds.pid = pid;
    bounds.limit = limited ? rl.rlim_cur : 0;
    cached = limited ? bounds : Bounds{};
  }
  // The stack grows down on every architecture this builds for: the room is what lies between here and its
  // lowest address.
  volatile char here = 0;
  auto room = reinterpret_cast<uintptr_t>(&here) - bounds.low;
  return room > static_cast<uintptr_t>(bounds.size) ? -1 : static_cast<int64_t>(room);
}

}  // namespace overmind
