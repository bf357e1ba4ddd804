#include "prefix_cache.h"

#include <algorithm>
#include <cstring>

namespace sched {
namespace {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

FlatPageMap::FlatPageMap(int32_t num_pages) {
  uint64_t cap = 16;
  while (cap < 2 * static_cast<uint64_t>(num_pages)) cap <<= 1;
  keys_.assign(cap, 0);
  pages_.assign(cap, 0);
  mask_ = cap - 1;
}

int32_t FlatPageMap::find(uint64_t key) const {
  for (uint64_t i = key & mask_;; i = (i + 1) & mask_) {
    if (pages_[i] == 0) return 0;
    if (keys_[i] == key) return pages_[i];
  }
}

bool FlatPageMap::insert(uint64_t key, int32_t page) {
  uint64_t i = key & mask_;
  for (; pages_[i] != 0; i = (i + 1) & mask_) {
    if (keys_[i] == key) return false;
  }
  keys_[i] = key;
  pages_[i] = page;
  ++size_;
  return true;
}

bool FlatPageMap::erase(uint64_t key) {
  uint64_t i = key & mask_;
  for (; keys_[i] != key || pages_[i] == 0; i = (i + 1) & mask_) {
    if (pages_[i] == 0) return false;
  }
  // Backward shift: pull later entries of the probe run into the hole unless their home slot
  // lies cyclically in (hole, j], where moving them would put them before their home.
  for (uint64_t j = (i + 1) & mask_; pages_[j] != 0; j = (j + 1) & mask_) {
    uint64_t home = keys_[j] & mask_;
    bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    keys_[i] = keys_[j];
    pages_[i] = pages_[j];
    i = j;
  }
  pages_[i] = 0;
  --size_;
  return true;
}

PrefixCache::PrefixCache(PageAllocator& alloc, int32_t page_size)
    : alloc_(alloc),
      page_size_(page_size),
      map_(alloc.num_pages()),
      hash_(alloc.num_pages(), 0),
      prev_(alloc.num_pages(), 0),
      salt_(alloc.num_pages(), 0),
      tokens_(static_cast<size_t>(alloc.num_pages()) * page_size, 0) {}

uint64_t PrefixCache::root_hash(uint64_t salt) { return mix64(salt ^ 0x6a09e667f3bcc908ULL); }

uint64_t PrefixCache::hash_page(uint64_t prev, const int32_t* tokens, int32_t page_size) {
  uint64_t h = mix64(prev);
  for (int32_t i = 0; i < page_size; ++i) {
    h = (h ^ static_cast<uint32_t>(tokens[i])) * 0x100000001b3ULL;  // FNV-1a step per token
  }
  return mix64(h);
}

void PrefixCache::match(const uint64_t* hashes, int32_t n, const int32_t* tokens, uint64_t salt,
                        std::vector<int32_t>& pages) const {
  uint64_t prev = root_hash(salt);
  const size_t bytes = sizeof(int32_t) * page_size_;
  for (int32_t i = 0; i < n; ++i) {
    int32_t page = map_.find(hashes[i]);
    if (page == 0 || prev_[page] != prev || salt_[page] != salt ||
        std::memcmp(&tokens_[static_cast<size_t>(page) * page_size_],
                    tokens + static_cast<size_t>(i) * page_size_, bytes) != 0) {
      return;
    }
    pages.push_back(page);
    prev = hashes[i];
  }
}

bool PrefixCache::insert(uint64_t hash, uint64_t prev, uint64_t salt, const int32_t* tokens,
                         int32_t page) {
  if (alloc_.is_cached(page) || !map_.insert(hash, page)) return false;
  hash_[page] = hash;
  prev_[page] = prev;
  salt_[page] = salt;
  std::copy(tokens, tokens + page_size_, &tokens_[static_cast<size_t>(page) * page_size_]);
  alloc_.set_cached(page, true);
  return true;
}

void PrefixCache::on_evict(int32_t page) { map_.erase(hash_[page]); }

}  // namespace sched
