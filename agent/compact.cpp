#include "agent/compact.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mul.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>

namespace memplan {

namespace {

// Not at::empty: no dispatcher call (so no RecordFunction: the agent's own tensors are no ops of
// the user's step) and no fill of "uninitialised" memory under deterministic mode (each element
// is written below).
at::Tensor raw_empty(at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_strided_cpu(sizes, strides, dtype));
}

constexpr int64_t kGrainBytes = 4096;  // mask bytes (8 elements each) per task: below this, one thread

// Bits are packed and spread eight at a time with 64-bit multiplies, so that the per-element
// loops stay plain byte loops the compiler vectorises (a loop that shifts bits into a byte does
// not: it measured 2x slower to compact and 3x slower to expand than the byte masks did).
static_assert(std::endian::native == std::endian::little, "mask bytes are read as little-endian words");
constexpr int64_t kBlock = 512;  // elements staged as 0/1 bytes at a time (64 mask bytes)

// Eight 0/1 bytes (byte i of `w`) -> one byte with bit i set where byte i is 1.
inline uint8_t gather_bits(uint64_t w) { return static_cast<uint8_t>((w * 0x0102040810204080ULL) >> 56); }

// One byte -> eight 0/1 bytes (byte i = bit i).
constexpr uint64_t spread_bits(uint8_t b) {
  const uint64_t w = (b * 0x0101010101010101ULL) & 0x8040201008040201ULL;
  return ((w + 0x7F7F7F7F7F7F7F7FULL) >> 7) & 0x0101010101010101ULL;
}
// ... as a table (2 KiB): one load per byte instead of four dependent operations.
constexpr std::array<uint64_t, 256> kSpread = [] {
  std::array<uint64_t, 256> t{};
  for (int b = 0; b < 256; ++b) t[b] = spread_bits(static_cast<uint8_t>(b));
  return t;
}();

// Writes bit i%8 of mask[i/8] = (x[i] != 0) and says whether every non-zero x[i] equals `top`.
template <typename T>
bool pack(const T* x, uint8_t* mask, int64_t n, T top) {
  std::atomic<bool> ok{true};
  at::parallel_for(0, compact_mask_bytes(n), kGrainBytes, [&](int64_t b, int64_t e) {
    alignas(64) uint8_t flags[kBlock];
    uint8_t bad = 0;
    for (int64_t k = b; k < e; k += kBlock / 8) {
      const int64_t bytes = std::min(kBlock / 8, e - k), base = 8 * k, m = std::min(8 * bytes, n - base);
      for (int64_t i = 0; i < m; ++i) {
        const T v = x[base + i];
        flags[i] = static_cast<uint8_t>(v != 0);
        bad |= static_cast<uint8_t>((v != 0) & (v != top));
      }
      for (int64_t i = m; i < 8 * bytes; ++i) flags[i] = 0;  // the last byte's missing elements
      for (int64_t j = 0; j < bytes; ++j) {
        uint64_t w;
        std::memcpy(&w, flags + 8 * j, 8);
        mask[k + j] = gather_bits(w);
      }
    }
    if (bad) ok.store(false, std::memory_order_relaxed);
  });
  return ok.load();
}

template <typename T>
void unpack(const uint8_t* mask, T* x, int64_t n, T top) {
  at::parallel_for(0, compact_mask_bytes(n), kGrainBytes, [&](int64_t b, int64_t e) {
    alignas(64) uint8_t flags[kBlock];
    for (int64_t k = b; k < e; k += kBlock / 8) {
      const int64_t bytes = std::min(kBlock / 8, e - k), base = 8 * k, m = std::min(8 * bytes, n - base);
      for (int64_t j = 0; j < bytes; ++j) {
        const uint64_t w = kSpread[mask[k + j]];
        std::memcpy(flags + 8 * j, &w, 8);
      }
      for (int64_t i = 0; i < m; ++i) x[base + i] = static_cast<T>(-static_cast<T>(flags[i]) & top);
    }
  });
}

template <typename T>
bool compact_as(const at::Tensor& t, CompactMask* out) {
  const T* x = static_cast<const T*>(t.data_ptr());
  const int64_t n = t.numel();
  int64_t first = 0;
  while (first < n && x[first] == 0) ++first;  // the value: the first non-zero pattern
  const T top = first < n ? x[first] : T(0);
  const int64_t nbytes = compact_mask_bytes(n);
  at::Tensor mask = raw_empty({nbytes}, {1}, at::kByte);
  if (!pack<T>(x, static_cast<uint8_t*>(mask.data_ptr()), n, top)) return false;
  out->mask = std::move(mask);
  out->sizes = t.sizes().vec();
  out->strides = t.strides().vec();
  out->numel = n;
  std::memcpy(&out->bits, &top, sizeof(T));
  out->dtype = t.scalar_type();
  return true;
}

template <typename T>
at::Tensor expand_as(const CompactMask& c) {
  at::Tensor t = raw_empty(c.sizes, c.strides, c.dtype);  // the original layout: memory order
  T top;
  std::memcpy(&top, &c.bits, sizeof(T));
  unpack<T>(static_cast<const uint8_t*>(c.mask.data_ptr()), static_cast<T*>(t.data_ptr()), c.numel, top);
  return t;
}

}  // namespace

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes()))
    return false;
  at::ScalarType it;
  switch (a.element_size()) {
    case 1: it = at::kByte; break;
    case 2: it = at::kShort; break;
    case 4: it = at::kInt; break;
    case 8: it = at::kLong; break;
    default: return false;
  }
  return at::equal(a.view(it), b.view(it));
}

