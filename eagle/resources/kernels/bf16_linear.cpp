// y = x @ w.T for a bf16 weight w (O, I) and fp32 rows x (N, I) -> y (N, O) fp32, on AVX2 + FMA.
//
// For CPUs without bf16 instructions (AVX2, AVX512 without AVX512_BF16), where torch's bf16 Linear
// costs about N times its one-row time: a verify of 8 tree tokens took 4x a decoding step on an AVX2
// EPYC. Here each weight row is read once for up to 8 input rows (a tree verify streams the weights
// once, as a one-token step does) and widened to fp32 in registers (bf16 -> fp32 is a 16-bit shift),
// so the weights stay bf16 in memory. Accumulation is fp32, as in torch's bf16 Linear; every output
// is one row's dot product in a fixed order, whatever N is (a token's logits do not depend on how many
// tokens share the call). Loaded through ctypes by eagle/models/cpukernel.py, which leaves one row to
// torch (as fast there, without the call's overhead).
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline __m256 load_bf16x8(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Output column o for ROWS input rows from n0: ROWS accumulators share each widened weight chunk.
template <int ROWS>
static void dot_rows(const float* x, const uint16_t* w_row, float* y, int64_t I, int64_t O, int64_t n0, int64_t o) {
    __m256 acc[ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) {
        __m256 wv = load_bf16x8(w_row + i);
        for (int r = 0; r < ROWS; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (n0 + r) * I + i), acc[r]);
    }
    for (int r = 0; r < ROWS; r++) {
        float s = horizontal_sum(acc[r]);
        for (int64_t j = i; j < I; j++) s += bf16_to_float(w_row[j]) * x[(n0 + r) * I + j];
        y[(n0 + r) * O + o] = s;
    }
}

static void column(const float* x, const uint16_t* w, float* y, int64_t N, int64_t I, int64_t O, int64_t o) {
    const uint16_t* w_row = w + o * I;
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) dot_rows<8>(x, w_row, y, I, O, n, o);  // further blocks find the row in L1
    switch (N - n) {
        case 7: dot_rows<7>(x, w_row, y, I, O, n, o); break;
        case 6: dot_rows<6>(x, w_row, y, I, O, n, o); break;
        case 5: dot_rows<5>(x, w_row, y, I, O, n, o); break;
        case 4: dot_rows<4>(x, w_row, y, I, O, n, o); break;
        case 3: dot_rows<3>(x, w_row, y, I, O, n, o); break;
        case 2: dot_rows<2>(x, w_row, y, I, O, n, o); break;
        case 1: dot_rows<1>(x, w_row, y, I, O, n, o); break;
    }
}

extern "C" void eagle_bf16_linear(const float* x, const uint16_t* w, float* y, int64_t N, int64_t I, int64_t O,
                                  int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < O; o++) column(x, w, y, N, I, O, o);
}
