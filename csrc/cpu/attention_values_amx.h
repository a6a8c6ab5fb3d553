// small_batch_attention's value sums on AMX tiles (the avx512 build; included by cpu/vec.cpp
// inside its instruction-set namespace, next to attention_scores_amx, and run where the
// scores ran on tiles: the caller has checked amx_available(), bf16, D a multiple of 32 up
// to 128).
//
// acc[r][d] = sum of p_rj v_j[d] over row r's visible keys j, in key order: the row's list.
// The list's first 32 * floor(len / 32) keys go by TDPBF16PS, 32 keys (16 pairs) a product:
// A = the row's weights rounded to bf16 (nearest even), B = the 32 keys' values re-laid in
// pairs (VNNI), C = 16 float32 columns of the row's sums; the list's last len % 32 keys then
// by float32 FMAs (the weight unrounded), one chain per column, in order. What a row gets
// depends on its own list alone: a tile product's row depends on its A row and B only, the
// chunks follow the list, and a hidden key is not in it (nor is its value read). So the
// row's bits do not depend on the rows beside it, on M, on the thread split or on where
// hidden keys sit: the same batch invariance as the vector path, with other bits (bf16
// weights, each chunk summed in the tile's own order, denormals flushed).
//
// Sharing: the keys every row of the block sees, up to the first key that only some rows
// see (S), start every row's list, so the chunks within S are one product for all the
// block's rows (B packed once). A chunk that runs past S is the row's own: packed for that
// row and multiplied alone. In decoding, verification and a causal prefill only the last
// few keys of a block are partly visible, so that is at most one chunk a row, and rarely.
//
// Bytes and work: the values of the keys some row sees are read once per block and written
// once re-laid (2 * 2 * n * D bytes, in L1/L2), the weights once; one TDPBF16PS per 32 keys
// and 16 columns for up to 16 rows, against 32 FMAs a row on the vector path. A 16-row
// verification block of 12 query rows over 2,000 keys: ~4 products and ~200 shuffles per
// 32 keys against ~1,500 FMAs.
//
// Included inside a namespace: its headers (immintrin.h, <algorithm>, <cstring>, <vector>,
// cpu/amx_tile_config.h, cpu/isa.h) are vec.cpp's, included at its top.
#pragma once

#define DOMINO_AMX_VALUES_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

