/*
 * test_timeline_svg.c — the per-window memory picture (cost_model.h
 * pt_cost_mem_windows, timeline_svg.h):
 *  - over every knob set of a small model (and a fragmentation factor), the
 *    largest window total is pt_cost_eval's peak exactly, the first window
 *    reaching it is the peak window, the categories add up to each total;
 *  - the SVG of a searched plan is well-formed XML (a small checker below:
 *    balanced tags, quoted attributes, entities, one root <svg>) and its peak
 *    label is the plan's predicted peak in bytes; a hostile title is escaped;
 *  - protrain-plan --timeline writes the same label as the plan's JSON peak.
 * The checker is tested on broken inputs too, so a pass means something.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_files.h"

#include "planner/planner.h"
#include "protrain.h"

/* ---------------- a tiny XML well-formedness checker ---------------- */

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == ':' || c == '.';
}
static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}
/* '&' must start one of the five predefined entities or a numeric reference. */
static const char *entity(const char *p) {
    static const char *ents[] = {"&lt;", "&gt;", "&amp;", "&quot;", "&apos;"};
    for (size_t i = 0; i < 5; i++)
        if (!strncmp(p, ents[i], strlen(ents[i]))) return p + strlen(ents[i]);
    if (p[1] == '#') {
        const char *q = p + 2;
        while ((*q >= '0' && *q <= '9') || *q == 'x') q++;
        if (q > p + 2 && *q == ';') return q + 1;
    }
    return NULL;
}

/* 0 when s is one well-formed document whose root element is `root`;
 * else a short reason. Enough XML for what the writer emits: prolog,
 * elements, attributes, text, entities; no DTD, CDATA or comments. */
static const char *xml_check(const char *s, const char *root) {
    enum { DEPTH = 64 };
    char stack[DEPTH][32];
    int depth = 0, roots = 0;
    const char *p = s;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p) return "unterminated prolog";
        p += 2;
    }
    while (*p) {
        if (*p != '<') {
            if (depth == 0 && !(*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) return "text outside the root";
            if (*p == '>') return "stray '>'";
            if (*p == '&') {
                if (!(p = entity(p))) return "bad entity";
                continue;
            }
            p++;
            continue;
        }
        p++;
        int closing = *p == '/';
        if (closing) p++;
        const char *n0 = p;
        while (name_char(*p)) p++;
        size_t nl = (size_t)(p - n0);
        if (nl == 0 || nl >= sizeof stack[0]) return "bad element name";
        if (closing) {
            p = skip_ws(p);
            if (*p != '>') return "junk in end tag";
            p++;
            if (depth == 0 || strlen(stack[depth - 1]) != nl || strncmp(stack[depth - 1], n0, nl)) return "unbalanced end tag";
            depth--;
            continue;
        }
        if (depth == 0) {
            if (roots++) return "more than one root element";
            if (strlen(root) != nl || strncmp(root, n0, nl)) return "wrong root element";
        }
        /* attributes: name="value" or name='value', each name once is not checked */
        for (;;) {
            const char *q = skip_ws(p);
            if (*q == '>' || (*q == '/' && q[1] == '>')) {
                p = q;
                break;
            }
            if (q == p) return "attributes not separated by space";
            const char *a0 = q;
            while (name_char(*q)) q++;
            if (q == a0) return "bad attribute name";
            q = skip_ws(q);
            if (*q++ != '=') return "attribute without '='";
            q = skip_ws(q);
            char quote = *q;
            if (quote != '"' && quote != '\'') return "unquoted attribute value";
            q++;
            while (*q && *q != quote) {
                if (*q == '<') return "'<' in attribute value";
                if (*q == '&') {
                    if (!(q = entity(q))) return "bad entity in attribute";
                } else {
                    q++;
                }
            }
            if (!*q) return "unterminated attribute value";
            p = q + 1;
        }
        if (*p == '/') {
            p += 2;   /* empty element */
            continue;
        }
        p++;
        if (depth == DEPTH) return "too deep";
        memcpy(stack[depth], n0, nl);
        stack[depth++][nl] = 0;
    }
    if (depth) return "unclosed element";
    if (!roots) return "no root element";
    return NULL;
}

