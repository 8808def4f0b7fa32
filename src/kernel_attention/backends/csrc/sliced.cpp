// The sliced path's two passes for one block of query rows, its (head, batch element) slices in one loop
// (kernel_attention/backends/sliced.py has the algorithm and the Python loop this replaces;
// kernel_attention/backends/native.py builds this file).
//
// Forward, per slice, with the logits in base 2, s2 = log2(e)·(scale·q'k'^T + t + b):
//
//     relative: s = t + scale·q' k'^T, the product accumulated onto the skewed view of the relative logits
//     shared:   s = log2(e)·(t + b), then += log2(e)·scale·q' k'^T                 one pass, one product
//     s2 (= log2(e)·s + b2 for relative) and its row maximum, then
//     P = 2^(s2 - max), o = P v / Σ P, lse = (max + log2 Σ P) / log2(e)      two passes, one product
//
// Backward, per slice, with δ_i = dO_i·O_i:
//
//     P  = 2^(log2(e)·scale·q' k'^T + log2(e)·t + b2 - lse2)      one product, then one pass
//          (or 2^(x - lse2) from the logits x the forward kept for the block: no product)
//     dv += P^T dO,   dP = dO v^T
//     dS = P ⊙ (dP - δ), and db += Σ_i dS_ij                    one pass, written where the term reads it
//     dq = scale·dS k',   dk += scale·dS^T q'
//
// and the term's own products (Transformer-XL's relative logits and their gradients, or product's
// positional logits shared by the batch).  The Python loop spends four elementwise passes and a copy of the
// term per backward slice (add, sub, exp2, sub, mul) and gives the forward to the flash kernel with the term
// as its mask; here each pass is fused and runs over a slice that is still in cache, and the products are
// the same ATen calls.  Compiled with -ffast-math (no value here is infinite or NaN: the backward zeroes the
// pairs a filter drops after its pass, the forward gives them the finite logit DROPPED).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using at::Tensor;

// 2^x for float: 2^floor(x) · p(x - floor(x)), p a degree-6 least-squares fit of 2^f on [0, 1) (relative error
// 1e-7 in float, about one ulp); plain arithmetic, so that the loops calling it vectorise inline.  With glibc's
// vector exp2 (libmvec, what -ffast-math makes of std::exp2) the forward's passes took 20 ms against 15 ms with
// this (B=4, H=8, T=1024, one thread).  The argument must be at least -126 (exp2_flush clamps it).
inline float exp2_poly(float x) {
  const float fl = std::floor(x), f = x - fl;
  float p = 2.1690608991775662e-04f;
  p = p * f + 1.2443081941455603e-03f;
  p = p * f + 9.6784727647900581e-03f;
  p = p * f + 5.5483523756265640e-02f;
  p = p * f + 2.4022980034351349e-01f;
  p = p * f + 6.9314700365066528e-01f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fl) + 127) << 23;  // 2^floor(x), a normal float for x >= -126
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline double exp2_poly(double x) { return std::exp2(x); }

// 2^x, and 0 for x < -100: a weight under 2^-100 of the row's largest is below the rounding of either
// precision's sum, and the clamp keeps exp2_poly's argument in range (glibc's vector exp2 also sent a whole
// vector to its scalar path when one lane underflowed, as for the pairs a filter drops).
template <typename T>
inline T exp2_flush(T x) {
  const T e = exp2_poly(x < T(-100) ? T(-100) : x);
  return x < T(-100) ? T(0) : e;
}

// t[b, h] for t (B|1, H|1, ...): broadcast dimensions read at 0.
Tensor pick(const Tensor& t, int64_t b, int64_t h) {
  return t.select(0, t.size(0) > 1 ? b : 0).select(0, t.size(1) > 1 ? h : 0);
}

