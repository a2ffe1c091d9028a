// How many bytes of C stack the calling thread has left below the current frame (overmind/entries/deep_recursion.py).
#include <pthread.h>

#include <cstdint>

#include "zerocopy.h"

namespace overmind {

int64_t stack_room() {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) {
    return -1;
  }
  void* low = nullptr;
  size_t size = 0;
  int rc = pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0 || low == nullptr) {
    return -1;
  }
  // The stack grows down on every architecture this builds for: the room is what lies between here and its
  // lowest address. For the process's first thread glibc derives the bounds from RLIMIT_STACK and the mapping.
  volatile char here = 0;
  auto room = reinterpret_cast<uintptr_t>(&here) - reinterpret_cast<uintptr_t>(low);
  return room > static_cast<uintptr_t>(size) ? -1 : static_cast<int64_t>(room);
}

}  // namespace overmind