namespace attention_values_amx_detail {

constexpr int64_t kChunkKeys = 32;  // keys (16 pairs) per tile product
constexpr int kMaxColumnTiles = 4;  // C tiles 0-3: 64 columns per pass over the chunks

// B tiles of one chunk for the columns [g0, g0 + 16 T) (T even), 32 columns from each pair
// of tiles: row k of tile 2u holds the words (v_{2k}[d] | v_{2k+1}[d] << 16) for d - g0 - 32 u
// in {0-3, 8-11, 16-19, 24-27}, of tile 2u + 1 for d - g0 - 32 u in {4-7, 12-15, 20-23,
// 28-31}, as VPUNPCKLWD / VPUNPCKHWD interleave within 128-bit lanes (two shuffles a key; in
// natural order it took eight widenings). The C tiles' columns follow the same order:
// unpermute_sums puts a row's sums back in order of d.
DOMINO_AMX_VALUES_TARGET inline void pack_values(const uint16_t* const* rows, int64_t g0, int T, uint32_t* b) {
  for (int k = 0; k < 16; ++k) {
    const uint16_t* v0 = rows[2 * k] + g0;
    const uint16_t* v1 = rows[2 * k + 1] + g0;
    for (int u = 0; 2 * u < T; ++u) {
      const __m512i x0 = _mm512_loadu_si512(v0 + 32 * u), x1 = _mm512_loadu_si512(v1 + 32 * u);
      _mm512_store_si512(b + (2 * u * 16 + k) * 16, _mm512_unpacklo_epi16(x0, x1));
      _mm512_store_si512(b + ((2 * u + 1) * 16 + k) * 16, _mm512_unpackhi_epi16(x0, x1));
    }
  }
}

// A row's sums from the C tiles' column order (pack_values) back to the order of d, in place:
// tiles 2u, 2u + 1 hold d = 32 u + {0-3, 8-11, 16-19, 24-27} and {4-7, 12-15, 20-23, 28-31}.
DOMINO_AMX_VALUES_TARGET inline void unpermute_sums(float* row, int64_t D) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t d = 0; d < D; d += 32) {
    const __m512 lo = _mm512_loadu_ps(row + d), hi = _mm512_loadu_ps(row + d + 16);
    _mm512_storeu_ps(row + d, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(row + d + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

// One A row: the weights p[keys[i]] (or p[first + i] when keys is null), i < 32, in bf16.
DOMINO_AMX_VALUES_TARGET inline void pack_weights(const float* p, const int32_t* keys, int64_t first, uint16_t* a) {
  __m512 lo, hi;
  if (keys == nullptr) {
    lo = _mm512_loadu_ps(p + first);
    hi = _mm512_loadu_ps(p + first + 16);
  } else {
    lo = _mm512_i32gather_ps(_mm512_loadu_si512(keys), p, 4);
    hi = _mm512_i32gather_ps(_mm512_loadu_si512(keys + 16), p, 4);
  }
  _mm512_storeu_si512(a, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// GCC's tile loads are volatile asm with the address as an input and no memory operand:
// this barrier (no instruction) keeps the packed buffers' stores before the loads that read
// them.
inline void stores_before_tile_loads() { asm volatile("" ::: "memory"); }

// C tiles 0..T-1 += A (tile 4) x the chunk's B tiles (packed at b, loaded into 5 and 6 by
// turns). Tile numbers are literals in GCC's intrinsics, hence the unrolled branches.
DOMINO_AMX_VALUES_TARGET inline void multiply_chunk(const uint32_t* b, int T) {
  _tile_loadd(5, b, 64);
  _tile_dpbf16ps(0, 4, 5);
  if (T > 1) {
    _tile_loadd(6, b + 256, 64);
    _tile_dpbf16ps(1, 4, 6);
  }
  if (T > 2) {
    _tile_loadd(5, b + 512, 64);
    _tile_dpbf16ps(2, 4, 5);
  }
  if (T > 3) {
    _tile_loadd(6, b + 768, 64);
    _tile_dpbf16ps(3, 4, 6);
  }
}

DOMINO_AMX_VALUES_TARGET inline void load_sums(const float* c, int64_t ldc_bytes, int T) {
  _tile_loadd(0, c, ldc_bytes);
  if (T > 1) _tile_loadd(1, c + 16, ldc_bytes);
  if (T > 2) _tile_loadd(2, c + 32, ldc_bytes);
  if (T > 3) _tile_loadd(3, c + 48, ldc_bytes);
}

DOMINO_AMX_VALUES_TARGET inline void store_sums(float* c, int64_t ldc_bytes, int T) {
  _tile_stored(0, c, ldc_bytes);
  if (T > 1) _tile_stored(1, c + 16, ldc_bytes);
  if (T > 2) _tile_stored(2, c + 32, ldc_bytes);
  if (T > 3) _tile_stored(3, c + 48, ldc_bytes);
}

// A row's last keys [i0, len) of its list (key(r, i) the i-th) by float32 FMAs into its
// sums (V 16-lane vectors, D = 16 V, in order of d): each lane one chain over the keys in
// order, acc = fma(p_j, v_j[d], acc), the sums held in registers from the first key to the
// last (through memory, each key's FMAs waited on the previous key's stores: ~40 % of the
// value sums of a 16-row verification over 126 keys). The same operations in the same
// order as one FMA per key and element from memory: the same bits.
template <int V, class Key>
DOMINO_AMX_VALUES_TARGET inline void fma_tail(const float* p, const Key& key, int64_t r, int64_t i0, int64_t len,
                                              const uint16_t* v, int64_t vs, float* sums) {
  if (i0 >= len) return;
  __m512 s[V];
  for (int u = 0; u < V; ++u) s[u] = _mm512_loadu_ps(sums + 16 * u);
  for (int64_t i = i0; i < len; ++i) {
    const int64_t j = key(r, i);
    const __m512 w = _mm512_set1_ps(p[j]);
    for (int u = 0; u < V; ++u) s[u] = _mm512_fmadd_ps(w, loadu(v + j * vs + 16 * u), s[u]);  // vec.h's bf16 widening
  }
  for (int u = 0; u < V; ++u) _mm512_storeu_ps(sums + 16 * u, s[u]);
}

}  // namespace attention_values_amx_detail

// acc[r * lda + d] (zeroed by the caller) = row r's value sums, r < nq, d < D, from the
// weights p (rows lds apart, keys [0, n) of the block), vis [nq][n] (which keys each row
// sees) and key_class [n], over bf16 values v (key rows vs elements apart).
DOMINO_AMX_VALUES_TARGET void attention_values_amx(const float* p, int64_t lds, const uint8_t* vis,
                                                   const uint8_t* key_class, int64_t nq, int64_t n,
                                                   const uint16_t* v, int64_t vs, int64_t D, float* acc,
                                                   int64_t lda) {
  using namespace attention_values_amx_detail;
  thread_local std::vector<int32_t> shared_buf, own_buf;
  thread_local std::vector<int64_t> own_count_buf;
  // S: the keys every row sees before the first that only some do (hidden ones skipped);
  // without a hidden key among them (no padding or holes) they are [0, first_mixed) and
  // need no list (the scans are memchr's vector loops)
  const void* mixed = std::memchr(key_class, kKeyMixed, n);
  const int64_t first_mixed = mixed ? static_cast<const uint8_t*>(mixed) - key_class : n;
  const int64_t tail_keys = n - first_mixed;
  const bool contiguous = std::memchr(key_class, kKeyHidden, first_mixed) == nullptr;  // S = [0, first_mixed)
  shared_buf.resize(contiguous ? 0 : first_mixed);
  own_buf.resize(nq * tail_keys);
  own_count_buf.resize(nq);
  // plain pointers: each use of a thread_local is a TLS lookup
  int32_t* shared = shared_buf.data();
  int32_t* own = own_buf.data();
  int64_t* own_count = own_count_buf.data();
  int64_t ns = contiguous ? first_mixed : 0;
  if (!contiguous)
    for (int64_t j = 0; j < first_mixed; ++j)
      if (key_class[j] == kKeyVisible) shared[ns++] = static_cast<int32_t>(j);
  // each row's own keys: those it sees from the first partly visible key on
  for (int64_t r = 0; r < nq; ++r) {
    int64_t c = 0;
    for (int64_t j = first_mixed; j < n; ++j)
      if (vis[r * n + j]) own[r * tail_keys + c++] = static_cast<int32_t>(j);
    own_count[r] = c;
  }
  auto key = [&](int64_t r, int64_t i) {
    return static_cast<int32_t>(i < ns ? (contiguous ? i : shared[i]) : own[r * tail_keys + (i - ns)]);
  };

  alignas(64) uint32_t b[kMaxColumnTiles * 16 * 16];  // one chunk's B tiles
  alignas(64) uint16_t a[16 * kChunkKeys];           // A: up to 16 rows of 32 weights
  alignas(64) float c_row[16 * 16 * kMaxColumnTiles];  // one row's sums through a C tile (row 0)
  alignas(64) int32_t keys[kChunkKeys];
  const uint16_t* rows[kChunkKeys];
  const int64_t shared_chunks = ns / kChunkKeys;
  for (int64_t r0 = 0; r0 < nq; r0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, nq - r0));
    AmxTileConfig cfg;
    for (int t = 0; t < 5; ++t) cfg.rows[t] = static_cast<uint8_t>(nr), cfg.colsb[t] = 64;  // C 0-3, A 4
    for (int t = 5; t < 7; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;                         // B 5, 6
    _tile_loadconfig(&cfg);
    for (int64_t g0 = 0; g0 < D; g0 += 16 * kMaxColumnTiles) {
      const int T = static_cast<int>(std::min<int64_t>(kMaxColumnTiles, (D - g0) / 16));
      float* block_acc = acc + r0 * lda + g0;
      const int64_t ld_bytes = lda * static_cast<int64_t>(sizeof(float));
      // the chunks within S: every row of the block, the sums staying in the C tiles
      if (shared_chunks > 0) {
        stores_before_tile_loads();  // acc: zeroed by the caller, or the previous pass's sums
        load_sums(block_acc, ld_bytes, T);
        for (int64_t c = 0; c < shared_chunks; ++c) {
          const int32_t* ck = contiguous ? nullptr : shared + c * kChunkKeys;  // null: keys c * 32 on
          for (int64_t i = 0; i < kChunkKeys; ++i) rows[i] = v + (ck ? ck[i] : c * kChunkKeys + i) * vs;
          pack_values(rows, g0, T, b);
          for (int i = 0; i < nr; ++i) pack_weights(p + (r0 + i) * lds, ck, c * kChunkKeys, a + i * kChunkKeys);
          stores_before_tile_loads();
          _tile_loadd(4, a, 64);
          multiply_chunk(b, T);
        }
        store_sums(block_acc, ld_bytes, T);
      }
      // the chunks past S: row by row (the row in tile row 0; the other rows' products are
      // discarded)
      for (int i = 0; i < nr; ++i) {
        const int64_t r = r0 + i, chunks = (ns + own_count[r]) / kChunkKeys;
        for (int64_t c = shared_chunks; c < chunks; ++c) {
          for (int64_t k = 0; k < kChunkKeys; ++k) {
            keys[k] = key(r, c * kChunkKeys + k);
            rows[k] = v + keys[k] * vs;
          }
          pack_values(rows, g0, T, b);
          pack_weights(p + r * lds, keys, 0, a);
          for (int t = 0; t < T; ++t) std::memcpy(c_row + 16 * t, acc + r * lda + g0 + 16 * t, 64);
          stores_before_tile_loads();
          load_sums(c_row, 64 * kMaxColumnTiles, T);
          _tile_loadd(4, a, 64);
          multiply_chunk(b, T);
          store_sums(c_row, 64 * kMaxColumnTiles, T);
          for (int t = 0; t < T; ++t) std::memcpy(acc + r * lda + g0 + 16 * t, c_row + 16 * t, 64);
        }
      }
    }
    _tile_release();
  }
  // each row's last len % 32 keys: float32 FMAs with the unrounded weight, in list order
  for (int64_t r = 0; r < nq; ++r) {
    unpermute_sums(acc + r * lda, D);
    const int64_t len = ns + own_count[r];
    const int64_t i0 = len / kChunkKeys * kChunkKeys;
    auto tail = [&](auto vectors) { fma_tail<decltype(vectors)::value>(p + r * lds, key, r, i0, len, v, vs, acc + r * lda); };
    switch (D / 16) {  // D: 32, 64, 96 or 128 (the caller's check)
      case 2: tail(std::integral_constant<int, 2>{}); break;
      case 4: tail(std::integral_constant<int, 4>{}); break;
      case 6: tail(std::integral_constant<int, 6>{}); break;
      default: tail(std::integral_constant<int, 8>{}); break;
    }
  }
}

#undef DOMINO_AMX_VALUES_TARGET
