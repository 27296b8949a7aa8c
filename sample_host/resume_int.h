/*
 * resume_int.h — what resume.c and resume_host.c share (not for other files).
 */
#ifndef SH_RESUME_INT_H
#define SH_RESUME_INT_H

#include <stddef.h>
#include <stdint.h>

#include "sh_resume.h"

#define FNV_START 0xcbf29ce484222325ull

/* FNV-1a 64, continued from h: cheap, and enough to catch torn or flipped bytes. */
uint64_t sh_resume_fnv(uint64_t h, const void *p, size_t n);
/* A sentence into err; returns -1. */
int sh_resume_say(char *err, size_t errlen, const char *fmt, ...);

/* host.txt's text for st into buf (n bytes): its length, -1 when too long. */
int sh_resume_host_text(const sh_resume *r, const sh_resume_state *st, char *buf, size_t n);
/* The value of "key" in a "key value" line of text (a "run key value" line when
 * run), copied into v; 0 when found. */
int sh_resume_find_val(const char *text, const char *key, int run, char *v, size_t vn);
/* The saved run (host.txt text) must be this run: 0, or -1 with the sentence. */
int sh_resume_same_run(const sh_resume *r, const char *saved, const char *gen, char *err,
                       size_t errlen);
/* host.txt's values into st: 0, or -1 when malformed. */
int sh_resume_parse_host(const char *text, sh_resume_state *st);

#endif /* SH_RESUME_INT_H */
