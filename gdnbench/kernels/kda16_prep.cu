// KDA's 16-token prepare kernel in CUDA C++: the outputs of kernels/kda16.py's kda16_prep_kernel (see there and
// kernels/kda16_cuda.py for the contract), for bf16 q, k, beta, fp32 g and K = 128.  Compiled with NVRTC at first
// use; NORM_Q / NORM_K (q's / k's rows normalized here) and VARLEN are set by -D.
//
// A block is four warps, one 16-token tile each: one 64-token chunk of one value head; grid (chunks, B * HV).
// Per warp, two layouts:
//   phase 1, lane L owns channels 4L .. 4L + 3 of all 16 rows: g's rows arrive by cp.async in a swizzled shared
//     tile and the cumsum down the rows runs in-thread, in place (no shuffles);
//   phase 2, the mma.sync fragment layout: thread (gid, tig) = (lane / 4, lane % 4) owns rows gid and gid + 8 and
//     channels 32 sl + 8 tig .. + 7 of each 32-channel slice sl, so a row's four lanes load and store 64 contiguous
//     bytes (whole sectors).  A k-step 4 sl + e of the m16n8k8 tf32 products takes k-index tig <-> channel
//     32 sl + 8 tig + 2 e and tig + 4 <-> the next channel, in A and B alike: the grams need no data exchange.
// The rows' sums of squares (NORM_Q, NORM_K) are the diagonal of x x^T on the tensor cores (bf16 products are
// exact in fp32).  (I + L)^-1 comes from forward substitution in fp32, one column a lane.
#ifndef NORM_Q
#define NORM_Q 0
#endif
#ifndef NORM_K
#define NORM_K 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif

typedef unsigned short bf16_t;
typedef unsigned int u32;

