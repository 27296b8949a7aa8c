#include "base.h"

uint64_t pt_fnv1a64(const void *data, size_t len) {
    return pt_fnv1a64_more(14695981039346656037ull, data, len);
}

uint64_t pt_fnv1a64_more(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}