// The pairs a filter drops in a slice: drop[i, j - c0] for columns [c0, c0 + c), from a bool (n|1, c) view;
// empty when the filter keeps every pair of the block.
struct Drop {
  const bool* p = nullptr;
  int64_t s0 = 0, s1 = 0, c0 = 0, c = 0;
  Drop() = default;
  Drop(const Tensor& d, int64_t n, int64_t col0)
      : p(d.data_ptr<bool>()), s0(d.size(0) == 1 ? 0 : d.stride(0)), s1(d.stride(1)), c0(col0), c(d.size(1)) {
    TORCH_CHECK(d.size(0) == 1 || d.size(0) == n, "sliced: the filter's rows do not fit the block");
  }
  // row[j] = value where row i drops the pair
  template <typename T>
  void apply(T* row, int64_t i, T value) const {
    if (!p) return;
    const bool* di = p + i * s0;
    T* r = row + c0;
    for (int64_t j = 0; j < c; ++j)
      if (di[j * s1]) r[j] = value;
  }
};

// s[i, j] <- 2^(s[i, j] + f·t[i, j] + kb[j] - l[i]), 0 where the filter drops the pair;  s and t with unit
// column stride and row strides ss and ts, kb contiguous or absent.
template <typename T, bool HasBias>
void exp2_rows(T* s, int64_t ss, const T* t, int64_t ts, T f, const T* kb, const T* l, const Drop& drop, int64_t n,
               int64_t m) {
  at::parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    const T* __restrict__ kbr = kb;
    for (int64_t i = i0; i < i1; ++i) {
      T* __restrict__ si = s + i * ss;
      const T* __restrict__ ti = t + i * ts;
      const T li = l[i];
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) {
        T x = si[j] - li + f * ti[j];
        if constexpr (HasBias) x += kbr[j];
        si[j] = exp2_flush(x);
      }
      drop.apply(si, i, T(0));
    }
  });
}

// s[i, j] <- 2^(x[i, j] - l[i]) for the logits x that the forward kept (n, m contiguous; a dropped pair's
// DROPPED gives 0), s with row stride ss.
template <typename T>
void exp2_kept(T* s, int64_t ss, const T* x, const T* l, int64_t n, int64_t m) {
  at::parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* __restrict__ si = s + i * ss;
      const T* __restrict__ xi = x + i * m;
      const T li = l[i];
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) si[j] = exp2_flush(xi[j] - li);
    }
  });
}

// ds[i, j] <- (dp[i, j] - δ[i]) · p[i, j];  db[i, j] += ds[i, j] when Acc, and cs[j] += ds[i, j] (the column
// sums, the key bias's gradient) when ColSum.  dp and db contiguous rows of length m, p and ds with row strides
// ps and dss.  The column sums run the rows in order (one thread): the rows of a block share cs.
template <typename T, bool Acc, bool ColSum>
void ds_rows(T* ds, int64_t dss, const T* dp, const T* p, int64_t ps, const T* delta, T* db, T* cs, int64_t n,
             int64_t m) {
  at::parallel_for(0, n, ColSum ? n : 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* __restrict__ di = ds + i * dss;
      const T* __restrict__ dpi = dp + i * m;
      const T* __restrict__ pi = p + i * ps;
      const T d = delta[i];
      T* __restrict__ dbi = Acc ? db + i * m : nullptr;
      T* __restrict__ csr = cs;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) {
        T x = (dpi[j] - d) * pi[j];
        di[j] = x;
        if constexpr (Acc) dbi[j] += x;
        if constexpr (ColSum) csr[j] += x;
      }
    }
  });
}

template <typename T>
void form_p(Tensor& s, const Tensor& term, T f, const Tensor* kb, const Tensor& l, const Drop& drop) {
  const int64_t n = s.size(0), m = s.size(1);
  T* sp = s.data_ptr<T>();
  const T* tp = term.data_ptr<T>();
  const T* lp = l.data_ptr<T>();
  if (kb) exp2_rows<T, true>(sp, s.stride(0), tp, term.stride(0), f, kb->data_ptr<T>(), lp, drop, n, m);
  else exp2_rows<T, false>(sp, s.stride(0), tp, term.stride(0), f, nullptr, lp, drop, n, m);
}

// The logit of a dropped pair in the forward pass, in base 2: 2^(DROPPED - max) is 0 for any kept max, and a
// row whose maximum is below EMPTY keeps no key.
constexpr double DROPPED = -1e30, EMPTY = -1e29;

