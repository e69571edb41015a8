// philox_groups (philox.hpp): the scalar loop, and on x86-64 an AVX2 version
// chosen at run time.
//
// The AVX2 version keeps eight groups in structure-of-arrays form, one 32-bit
// lane per group and one register per counter word. A round's two 32x32->64
// products per group are formed by vpmuludq on the even lanes and on the odd
// lanes shifted down, then the high and low halves are blended back into
// 32-bit lanes. Integer operations only: the words are bit-identical to the
// scalar philox4x32_10 (tests/core/test_philox.cpp compares them, across the
// 2^32 carry of the group counter and its 2^64 wrap).
#include "core/philox.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FP4LAB_PHILOX_AVX2 1
#endif

namespace fp4lab {

#ifdef FP4LAB_PHILOX_AVX2
namespace {

__attribute__((target("avx2"))) void philox8_avx2(uint64_t seed, uint64_t stream, uint64_t g0, uint32_t* out) {
  const __m256i g0lo = _mm256_set1_epi32(int(uint32_t(g0)));
  const __m256i v0_init = _mm256_add_epi32(g0lo, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // Lanes whose low word wrapped past 2^32 carry 1 into the high word:
  // unsigned (g0lo > g0lo + i), compared as signed after flipping the top bit.
  const __m256i flip = _mm256_set1_epi32(int(0x80000000u));
  const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(g0lo, flip), _mm256_xor_si256(v0_init, flip));  // -1 / 0
  __m256i v0 = v0_init;
  __m256i v1 = _mm256_sub_epi32(_mm256_set1_epi32(int(uint32_t(g0 >> 32))), carry);
  __m256i v2 = _mm256_set1_epi32(int(uint32_t(stream)));
  __m256i v3 = _mm256_set1_epi32(int(uint32_t(stream >> 32)));
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  const __m256i m0 = _mm256_set1_epi32(int(0xD2511F53u)), m1 = _mm256_set1_epi32(int(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    // 64-bit products of the even lanes (pe) and of the odd lanes (po).
    const __m256i pe0 = _mm256_mul_epu32(v0, m0), po0 = _mm256_mul_epu32(_mm256_srli_epi64(v0, 32), m0);
    const __m256i pe1 = _mm256_mul_epu32(v2, m1), po1 = _mm256_mul_epu32(_mm256_srli_epi64(v2, 32), m1);
    const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pe0, 32), po0, 0xAA);
    const __m256i lo0 = _mm256_blend_epi32(pe0, _mm256_slli_epi64(po0, 32), 0xAA);
    const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pe1, 32), po1, 0xAA);
    const __m256i lo1 = _mm256_blend_epi32(pe1, _mm256_slli_epi64(po1, 32), 0xAA);
    const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, v1), _mm256_set1_epi32(int(k0)));
    const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, v3), _mm256_set1_epi32(int(k1)));
    v0 = n0;
    v1 = lo1;
    v2 = n2;
    v3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // 4 x 8 (word, group) -> 8 x 4 (group, word).
  const __m256i t0 = _mm256_unpacklo_epi32(v0, v1), t1 = _mm256_unpackhi_epi32(v0, v1);
  const __m256i t2 = _mm256_unpacklo_epi32(v2, v3), t3 = _mm256_unpackhi_epi32(v2, v3);
  const __m256i a0 = _mm256_unpacklo_epi64(t0, t2), a1 = _mm256_unpackhi_epi64(t0, t2);  // groups 0, 1 | 4, 5
  const __m256i a2 = _mm256_unpacklo_epi64(t1, t3), a3 = _mm256_unpackhi_epi64(t1, t3);  // groups 2, 3 | 6, 7
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 0), _mm256_permute2x128_si256(a0, a1, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm256_permute2x128_si256(a2, a3, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute2x128_si256(a0, a1, 0x31));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 24), _mm256_permute2x128_si256(a2, a3, 0x31));
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

}  // namespace
#endif

void philox_groups(uint64_t seed, uint64_t stream, uint64_t g0, uint64_t count, uint32_t* out) {
  uint64_t g = 0;
#ifdef FP4LAB_PHILOX_AVX2
  if (cpu_has_avx2())
    for (; g + 8 <= count; g += 8) philox8_avx2(seed, stream, g0 + g, out + 4 * g);
#endif
  philox_groups_scalar(seed, stream, g0 + g, count - g, out + 4 * g);
}

const char* philox_groups_path() {
#ifdef FP4LAB_PHILOX_AVX2
  if (cpu_has_avx2()) return "avx2";
#endif
  return "scalar";
}

}  // namespace fp4lab
