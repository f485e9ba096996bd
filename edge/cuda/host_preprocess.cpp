/* Host build of the kernel's per-pixel math (preprocess.cuh), for comparing with edge/preprocess.py
 * without a GPU: computes the whole 1x3xCxC float32 tensor with the functions the kernel calls. */
#include "preprocess.cuh"

extern "C" void edge_preprocess_host(const unsigned char* src, int src_w, int src_h, int stride,
                                     double scale_x, double scale_y, int offset_x, int offset_y, int crop,
                                     const float* mul, const float* add, float* dst) {
    const int plane = crop * crop;
    for (int oy = 0; oy < crop; ++oy) {
        for (int ox = 0; ox < crop; ++ox) {
            float rgb[3];
            edge_pixel(src, src_w, src_h, stride, scale_x, scale_y, offset_x, offset_y, ox, oy, mul, add, rgb);
            for (int c = 0; c < 3; ++c) dst[c * plane + oy * crop + ox] = rgb[c];
        }
    }
}
