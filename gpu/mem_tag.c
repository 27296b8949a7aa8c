/*
 * mem_tag.c — the names of the memory tags (gpu.h's pt_mem_tag): the one word
 * each tag prints as, and the free text a host names its allocations with read
 * back into a tag.
 */
#include <strings.h>

#include "gpu.h"

static const char *const tag_names[PT_TAG_COUNT] = {"param", "grad", "optim", "buffer",
                                                    "act", "scratch", "hostuse", "other"};

const char *pt_mem_tag_name(int tag) {
    return (tag >= 0 && tag < PT_TAG_COUNT) ? tag_names[tag] : "invalid";
}

int pt_mem_tag_parse(const char *s) {
    static const struct {
        const char *name;
        int tag;
    } alias[] = {
        {"params", PT_TAG_PARAM},
        {"parameter", PT_TAG_PARAM},
        {"grads", PT_TAG_GRAD},
        {"gradient", PT_TAG_GRAD},
        {"optimizer", PT_TAG_OPTIM},
        {"chunk", PT_TAG_BUFFER},
        {"activation", PT_TAG_ACT},
        {"activations", PT_TAG_ACT},
        {"acts", PT_TAG_ACT},
        {"workspace", PT_TAG_SCRATCH},
        {"tmp", PT_TAG_SCRATCH},
        {"temp", PT_TAG_SCRATCH},
    };
    if (!s) return PT_TAG_HOSTUSE;
    for (int t = 0; t < PT_TAG_COUNT; t++)
        if (strcasecmp(s, tag_names[t]) == 0) return t;
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcasecmp(s, alias[i].name) == 0) return alias[i].tag;
    return PT_TAG_HOSTUSE; /* "input", "logits", anything else the host names */
}