// Row by row over s (n, m), row stride ss: x = f·s + kb (kb absent: f·s; DROPPED where the filter drops the
// pair) and its maximum in one pass, then P = 2^(x - max) in place, inv[i] = 1 / Σ_j P_ij and
// lse[i] = (max + log2 Σ_j P_ij) / log2(e); a row that keeps no key: P = 0, inv = 0, lse = 0.  keep (n, m)
// contiguous, or null: receives x, the logits the backward then reads instead of forming them again.
template <typename T, bool HasBias>
void softmax_rows(T* s, int64_t ss, T f, const T* kb, const Drop& drop, T* inv, T* lp, int64_t ls, T* keep,
                  int64_t n, int64_t m) {
  at::parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* __restrict__ si = s + i * ss;
      const T* __restrict__ kbr = kb;
      T mx = static_cast<T>(DROPPED);
      // columns [j0, j1), DROPPED where the filter's row di (column stride s1) drops the pair
      auto biased = [&](int64_t j0, int64_t j1, const bool* di, int64_t s1) {
        T m1 = mx;
#pragma omp simd reduction(max : m1)
        for (int64_t j = j0; j < j1; ++j) {
          T x = f * si[j];
          if constexpr (HasBias) x += kbr[j];
          if (di && di[(j - j0) * s1]) x = static_cast<T>(DROPPED);
          si[j] = x;
          m1 = x > m1 ? x : m1;
        }
        mx = m1;
      };
      if (drop.p) {
        const int64_t c0 = drop.c0, c1 = drop.c0 + drop.c;
        biased(0, c0, nullptr, 0);
        biased(c0, c1, drop.p + i * drop.s0, drop.s1);
        biased(c1, m, nullptr, 0);
      } else {
        biased(0, m, nullptr, 0);
      }
      // the row is in cache: a copy here costs a fraction of the two products the backward then skips
      if (keep) std::memcpy(keep + i * m, si, m * sizeof(T));
      if (mx < static_cast<T>(EMPTY)) {
        for (int64_t j = 0; j < m; ++j) si[j] = 0;
        inv[i] = 0;
        lp[i * ls] = 0;
        continue;
      }
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < m; ++j) {
        T p = exp2_flush(si[j] - mx);
        si[j] = p;
        sum += p;
      }
      inv[i] = 1 / sum;
      lp[i * ls] = (mx + std::log2(sum)) / static_cast<T>(M_LOG2E);
    }
  });
}

// s[i, j] <- f·t[i, j] + kb[j] (kb absent: f·t[i, j]), `dropped` where the filter drops the pair; s and t with
// unit column stride.
template <typename T>
void bias_rows(Tensor& s, const Tensor& t, T f, const Tensor* kb, const Drop& drop, T dropped) {
  const int64_t n = s.size(0), m = s.size(1), ss = s.stride(0), ts = t.stride(0);
  T* sp = s.data_ptr<T>();
  const T* tp = t.data_ptr<T>();
  const T* kp = kb ? kb->data_ptr<T>() : nullptr;
  at::parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* si = sp + i * ss;
      const T* ti = tp + i * ts;
      if (kp) {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) si[j] = f * ti[j] + kp[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) si[j] = f * ti[j];
      }
      drop.apply(si, i, dropped);
    }
  });
}

// A (n, m) buffer whose rows are padded to a multiple of 16 elements plus 16: the products that read it
// transposed (dv += P^T dO, dk += dS^T q') ran 1.4x slower with a row stride of 1024 elements, a power of two.
Tensor padded_buffer(int64_t n, int64_t m, const at::TensorOptions& opts) {
  return at::empty({n, (m + 15) / 16 * 16 + 16}, opts).narrow(1, 0, m);
}

// Transformer-XL's relative logits of a slice: row i of the block meets the distances of columns
// [n - 1 - i, n - 1 - i + m) of its (n, w) logits, so a block of n rows meets n + m - 1 distances.  The three
// relative products run on chunks of `step` rows (the caller's choice, sliced.py's rel_chunk_rows), each
// over its own m + step - 1 columns.
// logits[i, c] = qv_i · rev_c over each row's columns (the rest of the buffer is not read)
void rel_logits(Tensor& logits, const Tensor& qv, const Tensor& rev, int64_t m, int64_t step) {
  const int64_t n = qv.size(0);
  for (int64_t c0 = 0; c0 < n; c0 += step) {
    const int64_t r = std::min(step, n - c0), a = n - c0 - r, w = m + r - 1;
    Tensor out = logits.narrow(0, c0, r).narrow(1, a, w);
    at::mm_out(out, qv.narrow(0, c0, r), rev.narrow(0, a, w).t());
  }
}

