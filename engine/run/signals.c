/* See signals.h. */
#include "engine/run/signals.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop_signal;
static struct sigaction g_old_int, g_old_term;
static bool g_installed;

static void on_signal(int sig) {
    if (g_stop_signal) _exit(128 + sig); /* the second one: now, nothing buffered is flushed */
    g_stop_signal = sig;
    static const char msg[] = "\nmoetune: stopping after this optimizer step and saving a checkpoint "
                              "(send the signal again to exit at once)\n";
    ssize_t w = write(2, msg, sizeof msg - 1); /* async-signal-safe, unlike fprintf */
    (void)w;
}

void eng_signals_install(void) {
    g_stop_signal = 0;
    if (g_installed) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* file writes and waits carry on; the loop polls the flag */
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    g_installed = true;
}

void eng_signals_restore(void) {
    if (!g_installed) return;
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
    g_installed = false;
}

int eng_signals_pending(void) { return g_stop_signal; }

const char *eng_signal_name(int sig) {
    if (sig == SIGINT) return "SIGINT";
    if (sig == SIGTERM) return "SIGTERM";
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}
