#include "profiler/memory.h"

namespace memplan {

MemoryCounter& cpu_memory() {
  static MemoryCounter c;
  return c;
}

MemoryCounter& cuda_memory() {
  static MemoryCounter c;
  return c;
}

}  // namespace memplan
