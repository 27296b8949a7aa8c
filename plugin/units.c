/*
 * units.c — the readers of a size ("1.5 GiB", exact in integers), a rate
 * ("12 GB/s") and a duration ("250 ms") that INI values and command lines use
 * (config.h pt_parse_*). Decimal units are powers of 1000, binary ones (kib,
 * mib, ...) powers of 1024; a bare number is bytes, bytes per second or seconds.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "protrain.h"

static const struct unit {
    const char *name;
    uint64_t mult;
} units[] = {{"", 1}, {"b", 1}, {"kb", 1000ull}, {"mb", 1000000ull}, {"gb", 1000000000ull}, {"tb", 1000000000000ull}, {"kib", 1ull << 10}, {"mib", 1ull << 20}, {"gib", 1ull << 30}, {"tib", 1ull << 40}};

/* Parses "<digits>[.<digits>]" exactly: ip = integer part, frac/10^nfrac the rest.
 * Returns the end pointer, or NULL on a malformed number or > 19 integer digits. */
static const char *parse_decimal(const char *p, uint64_t *ip, uint64_t *frac, uint64_t *scale) {
    uint64_t a = 0, f = 0, sc = 1;
    if (!isdigit((unsigned char)*p)) return NULL;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (a > (UINT64_MAX - d) / 10) return NULL;
        a = a * 10 + d;
    }
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return NULL;
        /* Digits past 1e18 cannot change a byte count below 2^64 by a whole byte
         * after the multiply below; they are read and dropped. */
        for (; isdigit((unsigned char)*p); p++)
            if (sc < 1000000000000000000ull) f = f * 10 + (unsigned)(*p - '0'), sc *= 10;
    }
    *ip = a, *frac = f, *scale = sc;
    return p;
}

static const struct unit *find_unit(const char *p, size_t n) {
    char u[8];
    if (n >= sizeof(u)) return NULL;
    for (size_t i = 0; i < n; i++) u[i] = (char)tolower((unsigned char)p[i]);
    u[n] = '\0';
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcmp(u, units[i].name)) return &units[i];
    return NULL;
}

int pt_parse_size(const char *s, uint64_t *out) {
    if (!s || !out) return PT_ERR_CONFIG;
    while (isspace((unsigned char)*s)) s++;
    uint64_t ip, frac, sc;
    const char *p = parse_decimal(s, &ip, &frac, &sc);
    if (!p) return PT_ERR_CONFIG;
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strlen(p);
    while (n && isspace((unsigned char)p[n - 1])) n--;
    const struct unit *u = find_unit(p, n);
    if (!u) return PT_ERR_CONFIG;
    uint64_t m = u->mult;
    if (ip > UINT64_MAX / m) return PT_ERR_CONFIG;
    /* bytes = ip*m + floor(frac*m/sc), exact: frac < sc <= 1e18 and m <= 2^40, so
     * frac*m < 2^100 fits in 128 bits and part < m. */
    uint64_t part = (uint64_t)((unsigned __int128)frac * m / sc), whole = ip * m;
    if (whole > UINT64_MAX - part) return PT_ERR_CONFIG;
    *out = whole + part;
    return PT_OK;
}

/* "<non-negative number><blanks><unit>": *x the number, [*unit, *unit + *n) the
 * unit text with trailing blanks cut (may be empty). 0 or PT_ERR_CONFIG. */
static int number_unit(const char *s, double *x, const char **unit, size_t *n) {
    if (!s) return PT_ERR_CONFIG;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s) && *s != '.') return PT_ERR_CONFIG;
    char *end;
    errno = 0;
    *x = strtod(s, &end);
    if (errno || end == s || !isfinite(*x) || *x < 0) return PT_ERR_CONFIG;
    const char *p = end;
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strlen(p);
    while (len && isspace((unsigned char)p[len - 1])) len--;
    *unit = p;
    *n = len;
    return PT_OK;
}

int pt_parse_rate(const char *s, double *out) {
    double x;
    const char *p;
    size_t n;
    if (!out || number_unit(s, &x, &p, &n)) return PT_ERR_CONFIG;
    if (n >= 2 && p[n - 2] == '/' && (p[n - 1] == 's' || p[n - 1] == 'S')) n -= 2;
    else if (n) return PT_ERR_CONFIG; /* a unit must be a rate: "GiB/s", not "GiB" */
    /* rates reach 1 PB/s (copy_bandwidth's limit), a unit no size needs */
    double mult;
    if (n == 2 && !strncasecmp(p, "pb", 2)) mult = 1e15;
    else if (n == 3 && !strncasecmp(p, "pib", 3)) mult = 1125899906842624.0;   /* 2^50 */
    else {
        const struct unit *u = find_unit(p, n);
        if (!u) return PT_ERR_CONFIG;
        mult = (double)u->mult;
    }
    double r = x * mult;
    if (!isfinite(r)) return PT_ERR_CONFIG;
    *out = r;
    return PT_OK;
}

int pt_parse_duration(const char *s, double *out) {
    double x;
    const char *p;
    size_t n;
    if (!out || number_unit(s, &x, &p, &n)) return PT_ERR_CONFIG;
    static const struct {
        const char *u;
        double m;
    } units[] = {
        {"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
    double m = -1.0;
    if (n == 0) m = 1.0;   /* no unit: seconds, the unit every duration key is kept in */
    for (size_t i = 0; i < sizeof units / sizeof units[0] && m < 0; i++)
        if (strlen(units[i].u) == n && !strncasecmp(p, units[i].u, n)) m = units[i].m;
    if (m < 0) return PT_ERR_CONFIG;
    *out = x * m;
    return PT_OK;
}