static __device__ __forceinline__ float bf_lo(u32 x) { return __uint_as_float(x << 16); }
static __device__ __forceinline__ float bf_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }
static __device__ __forceinline__ u32 pack_bf2(float lo, float hi) {  // round to nearest even, lo first in memory
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
static __device__ __forceinline__ float ex2(float x) {  // as Triton's exp2
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
static __device__ __forceinline__ u32 tf32(float x) {  // to nearest, as kda16.py's _tf32
  u32 r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
static __device__ __forceinline__ void mma_tf32(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void mma_bf16(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// [16][128] fp32 tile, 16-byte chunk ch of row r at chunk ch ^ (((ch >> 3) + (r & 1)) & 7): phase 1's row-wise
// writes and phase 2's reads (8 lanes: two rows, four tig) each hit eight distinct bank groups
static __device__ __forceinline__ int swz(int r, int ch) { return r * 32 + (ch ^ (((ch >> 3) + (r & 1)) & 7)); }

static __device__ __forceinline__ void load_rows(const bf16_t* __restrict__ x, long long pa, long long pb, bool va,
                                                 bool vb, uint4* xa, uint4* xb) {
  const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    xa[j] = va ? __ldg(reinterpret_cast<const uint4*>(x + pa + 32 * j)) : z;
    xb[j] = vb ? __ldg(reinterpret_cast<const uint4*>(x + pb + 32 * j)) : z;
  }
}

// rows gid, gid + 8's sums of squares: diag(x x^T) by m16n8k16 bf16 products whose k-pairs are the thread's words
static __device__ __forceinline__ void row_ssq(const uint4* xa, const uint4* xb, int lane, float& sa, float& sb) {
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    mma_bf16(d0, xa[j].x, xb[j].x, xa[j].y, xb[j].y, xa[j].x, xa[j].y);
    mma_bf16(d1, xa[j].x, xb[j].x, xa[j].y, xb[j].y, xb[j].x, xb[j].y);
    mma_bf16(d0, xa[j].z, xb[j].z, xa[j].w, xb[j].w, xa[j].z, xa[j].w);
    mma_bf16(d1, xa[j].z, xb[j].z, xa[j].w, xb[j].w, xb[j].z, xb[j].w);
  }
  const int gid = lane >> 2, src = (lane & ~3) | (gid >> 1);  // the lane holding (gid, gid), (gid + 8, gid + 8)
  sa = __shfl_sync(0xffffffffu, (gid & 1) ? d0[1] : d0[0], src);
  sb = __shfl_sync(0xffffffffu, (gid & 1) ? d1[3] : d1[2], src);
}

constexpr int K = 128;  // channels of q and k (kda16_cuda.applies)
constexpr float LOG2E = 1.4426950408889634f;

extern "C" __global__ void __launch_bounds__(128) kda16_prep_cuda(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const float* __restrict__ g,
    const bf16_t* __restrict__ beta, bf16_t* __restrict__ qd, bf16_t* __restrict__ kd, bf16_t* __restrict__ kr,
    bf16_t* __restrict__ inv, bf16_t* __restrict__ mqk, float* __restrict__ dec,
    const long long* __restrict__ cu_seqlens, const int* __restrict__ chunk_indices, int T, int NT, double scale_d,
    int H, int HV) {
  __shared__ __align__(16) float s_c[4][16 * K];  // per warp: the gates' cumsum c (log2 units); later L and X
  __shared__ __align__(16) float s_dl[4][K];      // per warp: 2^c_last per channel
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i_c = blockIdx.x, i_bh = blockIdx.y;
  const int i_b = i_bh / HV, i_hv = i_bh % HV, i_h = i_hv / (HV / H);
  long long tok0, i_g;
  int n_valid;
#if VARLEN
  {
    const long long i_n = chunk_indices[2 * i_c], i_t = chunk_indices[2 * i_c + 1];
    const long long bos = cu_seqlens[i_n], seq_len = cu_seqlens[i_n + 1] - bos;
    tok0 = bos + i_t * 64;
    n_valid = (int)(seq_len - i_t * 64);
    i_g = i_c;
  }
#else
  tok0 = (long long)i_b * T + (long long)i_c * 64;
  n_valid = T - i_c * 64;
  i_g = (long long)i_b * NT + i_c;
#endif
  const long long t0 = tok0 + warp * 16;
  const int n = n_valid - warp * 16;  // valid rows of this tile (rows past it load zeros and store nothing)
  const long long slot = (i_g * 4 + warp) * HV + i_hv;
  float* sc = s_c[warp];
  float* sdl = s_dl[warp];

  // g's rows to shared memory, asynchronously (rows past the tile zero-filled)
  {
    const float* gp = g + (t0 * HV + i_hv) * K + 4 * lane;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float* src = r < n ? gp + (long long)r * HV * K : g;
      u32 dst;
      asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(dst) : "l"(sc + 4 * swz(r, lane)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(r < n ? 16 : 0) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  // q's and k's rows in phase 2's layout, in flight beside g's copies
  const int gid = lane >> 2, tig = lane & 3;
  const int ra = gid, rb = gid + 8;
  const bool va = ra < n, vb = rb < n;
  const long long pa = (t0 + ra) * H * K + i_h * K + 8 * tig, pb = (t0 + rb) * H * K + i_h * K + 8 * tig;
  uint4 qa[4], qb[4], ka[4], kb[4];  // 8 bf16 of each 32-channel slice of rows ra, rb
  load_rows(q, pa, pb, va, vb, qa, qb);
  load_rows(k, pa, pb, va, vb, ka, kb);
  const float beta_a = va ? bf_lo(beta[(t0 + ra) * HV + i_hv]) : 0.f;
  const float beta_b = vb ? bf_lo(beta[(t0 + rb) * HV + i_hv]) : 0.f;

  // ---- phase 1: c = cumsum(g) log2(e) down the rows, in place; each lane reads back only its own copies
  {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float4* p = reinterpret_cast<float4*>(sc + 4 * swz(r, lane));
      const float4 v = *p;
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
      const float4 c = make_float4(s.x * LOG2E, s.y * LOG2E, s.z * LOG2E, s.w * LOG2E);
      *p = c;
      if (r == 15) {  // rows past the tile add g = 0: row 15 holds c_last
        const float4 dl = make_float4(ex2(c.x), ex2(c.y), ex2(c.z), ex2(c.w));
        *reinterpret_cast<float4*>(sdl + 4 * (lane ^ ((lane >> 3) & 7))) = dl;
        *reinterpret_cast<float4*>(dec + slot * K + 4 * lane) = dl;
      }
    }
  }
  __syncwarp();

  // ---- phase 2.  Every q and k word is waited for here, before the first store: without it the flag form, whose
  // first uses of them spread over the slices, ran 10-11 % slower at kda-legacy6's dense keys (H100, the kernel
  // alone: 412.1 -> 369.2 us at h64_fixed, 633.6 -> 561.4 at h96_fixed; h96_mixed 591.2 -> 592.3)
  u32 all_in = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    all_in ^= qa[j].x ^ qa[j].y ^ qa[j].z ^ qa[j].w ^ qb[j].x ^ qb[j].y ^ qb[j].z ^ qb[j].w ^ ka[j].x ^ ka[j].y ^
              ka[j].z ^ ka[j].w ^ kb[j].x ^ kb[j].y ^ kb[j].z ^ kb[j].w;
  all_in &= (u32)(T >> 31);  // 0 (T >= 0), which the compiler cannot see
  const float scale = __uint_as_float(__float_as_uint((float)scale_d) | all_in);
  float rq_a = scale, rq_b = scale, rk_a = 1.f, rk_b = 1.f;  // q_d's row scale; k's row norm
#if NORM_Q
  {
    float sa, sb;
    row_ssq(qa, qb, lane, sa, sb);
    rq_a = scale * rsqrtf(sa + 1e-6f);
    rq_b = scale * rsqrtf(sb + 1e-6f);
  }
#endif
#if NORM_K
  {
    float sa, sb;
    row_ssq(ka, kb, lane, sa, sb);
    rk_a = rsqrtf(sa + 1e-6f);
    rk_b = rsqrtf(sb + 1e-6f);
  }
#endif

  float al0[4] = {0.f, 0.f, 0.f, 0.f}, al1[4] = {0.f, 0.f, 0.f, 0.f};  // k_d k_i^T, columns 0-7 / 8-15
  float am0[4] = {0.f, 0.f, 0.f, 0.f}, am1[4] = {0.f, 0.f, 0.f, 0.f};  // q_d k_i^T
  const long long oa = (t0 + ra) * HV * K + i_hv * K + 8 * tig, ob = (t0 + rb) * HV * K + i_hv * K + 8 * tig;
#pragma unroll
  for (int sl = 0; sl < 4; ++sl) {
    const int ch = 8 * sl + 2 * tig;  // the 16-byte chunk of the thread's first 4 channels in this slice
    float ca[8], cb[8], dl[8];
    *reinterpret_cast<float4*>(ca) = *reinterpret_cast<const float4*>(sc + 4 * swz(ra, ch));
    *reinterpret_cast<float4*>(ca + 4) = *reinterpret_cast<const float4*>(sc + 4 * swz(ra, ch + 1));
    *reinterpret_cast<float4*>(cb) = *reinterpret_cast<const float4*>(sc + 4 * swz(rb, ch));
    *reinterpret_cast<float4*>(cb + 4) = *reinterpret_cast<const float4*>(sc + 4 * swz(rb, ch + 1));
    *reinterpret_cast<float4*>(dl) = *reinterpret_cast<const float4*>(sdl + 4 * (ch ^ ((ch >> 3) & 7)));
    *reinterpret_cast<float4*>(dl + 4) = *reinterpret_cast<const float4*>(sdl + 4 * ((ch + 1) ^ (((ch + 1) >> 3) & 7)));
    const u32 wqa[4] = {qa[sl].x, qa[sl].y, qa[sl].z, qa[sl].w}, wqb[4] = {qb[sl].x, qb[sl].y, qb[sl].z, qb[sl].w};
    const u32 wka[4] = {ka[sl].x, ka[sl].y, ka[sl].z, ka[sl].w}, wkb[4] = {kb[sl].x, kb[sl].y, kb[sl].z, kb[sl].w};
    u32 oqa[4], oqb[4], oka[4], okb[4], ora[4], orb[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // k-step 4 sl + e: the slice's channels 2e, 2e + 1
      float kd_[4], ki_[4], qe_[4];  // (row a, ch0), (row b, ch0), (a, ch1), (b, ch1): the A fragment's order
      const float kv[4] = {bf_lo(wka[e]) * rk_a, bf_lo(wkb[e]) * rk_b, bf_hi(wka[e]) * rk_a, bf_hi(wkb[e]) * rk_b};
      const float qv[4] = {bf_lo(wqa[e]), bf_lo(wqb[e]), bf_hi(wqa[e]), bf_hi(wqb[e])};
      const float cv[4] = {ca[2 * e], cb[2 * e], ca[2 * e + 1], cb[2 * e + 1]};
      const float rq[4] = {rq_a, rq_b, rq_a, rq_b};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float ee = ex2(cv[i]);
        kd_[i] = kv[i] * ee;          // k 2^c
        ki_[i] = kv[i] * ex2(-cv[i]);  // k 2^-c
        qe_[i] = qv[i] * ee * rq[i];  // scale q 2^c (times q's rstd)
      }
      const u32 A0 = tf32(kd_[0]), A1 = tf32(kd_[1]), A2 = tf32(kd_[2]), A3 = tf32(kd_[3]);
      const u32 Q0 = tf32(qe_[0]), Q1 = tf32(qe_[1]), Q2 = tf32(qe_[2]), Q3 = tf32(qe_[3]);
      const u32 Ba0 = tf32(ki_[0]), Ba1 = tf32(ki_[2]), Bb0 = tf32(ki_[1]), Bb1 = tf32(ki_[3]);
      mma_tf32(al0, A0, A1, A2, A3, Ba0, Ba1);
      mma_tf32(al1, A0, A1, A2, A3, Bb0, Bb1);
      mma_tf32(am0, Q0, Q1, Q2, Q3, Ba0, Ba1);
      mma_tf32(am1, Q0, Q1, Q2, Q3, Bb0, Bb1);
      oqa[e] = pack_bf2(qe_[0], qe_[2]);
      oqb[e] = pack_bf2(qe_[1], qe_[3]);
      oka[e] = pack_bf2(kd_[0], kd_[2]);
      okb[e] = pack_bf2(kd_[1], kd_[3]);
      ora[e] = pack_bf2(ki_[0] * dl[2 * e], ki_[2] * dl[2 * e + 1]);  // k_r = k_i 2^c_last
      orb[e] = pack_bf2(ki_[1] * dl[2 * e], ki_[3] * dl[2 * e + 1]);
    }
    if (va) {
      *reinterpret_cast<uint4*>(qd + oa + 32 * sl) = make_uint4(oqa[0], oqa[1], oqa[2], oqa[3]);
      *reinterpret_cast<uint4*>(kd + oa + 32 * sl) = make_uint4(oka[0], oka[1], oka[2], oka[3]);
      *reinterpret_cast<uint4*>(kr + oa + 32 * sl) = make_uint4(ora[0], ora[1], ora[2], ora[3]);
    }
    if (vb) {
      *reinterpret_cast<uint4*>(qd + ob + 32 * sl) = make_uint4(oqb[0], oqb[1], oqb[2], oqb[3]);
      *reinterpret_cast<uint4*>(kd + ob + 32 * sl) = make_uint4(okb[0], okb[1], okb[2], okb[3]);
      *reinterpret_cast<uint4*>(kr + ob + 32 * sl) = make_uint4(orb[0], orb[1], orb[2], orb[3]);
    }
  }

  // ---- M = lower(q_d k_i^T) from the accumulators: element (row, col) = (gid | gid + 8, 2 tig (+1) (+8))
  const int c0 = 2 * tig, c1 = 8 + 2 * tig;
  {
    bf16_t* mb = mqk + slot * 256;
    *reinterpret_cast<u32*>(mb + ra * 16 + c0) =
        pack_bf2(c0 <= ra ? am0[0] : 0.f, c0 + 1 <= ra ? am0[1] : 0.f);
    *reinterpret_cast<u32*>(mb + rb * 16 + c0) =
        pack_bf2(c0 <= rb ? am0[2] : 0.f, c0 + 1 <= rb ? am0[3] : 0.f);
    *reinterpret_cast<u32*>(mb + ra * 16 + c1) =
        pack_bf2(c1 <= ra ? am1[0] : 0.f, c1 + 1 <= ra ? am1[1] : 0.f);
    *reinterpret_cast<u32*>(mb + rb * 16 + c1) =
        pack_bf2(c1 <= rb ? am1[2] : 0.f, c1 + 1 <= rb ? am1[3] : 0.f);
  }
  // ---- L = strict-lower(diag(beta) k_d k_i^T) to shared memory (c is spent), X = (I + L)^-1 a column a lane
  __syncwarp();
  float* sL = sc;       // [16][16]
  float* sX = sc + 256;  // [16][16]
  *reinterpret_cast<float2*>(sL + ra * 16 + c0) =
      make_float2(c0 < ra ? beta_a * al0[0] : 0.f, c0 + 1 < ra ? beta_a * al0[1] : 0.f);
  *reinterpret_cast<float2*>(sL + rb * 16 + c0) =
      make_float2(c0 < rb ? beta_b * al0[2] : 0.f, c0 + 1 < rb ? beta_b * al0[3] : 0.f);
  *reinterpret_cast<float2*>(sL + ra * 16 + c1) =
      make_float2(c1 < ra ? beta_a * al1[0] : 0.f, c1 + 1 < ra ? beta_a * al1[1] : 0.f);
  *reinterpret_cast<float2*>(sL + rb * 16 + c1) =
      make_float2(c1 < rb ? beta_b * al1[2] : 0.f, c1 + 1 < rb ? beta_b * al1[3] : 0.f);
  __syncwarp();
  const int j = lane & 15;  // lanes 16..31 repeat 0..15 and store nothing
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {  // x_i = [i == j] - sum_{m < i} L_im x_m
    float acc = i == j ? 1.f : 0.f;
    float Lrow[16];
#pragma unroll
    for (int c4 = 0; c4 < 4; ++c4)
      if (4 * c4 < i) *reinterpret_cast<float4*>(Lrow + 4 * c4) = *reinterpret_cast<const float4*>(sL + i * 16 + 4 * c4);
#pragma unroll
    for (int m = 0; m < i; ++m) acc = fmaf(-Lrow[m], x[m], acc);
    x[i] = acc;
  }
  const float beta_j = j < n ? bf_lo(beta[(t0 + j) * HV + i_hv]) : 0.f;
  if (lane < 16) {
#pragma unroll
    for (int i = 0; i < 16; ++i) sX[i * 16 + j] = x[i] * beta_j;  // INV diag(beta)
  }
  __syncwarp();
  const float4 x0 = *reinterpret_cast<const float4*>(sX + 8 * lane);
  const float4 x1 = *reinterpret_cast<const float4*>(sX + 8 * lane + 4);
  *reinterpret_cast<uint4*>(inv + slot * 256 + 8 * lane) =
      make_uint4(pack_bf2(x0.x, x0.y), pack_bf2(x0.z, x0.w), pack_bf2(x1.x, x1.y), pack_bf2(x1.z, x1.w));
}