// dqv += G rev and drev^T += qv^T G, G (n, w) zero outside each row's columns
void rel_grads(const Tensor& g, const Tensor& qv, const Tensor& rev, Tensor dqv, Tensor drev_t, int64_t m,
               int64_t step) {
  const int64_t n = qv.size(0);
  for (int64_t c0 = 0; c0 < n; c0 += step) {
    const int64_t r = std::min(step, n - c0), a = n - c0 - r, w = m + r - 1;
    Tensor gc = g.narrow(0, c0, r).narrow(1, a, w);
    dqv.narrow(0, c0, r).addmm_(gc, rev.narrow(0, a, w));
    drev_t.narrow(1, a, w).addmm_(qv.narrow(0, c0, r).t(), gc);
  }
}

// Whether x is a contiguous (B, H, n, m) buffer of kept logits.
bool kept_fits(const Tensor& x, int64_t B, int64_t H, int64_t n, int64_t m) {
  return x.dim() == 4 && x.size(0) == B && x.size(1) == H && x.size(2) == n && x.size(3) == m && x.is_contiguous();
}

// Runs f(h0, h1) over the heads [0, H): on torch's threads, a range of heads each, when `independent` (no
// tensor is written by two heads) and more than one thread is set, else in one call.  A slice's products and
// passes are too small to share well between threads; the (batch, head) slices of a block are not.
template <typename F>
void run_heads(int64_t H, bool independent, const F& f) {
  if (independent && H > 1 && at::get_num_threads() > 1 && !at::in_parallel_region())
    at::parallel_for(0, H, 1, f);
  else
    f(0, H);
}

}  // namespace

