/* Fused preprocessing: HxWx3 uint8 BGR frame (row stride in bytes) -> 1x3xCxC RGB normalised tensor,
 * written straight into the TensorRT input binding. One thread per output pixel, all 3 channels.
 * Geometry comes from edge.preprocess.crop_geometry; the math is in preprocess.cuh. */
#include <cuda_fp16.h>

#include "preprocess.cuh"

template <typename T>
__device__ inline T edge_store(float v);

template <>
__device__ inline float edge_store<float>(float v) { return v; }

template <>
__device__ inline __half edge_store<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__device__ inline void edge_preprocess(const unsigned char* __restrict__ src, int src_w, int src_h, int stride,
                                       double scale_x, double scale_y, int offset_x, int offset_y, int crop,
                                       float mul0, float mul1, float mul2, float add0, float add1, float add2,
                                       T* __restrict__ dst) {
    const int ox = blockIdx.x * blockDim.x + threadIdx.x;
    const int oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox >= crop || oy >= crop) return;
    const float mul[3] = {mul0, mul1, mul2};
    const float add[3] = {add0, add1, add2};
    float rgb[3];
    edge_pixel(src, src_w, src_h, stride, scale_x, scale_y, offset_x, offset_y, ox, oy, mul, add, rgb);
    const int plane = crop * crop;
    const int i = oy * crop + ox;
    dst[i] = edge_store<T>(rgb[0]);
    dst[plane + i] = edge_store<T>(rgb[1]);
    dst[2 * plane + i] = edge_store<T>(rgb[2]);
}

extern "C" __global__ void edge_preprocess_f32(const unsigned char* __restrict__ src, int src_w, int src_h,
                                               int stride, double scale_x, double scale_y, int offset_x,
                                               int offset_y, int crop, float mul0, float mul1, float mul2,
                                               float add0, float add1, float add2, float* __restrict__ dst) {
    edge_preprocess<float>(src, src_w, src_h, stride, scale_x, scale_y, offset_x, offset_y, crop,
                           mul0, mul1, mul2, add0, add1, add2, dst);
}

extern "C" __global__ void edge_preprocess_f16(const unsigned char* __restrict__ src, int src_w, int src_h,
                                               int stride, double scale_x, double scale_y, int offset_x,
                                               int offset_y, int crop, float mul0, float mul1, float mul2,
                                               float add0, float add1, float add2, __half* __restrict__ dst) {
    edge_preprocess<__half>(src, src_w, src_h, stride, scale_x, scale_y, offset_x, offset_y, crop,
                            mul0, mul1, mul2, add0, add1, add2, dst);
}
