/* Per-pixel preprocessing math shared by the CUDA kernel (preprocess.cu) and the host build
 * (host_preprocess.cpp) that tests compare with edge/preprocess.py.
 *
 * Output pixel (ox, oy) is the antialiased triangle (PIL BILINEAR) resampling of the source at the
 * crop position, summed in 2D; BGR -> RGB; value * mul + add. The geometry (scale, offset) comes from
 * edge.preprocess.crop_geometry. C++14, no CUDA-only features: compiles with nvcc and plain g++.
 */
#ifndef EDGE_PREPROCESS_CUH
#define EDGE_PREPROCESS_CUH

#ifdef __CUDACC__
#define EDGE_HD __host__ __device__
#else
#define EDGE_HD
#endif

/* Source taps [lo, hi) of output index o along one axis. The centre is found in double precision
 * (as the CPU does); per-tap distances are then small, so float keeps them exact to ~1e-7. */
struct EdgeTaps {
    int lo;
    int hi;
    float first;        /* lo - centre + 0.5 */
    float inv_support;  /* 1 / max(scale, 1) */
};

EDGE_HD inline EdgeTaps edge_taps(int o, int offset, double scale, int in_size) {
    const double centre = (offset + o + 0.5) * scale;
    const double support = scale > 1.0 ? scale : 1.0;
    const int lo = (int)(centre - support + 0.5);
    const int hi = (int)(centre + support + 0.5);
    EdgeTaps t;
    t.lo = lo > 0 ? lo : 0;
    t.hi = hi < in_size ? hi : in_size;
    t.first = (float)(t.lo - centre + 0.5);
    t.inv_support = (float)(1.0 / support);
    return t;
}

/* Unnormalised triangle weight of source index x: max(0, 1 - |x - centre + 0.5| / support). */
EDGE_HD inline float edge_weight(int x, const EdgeTaps& t) {
    const float d = t.first + (float)(x - t.lo);
    const float w = 1.0f - (d < 0.0f ? -d : d) * t.inv_support;
    return w > 0.0f ? w : 0.0f;
}

EDGE_HD inline float edge_weight_sum(const EdgeTaps& t) {
    float s = 0.0f;
    for (int x = t.lo; x < t.hi; ++x) s += edge_weight(x, t);
    return s;
}

/* Resampled value of output pixel (ox, oy), channels in source (BGR) order, range 0..255. */
EDGE_HD inline void edge_resample(const unsigned char* src, int src_w, int src_h, int stride,
                                  double scale_x, double scale_y, int offset_x, int offset_y,
                                  int ox, int oy, float bgr[3]) {
    const EdgeTaps tx = edge_taps(ox, offset_x, scale_x, src_w);
    const EdgeTaps ty = edge_taps(oy, offset_y, scale_y, src_h);
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f;
    for (int y = ty.lo; y < ty.hi; ++y) {
        const float wy = edge_weight(y, ty);
        if (wy == 0.0f) continue;
        const unsigned char* row = src + (long long)y * stride;
        float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f;
        for (int x = tx.lo; x < tx.hi; ++x) {
            const float wx = edge_weight(x, tx);
            const unsigned char* p = row + 3 * x;
            r0 += wx * p[0];
            r1 += wx * p[1];
            r2 += wx * p[2];
        }
        acc0 += wy * r0;
        acc1 += wy * r1;
        acc2 += wy * r2;
    }
    const float norm = 1.0f / (edge_weight_sum(tx) * edge_weight_sum(ty));
    bgr[0] = acc0 * norm;
    bgr[1] = acc1 * norm;
    bgr[2] = acc2 * norm;
}

/* Normalised RGB value of output pixel (ox, oy): rgb[c] = bgr[2 - c] * mul[c] + add[c]. */
EDGE_HD inline void edge_pixel(const unsigned char* src, int src_w, int src_h, int stride,
                               double scale_x, double scale_y, int offset_x, int offset_y,
                               int ox, int oy, const float mul[3], const float add[3], float rgb[3]) {
    float bgr[3];
    edge_resample(src, src_w, src_h, stride, scale_x, scale_y, offset_x, offset_y, ox, oy, bgr);
    for (int c = 0; c < 3; ++c) rgb[c] = bgr[2 - c] * mul[c] + add[c];
}

#endif /* EDGE_PREPROCESS_CUH */
