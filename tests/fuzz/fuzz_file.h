/*
 * fuzz_file.h — for fuzz targets whose reader takes a path: each input is
 * written to one in-memory file (memfd) that is reached as /proc/self/fd/N,
 * so no input touches the disk and runs do not race on a temp name.
 */
#ifndef PT_FUZZ_FILE_H
#define PT_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The path of a file holding exactly data[0..size). Aborts if the memfd
 * cannot be made (a broken fuzzing setup, not an input). */
static inline const char *fuzz_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz_input", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    return path;
}

/* A reader that fails must say why: an empty sentence is a finding. */
#define FUZZ_EXPECT_SENTENCE(rc, err) \
    do { \
        if ((rc) != 0 && !(err)[0]) abort(); \
    } while (0)

#endif
