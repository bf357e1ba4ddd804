#include <random>
#include <unordered_map>

#include "harness.h"
#include "prefix_cache.h"

using sched::FlatPageMap;
using sched::PageAllocator;
using sched::PageList;
using sched::PrefixCache;

TEST(flat_map_matches_unordered_map_under_collisions) {
  FlatPageMap map(64);  // 128 slots
  std::unordered_map<uint64_t, int32_t> ref;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    // Keys share their low bits (same home slot) often, to exercise backward-shift erase.
    uint64_t key = (rng() % 24) * 128 + (rng() % 3);
    if (rng() % 2 && ref.size() < 64) {
      int32_t page = 1 + static_cast<int32_t>(rng() % 1000);
      bool fresh = ref.emplace(key, page).second;
      CHECK(map.insert(key, page) == fresh);
    } else {
      CHECK(map.erase(key) == (ref.erase(key) == 1));
    }
    if (step % 97 == 0) {
      for (auto [k, p] : ref) CHECK(map.find(k) == p);
      CHECK(map.size() == static_cast<int32_t>(ref.size()));
    }
  }
}

struct Fixture {
  PageAllocator alloc{16};
  PrefixCache cache{alloc, 4};
  Fixture() {
    alloc.set_evict_callback([this](int32_t p) { cache.on_evict(p); });
  }
};

// Registers `tokens` (whole pages) as a chain under salt; returns the pages (still referenced).
static PageList register_chain(Fixture& f, const std::vector<int32_t>& tokens, uint64_t salt,
                               std::vector<uint64_t>& hashes) {
  PageList pages(&f.alloc);
  pages.grow(static_cast<int32_t>(tokens.size() / 4));
  uint64_t prev = PrefixCache::root_hash(salt);
  for (int32_t k = 0; k < pages.size(); ++k) {
    uint64_t h = PrefixCache::hash_page(prev, &tokens[k * 4], 4);
    CHECK(f.cache.insert(h, prev, salt, &tokens[k * 4], pages.pages()[k]));
    hashes.push_back(h);
    prev = h;
  }
  return pages;
}

TEST(match_walks_the_chain_and_stops_at_first_miss) {
  Fixture f;
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<uint64_t> hashes;
  PageList owner = register_chain(f, tokens, 0, hashes);
  std::vector<int32_t> hits;
  f.cache.match(hashes.data(), 3, tokens.data(), 0, hits);
  CHECK(hits == owner.pages());
  // Same first page, different second page: one hit.
  std::vector<int32_t> other = {1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12};
  std::vector<uint64_t> other_hashes;
  uint64_t prev = PrefixCache::root_hash(0);
  for (int k = 0; k < 3; ++k) other_hashes.push_back(prev = PrefixCache::hash_page(prev, &other[k * 4], 4));
  hits.clear();
  f.cache.match(other_hashes.data(), 3, other.data(), 0, hits);
  CHECK(hits.size() == 1 && hits[0] == owner.pages()[0]);
  // Another salt is another namespace.
  hits.clear();
  f.cache.match(hashes.data(), 3, tokens.data(), 1, hits);
  CHECK(hits.empty());
}

TEST(hash_collision_is_caught_by_the_token_check) {
  Fixture f;
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  std::vector<uint64_t> hashes;
  PageList owner = register_chain(f, tokens, 0, hashes);
  // A different page that (by construction here) presents the same hash must not hit.
  std::vector<int32_t> impostor = {9, 9, 9, 9};
  std::vector<int32_t> hits;
  f.cache.match(hashes.data(), 1, impostor.data(), 0, hits);
  CHECK(hits.empty());
  // Inserting under a taken hash is refused; the second page stays private.
  PageList second(&f.alloc);
  second.grow(1);
  CHECK(!f.cache.insert(hashes[0], PrefixCache::root_hash(0), 0, impostor.data(), second.pages()[0]));
  CHECK(!f.alloc.is_cached(second.pages()[0]) && f.cache.num_entries() == 1);
}

TEST(eviction_drops_the_entry) {
  Fixture f;
  std::vector<int32_t> tokens(15 * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  std::vector<uint64_t> hashes;
  { PageList owner = register_chain(f, tokens, 0, hashes); }  // all 15 pages cached, unreferenced
  CHECK(f.cache.num_entries() == 15 && f.alloc.num_evictable() == 15);
  PageList taker(&f.alloc);
  CHECK(taker.grow(2));  // evicts the two least recently released: the chain's tail
  CHECK(f.cache.num_entries() == 13 && f.alloc.evictions() == 2);
  std::vector<int32_t> hits;
  f.cache.match(hashes.data(), 15, tokens.data(), 0, hits);
  CHECK(hits.size() == 13);  // the head of the chain survived
}

HARNESS_MAIN
