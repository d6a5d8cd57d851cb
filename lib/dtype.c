/* dtype sizes, names and half-precision conversions. */
#include <math.h>
#include <string.h>

#include "pippin/tensor.h"

size_t pp_dtype_size(pp_dtype dt) {
    switch (dt) {
    case PP_F32: case PP_I32: return 4;
    case PP_F64: case PP_I64: return 8;
    case PP_F16: case PP_BF16: return 2;
    case PP_U8: case PP_I8: case PP_BOOL: return 1;
    default: return 0;
    }
}

static const struct { pp_dtype dt; const char *name; } dtype_names[] = {
    {PP_F32, "float32"}, {PP_F64, "float64"}, {PP_F16, "float16"}, {PP_BF16, "bfloat16"},
    {PP_I64, "int64"},   {PP_I32, "int32"},   {PP_I8, "int8"},     {PP_U8, "uint8"},
    {PP_BOOL, "bool"},
};

const char *pp_dtype_name(pp_dtype dt) {
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (dtype_names[i].dt == dt) return dtype_names[i].name;
    return "undefined";
}

pp_dtype pp_dtype_from_name(const char *name) {
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (strcmp(dtype_names[i].name, name) == 0) return dtype_names[i].dt;
    return PP_DTYPE_UNDEFINED;
}

int pp_dtype_is_float(pp_dtype dt) {
    return dt == PP_F32 || dt == PP_F64 || dt == PP_F16 || dt == PP_BF16;
}

int pp_dtype_is_valid(pp_dtype dt) { return pp_dtype_size(dt) != 0; }

float pp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24); /* zero and subnormals */
    } else if (exp == 31) {
        f = mant ? NAN : INFINITY;
    } else {
        f = ldexpf((float)(mant | 0x400), exp - 25);
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= sign;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t pp_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7fffffff;
    if (absx > 0x7f800000) return sign | 0x7e00;        /* NaN */
    if (absx >= 0x477ff000) return sign | 0x7c00;       /* overflow -> inf */
    if (absx < 0x38800000) {                            /* subnormal or zero */
        float a;
        memcpy(&a, &absx, 4);
        return sign | (uint16_t)lrintf(a * 16777216.0f); /* a / 2^-24, nearest even */
    }
    uint32_t mant = absx & 0x7fffff;
    int exp = (int)(absx >> 23) - 127 + 15;
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* carries into exp correctly */
    return sign | (uint16_t)h;
}

float pp_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t pp_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
