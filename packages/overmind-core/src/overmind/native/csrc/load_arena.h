// overmind.native._C: a miss's large CPU allocations placed in the memfd that becomes its entry, the compiled half
// of `shm/arena.py` (no Python twin: without it, storages are copied).
//
// While a thread has an arena open, every CPU allocation it makes of at least the arena's threshold is a
// page-aligned range of that arena's memfd, mapped shared: the loader's converted tensors are written there
// once, by the conversion itself, instead of into the heap and then copied into an entry. Meanwhile another
// thread's allocation of that size is a private anonymous mapping of its own, unmapped when freed (a loader's
// worker threads: the miss frees their tensors once its result is rebuilt from the entry, and glibc would keep
// them in the thread's malloc arena). No Python twin: without the extension every storage is copied as before.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

namespace overmind {

// Open an arena on this thread (arenas nest: the innermost one receives the allocations) and return its
// handle. Installs the placing CPU allocator while any arena is open. Throws std::runtime_error when the
// memfd cannot be made or another CPU allocator of higher priority is installed.
int64_t arena_open(int64_t threshold);

// This thread's loader returned: the arena receives nothing more, and each live range is remapped private
// (MAP_PRIVATE over the same memfd pages), so the memfd can be sealed while the loader's tensors stay valid.
// Returns (address, size, memfd offset) of each live range. The arena must be this thread's innermost.
std::vector<std::tuple<uintptr_t, uint64_t, uint64_t>> arena_close(int64_t handle);

// A live range whose bytes the entry will not hold (equal bytes found elsewhere): give its tensor a private
// anonymous copy at the same address, then punch the range out of the memfd.
void arena_detach(int64_t handle, uintptr_t address);

// The arena's memfd (not a copy: dup it to keep it).
int arena_fd(int64_t handle);

// Forget the handle; the memfd is closed now if the arena is closed (its ranges keep their pages mapped).
void arena_release(int64_t handle);

// Live ranges of all arenas (for tests and `overmind doctor`).
int64_t arena_live_ranges();

}  // namespace overmind
