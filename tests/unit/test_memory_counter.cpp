// MemoryCounter: live bytes, the peak and the per-op window, fed by allocator callbacks; and a
// source that attaches late (the CUDA tracker, once CUDA is initialised) starting from the
// bytes already held, so a later free of those never takes "live" below what is really held.
#include <gtest/gtest.h>

#include "profiler/memory.h"

using memplan::MemoryCounter;

TEST(MemoryCounter, LivePeakAndWindow) {
  MemoryCounter m;
  m.on_alloc(100);
  m.on_alloc(50);
  m.on_free(100);
  EXPECT_EQ(m.live(), 50);
  EXPECT_EQ(m.peak(), 150);
  EXPECT_EQ(m.allocs(), 2);
  m.reset_window();
  m.on_alloc(30);
  m.on_free(30);
  EXPECT_EQ(m.window_peak(), 80);
  m.reset_peak();
  EXPECT_EQ(m.peak(), 50);
}

TEST(MemoryCounter, ALateSourceStartsFromWhatIsHeld) {
  MemoryCounter m;
  m.start_from(1000);  // parameters on the device before the tracker attached
  EXPECT_EQ(m.live(), 1000);
  EXPECT_EQ(m.peak(), 1000);
  EXPECT_EQ(m.allocs(), 0);  // no allocation was seen
  m.on_alloc(200);
  m.on_free(1000);  // one of the blocks from before: live stays what is really held
  EXPECT_EQ(m.live(), 200);
  EXPECT_EQ(m.peak(), 1200);
}
