/*
 * sh_lock.h — one writer per checkpoint folder. A run that writes generations
 * (or resumes from them) holds an exclusive flock on DIR/.lock from before its
 * first step to its end; a second run on the folder is refused with the
 * holder's pid. Two writers would prune each other's generations
 * (checkpoint_keep counts both runs' folders) and two resumes would continue
 * one run twice. The kernel drops the lock when the holder exits, however it
 * ends (kill -9 included), so there is no stale lock to clean.
 */
#ifndef SH_LOCK_H
#define SH_LOCK_H

#include <stddef.h>

#define SH_LOCK_FILE ".lock"

/* Make dir (one level) when missing and lock it; *fd receives the lock's file
 * descriptor. 0, or -1 with a sentence naming the folder and the holder's pid. */
int sh_lock_dir(const char *dir, int *fd, char *err, size_t errlen);
/* Drop the lock (*fd >= 0), *fd = -1. */
void sh_lock_release(int *fd);

#endif /* SH_LOCK_H */
