/* trace.json writer (see trace.h). */
#include "engine/exec/record/trace.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char name[64];
    char cat[16];
    int track;      /* 0 for counters */
    double t0, t1;  /* seconds */
    double value;   /* counters */
    size_t bytes;
} trace_event_t;

struct eng_trace {
    char path[1100];
    pthread_mutex_t lock;
    trace_event_t *ev;
    size_t n, cap;
    double origin; /* first event's time: trace timestamps start near 0 */
    int have_origin;
    json_t *extra; /* events from eng_trace_add_events_json, "ts" on the absolute clock */
};

mt_status_t eng_trace_open(const char *path, eng_trace_t **out, mt_error_t *err) {
    eng_trace_t *t = calloc(1, sizeof *t);
    MT_CHECK_ALLOC(t, "trace");
    if (strlen(path) >= sizeof t->path) {
        free(t);
        return mt_error_set(err, MT_ERR_IO, "trace path too long: %s", path);
    }
    strcpy(t->path, path);
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return MT_OK;
}

static trace_event_t *push(eng_trace_t *t) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4096;
        t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
        MT_CHECK_ALLOC(t->ev, "trace events");
    }
    return &t->ev[t->n++];
}

static void set_origin(eng_trace_t *t, double ts) {
    if (!t->have_origin || ts < t->origin) {
        t->origin = ts;
        t->have_origin = 1;
    }
}

void eng_trace_span(eng_trace_t *t, eng_track_t track, const char *name, const char *cat, double t0_s,
                    double t1_s, size_t bytes) {
    if (!t) return;
    pthread_mutex_lock(&t->lock);
    trace_event_t *e = push(t);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->cat, sizeof e->cat, "%s", cat);
    e->track = (int)track;
    e->t0 = t0_s;
    e->t1 = t1_s;
    e->bytes = bytes;
    set_origin(t, t0_s);
    pthread_mutex_unlock(&t->lock);
}

void eng_trace_counter(eng_trace_t *t, const char *name, double t_s, double value) {
    if (!t) return;
    pthread_mutex_lock(&t->lock);
    trace_event_t *e = push(t);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cat[0] = '\0';
    e->track = 0;
    e->t0 = e->t1 = t_s;
    e->value = value;
    set_origin(t, t_s);
    pthread_mutex_unlock(&t->lock);
}

mt_status_t eng_trace_add_events_json(eng_trace_t *t, const char *events, mt_error_t *err) {
    if (!t || !events) return MT_OK;
    const size_t len = strlen(events);
    char *text = malloc(len + 3);
    MT_CHECK_ALLOC(text, "trace events text");
    text[0] = '[';
    memcpy(text + 1, events, len);
    text[len + 1] = ']';
    text[len + 2] = '\0';
    json_error_t je;
    json_t *arr = json_loads(text, 0, &je);
    free(text);
    if (!arr || !json_is_array(arr)) {
        json_decref(arr);
        return mt_error_set(err, MT_ERR_INTERNAL, "trace: extra events do not parse: %s (column %d)", je.text,
                            je.column);
    }
    pthread_mutex_lock(&t->lock);
    if (!t->extra) t->extra = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        json_t *ts = json_object_get(e, "ts");
        if (json_is_number(ts)) set_origin(t, json_number_value(ts) * 1e-6);
    }
    json_array_extend(t->extra, arr);
    pthread_mutex_unlock(&t->lock);
    json_decref(arr);
    return MT_OK;
}

mt_status_t eng_trace_close(eng_trace_t *t, mt_error_t *err) {
    if (!t) return MT_OK;
    static const char *const k_tracks[] = {NULL, "compute", "H2D copies", "D2H copies", "host optimizer"};
    json_t *events = json_array();
    for (int tr = 1; tr <= 4; tr++) {
        json_t *m = json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "ph", "M", "name", "thread_name", "pid", 1, "tid",
                              tr, "args", "name", k_tracks[tr]);
        json_array_append_new(events, m);
    }
    for (size_t i = 0; i < t->n; i++) {
        const trace_event_t *e = &t->ev[i];
        const double ts = (e->t0 - t->origin) * 1e6;
        json_t *o;
        if (e->track == 0) {
            o = json_pack("{s:s, s:s, s:f, s:i, s:{s:f}}", "ph", "C", "name", e->name, "ts", ts, "pid", 1, "args",
                          "bytes", e->value);
        } else {
            o = json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i}", "ph", "X", "name", e->name, "cat", e->cat, "ts", ts,
                          "dur", (e->t1 - e->t0) * 1e6, "pid", 1, "tid", e->track);
            if (e->bytes) json_object_set_new(o, "args", json_pack("{s:I}", "bytes", (json_int_t)e->bytes));
        }
        json_array_append_new(events, o);
    }
    size_t i;
    json_t *e;
    json_array_foreach(t->extra, i, e) {
        json_t *ts = json_object_get(e, "ts");
        if (json_is_number(ts)) json_object_set_new(e, "ts", json_real(json_number_value(ts) - t->origin * 1e6));
        json_array_append(events, e);
    }
    json_decref(t->extra);
    json_t *root = json_pack("{s:o, s:s}", "traceEvents", events, "displayTimeUnit", "ms");
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", t->path, (int)getpid()); /* never a name another process writes */
    mt_status_t st = MT_OK;
    if (json_dump_file(root, tmp, JSON_COMPACT) != 0 || rename(tmp, t->path) != 0)
        st = mt_error_set(err, MT_ERR_IO, "cannot write trace %s: %s", t->path, strerror(errno));
    json_decref(root);
    pthread_mutex_destroy(&t->lock);
    free(t->ev);
    free(t);
    return st;
}