// One block of query rows [r0, r1) against keys [lo, hi), every (head, batch element) slice of it.
//
//   qf (B, H, Tq, D), kf (B, H, Tk, D), v (B, H, Tk, Dv), gout (B, H, Tq, Dv), lse2 (B, H, Tq) = log2(e)·lse,
//   delta (B, H, Tq); scale the logits' scale; kb2 (B|1, H|1, 1, Tk) log2(e)·key bias, or None;  drop
//   (B|1, H|1, n, c) bool, or None, for columns [drop_c0, drop_c0 + c) of the block's span
//   dq (B, H, Tq, D): the block's rows written;  dk (B, H, Tk, D), dv (B, H, Tk, Dv) and dkb (B, H, Tk) (the key
//   bias's gradient, or None): accumulated
//   kept (B, H, n, m) contiguous, or None: the block's logits in base 2 as the forward kept them; P is formed
//     from them, and neither the content product nor the term's is recomputed
//   chunk: rows per relative product (rel_logits); the term's tensors:
//   term 0, Transformer-XL's relative logits: extras = qv (B|1, H, Tq, d), rev (H|1, >= n + m - 1, d) the
//     block's distances in reverse, dqv (B|1, H, Tq, d), drev_t (H|1, d, >= n + m - 1) their gradient, g_rel
//     (n, w >= n + m - 1) zero outside the band dS fills
//   term 1, product's positional logits shared by the batch: extras = qf_t (1, H, Tq, F), kf_t (1, H, Tk, F),
//     dqf (1, H, Tq, F), dkf_t (1, H, F, Tk)
void block_backward(const Tensor& qf, const Tensor& kf, const Tensor& v, const Tensor& gout, const Tensor& lse2,
                    const Tensor& delta, double scale, const c10::optional<Tensor>& kb2_,
                    const c10::optional<Tensor>& drop_, int64_t drop_c0, int64_t r0, int64_t r1, int64_t lo,
                    int64_t hi, Tensor dq, Tensor dk, Tensor dv, const c10::optional<Tensor>& dkb_, int64_t term,
                    int64_t chunk, std::vector<Tensor> extras, const c10::optional<Tensor>& kept_) {
  const int64_t B = v.size(0), H = v.size(1), n = r1 - r0, m = hi - lo;
  const bool has_kept = kept_.has_value();
  TORCH_CHECK(!has_kept || kept_fits(*kept_, B, H, n, m),
              "block_backward: kept logits must be (B, H, n, m), contiguous");
  TORCH_CHECK(term == 0 || term == 1, "block_backward: term must be 0 (relative) or 1 (shared), got ", term);
  TORCH_CHECK(extras.size() == 5 - term, "block_backward: wrong number of term tensors");
  auto opts = qf.options();
  const bool has_kb = kb2_.has_value(), has_drop = drop_.has_value(), has_dkb = dkb_.has_value();
  const Tensor kb2 = has_kb ? *kb2_ : Tensor(), drop = has_drop ? *drop_ : Tensor();
  // heads [h0, h1) with their own slice buffers (the first range uses the caller's G)
  auto heads = [&](int64_t h0, int64_t h1) {
  at::NoGradGuard no_grad;  // grad mode is per thread: torch's worker threads do not inherit the caller's
  Tensor s = padded_buffer(n, m, opts), dp = at::empty({n, m}, opts);
  Tensor logits, ds, db, head, g_rel;
  if (term == 0) {
    g_rel = h0 == 0 ? extras[4] : at::zeros_like(extras[4]);  // zero outside the band dS fills
    if (!has_kept) logits = at::empty_like(g_rel);
    // pair (i, j) sits at column n - 1 - i + j of the relative logits and of their gradient
    ds = g_rel.as_strided({n, m}, {g_rel.stride(0) - 1, 1}, g_rel.storage_offset() + n - 1);
  } else {
    ds = padded_buffer(n, m, opts);
    db = at::empty({n, m}, opts);
    head = at::empty({n, m}, opts);
  }
  for (int64_t hh = h0; hh < h1; ++hh) {
    if (term == 1) {
      if (!has_kept) at::mm_out(head, extras[0][0][hh].narrow(0, r0, n), extras[1][0][hh].narrow(0, lo, m).t());
      db.zero_();
    }
    for (int64_t bb = 0; bb < B; ++bb) {
      Tensor qrow = qf[bb][hh].narrow(0, r0, n), k = kf[bb][hh].narrow(0, lo, m);
      Tensor vv = v[bb][hh].narrow(0, lo, m), g = gout[bb][hh].narrow(0, r0, n);
      Tensor l = lse2[bb][hh].narrow(0, r0, n);
      if (has_kept) {  // the forward's logits: no product
        Tensor x = (*kept_)[bb][hh];
        AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "block_backward_kept", [&] {
          exp2_kept<scalar_t>(s.data_ptr<scalar_t>(), s.stride(0), x.data_ptr<scalar_t>(), l.data_ptr<scalar_t>(),
                              n, m);
        });
      } else {
        Tensor src;
        if (term == 0) {
          const Tensor& rev = extras[1];
          rel_logits(logits, pick(extras[0], bb, hh).narrow(0, r0, n), rev.size(0) > 1 ? rev[hh] : rev[0], m,
                     chunk);
          src = logits.as_strided({n, m}, {logits.stride(0) - 1, 1}, logits.storage_offset() + n - 1);
        } else {
          src = head;
        }
        at::addmm_out(s, s, qrow, k.t(), 0.0, scale * M_LOG2E);  // beta = 0: s is not read
        Tensor kb = has_kb ? pick(kb2, bb, hh)[0].narrow(0, lo, m).contiguous() : Tensor();
        AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "block_backward", [&] {
          form_p<scalar_t>(s, src, static_cast<scalar_t>(M_LOG2E), has_kb ? &kb : nullptr, l,
                           has_drop ? Drop(pick(drop, bb, hh), n, drop_c0) : Drop());
        });
      }
      dv[bb][hh].narrow(0, lo, m).addmm_(s.t(), g);
      at::mm_out(dp, g, vv.t());
      Tensor dl = delta[bb][hh].narrow(0, r0, n);
      Tensor cs = has_dkb ? (*dkb_)[bb][hh].narrow(0, lo, m) : Tensor();
      AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "block_backward_ds", [&] {
        scalar_t *dsp = ds.data_ptr<scalar_t>(), *dpp = dp.data_ptr<scalar_t>(), *sp = s.data_ptr<scalar_t>();
        const scalar_t* dlp = dl.data_ptr<scalar_t>();
        scalar_t* dbp = term == 1 ? db.data_ptr<scalar_t>() : nullptr;
        scalar_t* csp = has_dkb ? cs.data_ptr<scalar_t>() : nullptr;
        const int64_t dss = ds.stride(0), ps = s.stride(0);
        if (term == 1 && has_dkb) ds_rows<scalar_t, true, true>(dsp, dss, dpp, sp, ps, dlp, dbp, csp, n, m);
        else if (term == 1) ds_rows<scalar_t, true, false>(dsp, dss, dpp, sp, ps, dlp, dbp, csp, n, m);
        else if (has_dkb) ds_rows<scalar_t, false, true>(dsp, dss, dpp, sp, ps, dlp, dbp, csp, n, m);
        else ds_rows<scalar_t, false, false>(dsp, dss, dpp, sp, ps, dlp, dbp, csp, n, m);
      });
      Tensor dqs = dq[bb][hh].narrow(0, r0, n);
      at::addmm_out(dqs, dqs, ds, k, 0.0, scale);
      dk[bb][hh].narrow(0, lo, m).addmm_(ds.t(), qrow, 1.0, scale);
      if (term == 0) {
        const Tensor& rev = extras[1];
        const int64_t ht = rev.size(0) > 1 ? hh : 0;
        rel_grads(g_rel, pick(extras[0], bb, hh).narrow(0, r0, n), rev[ht], pick(extras[2], bb, hh).narrow(0, r0, n),
                  extras[3][ht], m, chunk);
      }
    }
    if (term == 1) {
      extras[2][0][hh].narrow(0, r0, n).addmm_(db, extras[1][0][hh].narrow(0, lo, m));
      extras[3][0][hh].narrow(1, lo, m).addmm_(extras[0][0][hh].narrow(0, r0, n).t(), db);
    }
  }
  };
  run_heads(H, term == 1 || extras[1].size(0) > 1, heads);
}

