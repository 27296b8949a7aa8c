/* state_io.h — layout-independent model + optimizer state (see state_io.c). */
#ifndef PT_STATE_IO_H
#define PT_STATE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "rt_internal.h"

typedef struct pt_state_image {
    unsigned char *data;
    size_t bytes;
    int64_t step;       /* optimizer steps taken */
    int has_opt;        /* holds fp32 masters and Adam moments (optimizer existed) */
} pt_state_image;

/* In memory (calibration re-plan). Both need create_optimizer done. */
int pt_state_snapshot(pt_rt *rt, pt_state_image *img, char *err, size_t errlen);
int pt_state_restore(pt_rt *rt, const pt_state_image *img, char *err, size_t errlen);
void pt_state_image_free(pt_state_image *img);

/* <dir>/protrain_state_rank<r>.bin, written atomically (temp, fsync, rename);
 * load checks magic, version, size, checksum and every parameter's name, dtype
 * and size before it changes anything. */
int pt_state_save(pt_rt *rt, const char *dir, char *err, size_t errlen);
int pt_state_load(pt_rt *rt, const char *dir, char *err, size_t errlen);

#endif
