// Prefix cache: full KV pages addressed by a chained hash of their token ids.
#pragma once

#include <cstdint>
#include <vector>

#include "page_allocator.h"

namespace sched {

// Open-addressing map from a 64-bit page hash to a page id (linear probing, backward-shift
// erase, no tombstones). Capacity is fixed at >= 2x the page count: there are never more
// entries than pages, so it never rehashes and stays at most half full.
class FlatPageMap {
 public:
  explicit FlatPageMap(int32_t num_pages);
  int32_t find(uint64_t key) const;               // page, or 0 if absent
  bool insert(uint64_t key, int32_t page);        // false if the key is already present
  bool erase(uint64_t key);
  int32_t size() const { return size_; }

 private:
  std::vector<uint64_t> keys_;
  std::vector<int32_t> pages_;  // 0 marks an empty slot (page 0 is never cached)
  uint64_t mask_;
  int32_t size_ = 0;
};

// hash(page i) = H(hash(page i-1), token ids of page i); page -1's hash is root_hash(salt), so
// a salt gives a separate namespace (e.g. per tenant or per LoRA). Only full pages enter the
// cache: a partial page is still being written by its owner.
class PrefixCache {
 public:
  PrefixCache(PageAllocator& alloc, int32_t page_size);

  static uint64_t root_hash(uint64_t salt);
  static uint64_t hash_page(uint64_t prev, const int32_t* tokens, int32_t page_size);

  // Pages for hashes[0..n) whose stored tokens, parent hash and salt match (a 64-bit hash
  // collision must never hand out someone else's KV); stops at the first miss.
  void match(const uint64_t* hashes, int32_t n, const int32_t* tokens, uint64_t salt,
             std::vector<int32_t>& pages) const;
  // Registers a used page under `hash`. False if the hash is taken (another request computed
  // the same page first); the caller's page then stays private and is freed when released.
  bool insert(uint64_t hash, uint64_t prev, uint64_t salt, const int32_t* tokens, int32_t page);
  // The allocator evicted `page`: drop its entry.
  void on_evict(int32_t page);

  int32_t num_entries() const { return map_.size(); }
  int32_t find(uint64_t hash) const { return map_.find(hash); }
  uint64_t page_hash(int32_t page) const { return hash_[page]; }

 private:
  PageAllocator& alloc_;
  int32_t page_size_;
  FlatPageMap map_;
  std::vector<uint64_t> hash_, prev_, salt_;  // per page, valid while the page is cached
  std::vector<int32_t> tokens_;               // per page, page_size token ids
};

}  // namespace sched