// The forward pass of one block, every slice of it: o = softmax(s) v and lse = log Σ_j exp(s_ij), with s in
// base 2 (s2 = log2(e)·s) formed as in the backward.  Dropped pairs are set to DROPPED (finite, as -ffast-math
// wants); a row whose pairs are all dropped gets o = 0 and lse = 0, as the flash kernel gives.  Transformer-XL's
// content product is accumulated onto the skewed view of the relative logits, so that its s needs no pass of
// its own before the soft-max; product's shared term is copied into each slice's s first.
//
//   qf (B, H, Tq, D), kf (B, H, Tk, D), v (B, H, Tk, Dv), kb2 (B|1, H|1, 1, Tk) log2(e)·key bias or None, drop
//   as in the backward, scale the logits' scale; out (B, H, Tq, Dv) and lse (B, H, Tq): the block's rows
//   written; term and extras: the first two tensors of the backward's (qv, rev or qf_t, kf_t), chunk as there;
//   kept (B, H, n, m) contiguous, or None: receives the block's logits in base 2 for the backward.
void block_forward(const Tensor& qf, const Tensor& kf, const Tensor& v, const c10::optional<Tensor>& kb_,
                   const c10::optional<Tensor>& drop_, int64_t drop_c0, int64_t r0, int64_t r1, int64_t lo,
                   int64_t hi, double scale, Tensor out, Tensor lse, int64_t term, int64_t chunk,
                   std::vector<Tensor> extras, const c10::optional<Tensor>& kept_) {
  const int64_t B = v.size(0), H = v.size(1), n = r1 - r0, m = hi - lo;
  TORCH_CHECK(!kept_.has_value() || kept_fits(*kept_, B, H, n, m),
              "block_forward: kept logits must be (B, H, n, m), contiguous");
  TORCH_CHECK(term == 0 || term == 1, "block_forward: term must be 0 (relative) or 1 (shared), got ", term);
  TORCH_CHECK(extras.size() == 2, "block_forward: wrong number of term tensors");
  auto opts = qf.options();
  const bool has_kb = kb_.has_value(), has_drop = drop_.has_value();
  auto heads = [&](int64_t h0, int64_t h1) {
  at::NoGradGuard no_grad;  // grad mode is per thread: torch's worker threads do not inherit the caller's
  Tensor s, logits, head;
  if (term == 0) {
    logits = at::empty({n, (n + m - 1 + 15) / 16 * 16}, opts);  // rows padded as the backward's G
    s = logits.as_strided({n, m}, {logits.stride(0) - 1, 1}, logits.storage_offset() + n - 1);
  } else {
    s = padded_buffer(n, m, opts);
    head = at::empty({n, m}, opts);
  }
  Tensor inv = at::empty({n}, opts);
  for (int64_t hh = h0; hh < h1; ++hh) {
    if (term == 1) at::mm_out(head, extras[0][0][hh].narrow(0, r0, n), extras[1][0][hh].narrow(0, lo, m).t());
    for (int64_t bb = 0; bb < B; ++bb) {
      Tensor kb = has_kb ? pick(*kb_, bb, hh)[0].narrow(0, lo, m).contiguous() : Tensor();
      const Drop dr = has_drop ? Drop(pick(*drop_, bb, hh), n, drop_c0) : Drop();
      Tensor qrow = qf[bb][hh].narrow(0, r0, n), kt = kf[bb][hh].narrow(0, lo, m).t();
      Tensor o = out[bb][hh].narrow(0, r0, n), l = lse[bb][hh].narrow(0, r0, n);
      Tensor x = kept_.has_value() ? (*kept_)[bb][hh] : Tensor();
      AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "block_forward", [&] {
        const scalar_t f = static_cast<scalar_t>(M_LOG2E);
        scalar_t* lp = l.data_ptr<scalar_t>();
        scalar_t* xp = x.defined() ? x.data_ptr<scalar_t>() : nullptr;
        if (term == 0) {  // s = t + scale·q'k'^T in natural units; the soft-max's first pass adds the key bias
          const Tensor& rev = extras[1];
          rel_logits(logits, pick(extras[0], bb, hh).narrow(0, r0, n), rev.size(0) > 1 ? rev[hh] : rev[0], m, chunk);
          s.addmm_(qrow, kt, 1.0, scale);
          if (has_kb)
            softmax_rows<scalar_t, true>(s.data_ptr<scalar_t>(), s.stride(0), f, kb.data_ptr<scalar_t>(), dr,
                                         inv.data_ptr<scalar_t>(), lp, l.stride(0), xp, n, m);
          else
            softmax_rows<scalar_t, false>(s.data_ptr<scalar_t>(), s.stride(0), f, nullptr, dr,
                                          inv.data_ptr<scalar_t>(), lp, l.stride(0), xp, n, m);
        } else {  // s = log2(e)·(t + kb) with the filter's DROPPED, then += log2(e)·scale·q'k'^T
          bias_rows<scalar_t>(s, head, f, has_kb ? &kb : nullptr, dr, static_cast<scalar_t>(DROPPED));
          // beta = 1: the product accumulated onto the bias runs faster than into a fresh buffer (MKL, K = 64);
          // a dropped pair's DROPPED absorbs its product (|q'·k'| is many orders below 1e30)
          s.addmm_(qrow, kt, 1.0, scale * M_LOG2E);
          softmax_rows<scalar_t, false>(s.data_ptr<scalar_t>(), s.stride(0), scalar_t(1), nullptr, Drop(),
                                        inv.data_ptr<scalar_t>(), lp, l.stride(0), xp, n, m);
        }
      });
      at::mm_out(o, s, v[bb][hh].narrow(0, lo, m));
      o.mul_(inv.unsqueeze(1));
    }
  }
  };
  run_heads(H, true, heads);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_backward", &block_backward, "the sliced path's backward for one block of query rows");
  m.def("block_forward", &block_forward, "the sliced path's forward for one block of query rows");
}