static void test_xml_checker(void **state) {
    (void)state;
    assert_null(xml_check("<?xml version=\"1.0\"?>\n<svg a=\"1\" b='2'><g><rect x=\"0\"/></g><text>a &amp; b</text></svg>\n",
                          "svg"));
    const char *bad[] = {
        "<svg><g></svg>",                 /* unbalanced */
        "<svg><g></g>",                   /* unclosed */
        "<svg x=1></svg>",                /* unquoted */
        "<svg x=\"1></svg>",              /* unterminated */
        "<svg></svg><svg></svg>",         /* two roots */
        "<html></html>",                  /* wrong root */
        "<svg><text>a & b</text></svg>",  /* raw ampersand */
        "<svg><text>a < b</text></svg>",  /* raw '<' */
        "<svg x=\"1\"y=\"2\"></svg>",     /* no space between attributes */
        "<svg></svg>junk",                /* text after the root */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = xml_check(bad[i], "svg");
        if (!why) fprintf(stderr, "accepted: %s\n", bad[i]);
        assert_non_null(why);
    }
}

/* ---------------- the model ---------------- */

static pt_trace T;

static int setup(void **state) {
    (void)state;
    pt_model_shape m;
    memset(&m, 0, sizeof m);
    m.arch = PT_ARCH_GPT;
    m.layers = 6;
    m.hidden = 256;
    m.heads = 4;
    m.vocab = 1000;
    m.seq = 128;
    m.batch = 2;
    m.dtype = PT_BF16;
    m.tied = 1;
    m.trainable_fraction = 1.0;
    pt_hw_shape hw;
    memset(&hw, 0, sizeof hw);
    hw.device_bytes = 1ull << 30;
    hw.h2d_Bps = hw.d2h_Bps = 25e9;
    hw.copy_engines = 2;
    hw.world_size = 1;
    hw.cpu_adam_elems_per_s = 1e9;
    hw.dev_adam_elems_per_s = 5e10;
    hw.flops = 200e12;
    snprintf(hw.device, sizeof hw.device, "test <device> & \"co\"");
    char err[512] = {0};
    if (pt_shape_check(&m, err, sizeof err)) return -1;
    pt_trace_init(&T);
    /* small chunks: several per block, so buffers, prefetch and partial persistence all occur */
    if (pt_shape_trace(&m, &hw, 1u << 20, &T, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    pt_trace_free(&T);
    return 0;
}

/* The windows of k against pt_cost_eval; returns 1 when k is a valid knob set. */
static int check_knobs(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_knobs *k) {
    char err[256];
    pt_cost want, got;
    if (pt_cost_eval(cx, o, k, &want, err, sizeof err)) return 0;
    int32_t n = pt_cost_n_windows(cx);
    pt_mem_window *win = calloc((size_t)n, sizeof *win);
    assert_non_null(win);
    assert_int_equal(pt_cost_mem_windows(cx, o, k, NULL, win, n, &got, err, sizeof err), PT_OK);
    assert_true(got.peak_bytes == want.peak_bytes);
    assert_true(got.iter_s == want.iter_s);
    uint64_t mx = 0;
    for (int32_t i = 0; i < n; i++) {
        const pt_mem_window *w = &win[i];
        uint64_t sum = w->model_state_bytes + w->buffer_bytes + w->nonblock_bytes + w->activation_bytes +
                       w->scratch_bytes;
        assert_true(sum == w->raw_bytes);
        assert_true(w->raw_bytes + w->frag_bytes == w->total_bytes);
        assert_int_equal(pt_cost_window_index(cx, w->phase, w->block), i);
        if (w->total_bytes > mx) mx = w->total_bytes;
    }
    /* the picture's highest point is the plan's peak, at the plan's peak window */
    assert_true(mx == want.peak_bytes);
    int32_t pk = pt_timeline_peak_index(win, n);
    assert_int_equal(win[pk].phase, want.peak_phase);
    assert_int_equal(win[pk].block, want.peak_block);
    assert_true(win[pk].activation_bytes == want.activation_bytes);
    assert_true(win[pk].scratch_bytes == want.scratch_bytes);
    /* too small an array is refused, not overrun */
    assert_int_equal(pt_cost_mem_windows(cx, o, k, NULL, win, n - 1, NULL, err, sizeof err), PT_ERR_INVALID_ARG);
    free(win);
    return 1;
}

static void test_windows_peak_every_knob_set(void **state) {
    (void)state;
    char err[256];
    pt_cost_ctx *cx = NULL;
    assert_int_equal(pt_cost_ctx_new(&T, &cx, err, sizeof err), PT_OK);
    int32_t N = T.n_block, K = T.n_chunk, checked = 0, with_swap = 0, with_buf = 0;
    assert_int_equal(pt_cost_n_windows(cx), 2 * N + 3);
    double frags[] = {1.0, 1.13};
    for (size_t fi = 0; fi < 2; fi++) {
        pt_cost_opts o = {frags[fi], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        for (int32_t p = 0; p <= K; p++) {
            int32_t lo = pt_cost_buffer_min_block(cx, p), nbs[3] = {lo, pt_cost_buffer_min(cx, p), K - p};
            for (int j = 0; j < 3; j++)
                for (int32_t s = 0; s <= N; s++)
                    for (int32_t c = 0; s + c <= N; c++) {
                        pt_knobs k = {p, nbs[j], s, c};
                        if (check_knobs(cx, &o, &k)) {
                            checked++;
                            with_swap += s > 0;
                            with_buf += nbs[j] > 0;
                        }
                    }
        }
    }
    /* the sweep reached swapping and streaming plans, not only the resident one */
    assert_true(checked > 50);
    assert_true(with_swap > 0);
    assert_true(with_buf > 0);
    pt_cost_ctx_free(cx);
}

/* The number in the label "peak N B (...) at WINDOW"; asserts the shape. */
static unsigned long long peak_label(const char *svg, char *where, size_t wlen) {
    const char *p = strstr(svg, "id=\"peak\"");
    assert_non_null(p);
    p = strchr(p, '>');
    assert_non_null(p);
    assert_int_equal(strncmp(p + 1, "peak ", 5), 0);
    char *end;
    unsigned long long v = strtoull(p + 6, &end, 10);
    assert_int_equal(strncmp(end, " B (", 4), 0);
    const char *at = strstr(end, ") at ");
    const char *stop = strchr(end, '<');
    assert_non_null(at);
    assert_true(at < stop);
    snprintf(where, wlen, "%.*s", (int)(stop - at - 5), at + 5);
    /* only one peak label */
    assert_null(strstr(p, "id=\"peak\""));
    return v;
}

static void test_svg_of_searched_plans(void **state) {
    (void)state;
    char err[512], path[] = "/tmp/pt_timeline_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    /* roomy, then tight enough to stream and swap, with fragmentation */
    uint64_t caps[] = {1ull << 30, 0, 0};
    double frags[] = {1.0, 1.0, 1.1};
    int32_t n_swapping = 0;
    for (int i = 0; i < 3; i++) {
        pt_search_opts so;
        pt_search_opts_default(&so);
        so.cost.frag = frags[i];
        so.capacity = caps[i];
        pt_plan plan;
        pt_plan_init(&plan);
        int rc = pt_search(&T, &so, &plan, err, sizeof err);
        if (caps[i] == 0) {
            /* tight: the smallest capacity that works, plus 10% (the search reports it when infeasible) */
            so.capacity = 1ull << 20;
            rc = pt_search(&T, &so, &plan, err, sizeof err);
            assert_int_equal(rc, PT_ERR_INFEASIBLE);
            so.capacity = plan.min_capacity + plan.min_capacity / 10;
            pt_plan_free(&plan);
            pt_plan_init(&plan);
            rc = pt_search(&T, &so, &plan, err, sizeof err);
        }
        if (rc) fprintf(stderr, "%s\n", err);
        assert_int_equal(rc, PT_OK);
        for (int32_t b = 0; b < plan.n_block; b++) n_swapping += plan.modes[b] != PT_BLOCK_NONE;
        /* a measured line on the last one: every other window measured */
        uint64_t meas[64] = {0};
        assert_true(2 * T.n_block + 3 <= 64);
        for (int32_t w = 0; w < 2 * T.n_block + 3; w += 2) meas[w] = plan.cost.peak_bytes / 2 + (uint64_t)w;
        assert_int_equal(pt_timeline_svg_plan(&T, &plan, i == 2 ? meas : NULL, path, err, sizeof err), PT_OK);
        char *svg = pt_test_slurp(path);
        assert_non_null(svg);
        const char *why = xml_check(svg, "svg");
        if (why) fprintf(stderr, "not well-formed: %s\n", why);
        assert_null(why);
        char where[64], want_where[64];
        assert_true(peak_label(svg, where, sizeof where) == plan.cost.peak_bytes);
        pt_mem_window pw = {.phase = plan.cost.peak_phase, .block = plan.cost.peak_block};
        pt_timeline_window_name(&pw, want_where, sizeof want_where);
        assert_string_equal(where, want_where);
        /* the device name went through escaping */
        assert_non_null(strstr(svg, "test &lt;device&gt; &amp; &quot;co&quot;"));
        assert_non_null(strstr(svg, "capacity "));
        if (i == 2) assert_non_null(strstr(svg, ">measured</text>"));
        free(svg);
        pt_plan_free(&plan);
    }
    assert_true(n_swapping > 0);   /* a tight plan checkpoints or swaps */
    /* an unwritable path is an error, not a crash */
    pt_plan plan;
    pt_plan_init(&plan);
    pt_search_opts so;
    pt_search_opts_default(&so);
    so.capacity = 1ull << 30;
    assert_int_equal(pt_search(&T, &so, &plan, err, sizeof err), PT_OK);
    assert_int_equal(pt_timeline_svg_plan(&T, &plan, NULL, "/nonexistent-dir/x.svg", err, sizeof err), PT_ERR_IO);
    pt_plan_free(&plan);
    unlink(path);
}

/* protrain-plan --timeline: label == the JSON's peak_bytes. */
static void test_cli_timeline(void **state) {
    (void)state;
    const char *bd = getenv("PT_BUILD");
    if (!bd) skip();
    char dir[] = "/tmp/pt_tl_cli_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[1024], svgp[128], outp[128];
    snprintf(svgp, sizeof svgp, "%s/t.svg", dir);
    snprintf(outp, sizeof outp, "%s/out.json", dir);
    snprintf(cmd, sizeof cmd,
             "'%s/protrain-plan' --json --layers 12 --hidden 768 --heads 12 --seq 1024 --batch 8 --flash_attn 1 "
             "--device_memory_gib 8 --timeline '%s' > '%s'",
             bd, svgp, outp);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *js = pt_test_slurp(outp), *svg = pt_test_slurp(svgp);
    assert_non_null(js);
    assert_non_null(svg);
    const char *p = strstr(js, "\"peak_bytes\":");
    assert_non_null(p);
    unsigned long long want = strtoull(p + strlen("\"peak_bytes\":"), NULL, 10);
    assert_null(xml_check(svg, "svg"));
    char where[64];
    assert_true(peak_label(svg, where, sizeof where) == want);
    free(js);
    free(svg);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_checker),
        cmocka_unit_test(test_windows_peak_every_knob_set),
        cmocka_unit_test(test_svg_of_searched_plans),
        cmocka_unit_test(test_cli_timeline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