bool tail_fits(const at::Tensor& input, const CompactMask& mask) {
  return input.defined() && mask.mask.defined() && input.is_non_overlapping_and_dense() &&
         input.sizes().equals(mask.sizes) && input.strides().equals(mask.strides) &&
         input.scalar_type() == mask.dtype;
}

bool tail_matches(const at::Tensor& input, const CompactMask& mask, const at::Tensor& out) {
  // The same dense layout for all three (a channels-last dropout's input, noise and output): each
  // is read in memory order, where the mask's bits are, element by element alike.
  if (!tail_fits(input, mask) || !tail_fits(out, mask)) return false;
  // A multiple of 8: each chunk starts on a byte of the mask. Small: the check runs inside a
  // rebuild, the first time only, and its two temporaries (2 x 16 KiB for floats) are memory no
  // plan counts (16384 elements measured +1.1% over the predicted peak in that one step, GPT-2
  // at its minimum budget, tools/soak.py).
  constexpr int64_t kChunk = 4096;
  const int64_t n = input.numel();
  const auto memory_order = [n](const at::Tensor& t) { return t.as_strided({n}, {1}, t.storage_offset()); };
  const at::Tensor in = memory_order(input), o = memory_order(out);
  for (int64_t s = 0; s < n; s += kChunk) {
    const int64_t len = std::min(kChunk, n - s);
    const CompactMask part{mask.mask.narrow(0, s / 8, compact_mask_bytes(len)), {len}, {1}, len, mask.bits, mask.dtype};
    if (!bitwise_equal(at::mul(in.narrow(0, s, len), expand_mask(part)), o.narrow(0, s, len))) return false;
  }
  return true;
}

bool compact_mask(const at::Tensor& t, CompactMask* out) {
  // Dense in any order (a dropout of a transposed tensor saves a transposed mask): both passes
  // run over the storage in memory order, and the mask keeps the tensor's strides.
  if (!t.defined() || !t.is_cpu() || t.layout() != at::kStrided || !t.is_non_overlapping_and_dense() ||
      t.storage_offset() != 0 || t.numel() == 0 || t.is_conj() || t.is_neg() ||
      static_cast<int64_t>(t.storage().nbytes()) != static_cast<int64_t>(t.numel() * t.element_size())) {
    return false;
  }
  switch (t.scalar_type()) {
    case at::kFloat: return compact_as<int32_t>(t, out);
    case at::kDouble: return compact_as<int64_t>(t, out);
    case at::kHalf:
    case at::kBFloat16: return compact_as<int16_t>(t, out);
    default: return false;
  }
}

at::Tensor expand_mask(const CompactMask& c) {
  switch (c.dtype) {
    case at::kFloat: return expand_as<int32_t>(c);
    case at::kDouble: return expand_as<int64_t>(c);
    case at::kHalf:
    case at::kBFloat16: return expand_as<int16_t>(c);
    default: return at::Tensor();
  }
}

}  // namespace memplan
