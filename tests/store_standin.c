/* A stand-in for the store torchrun's agent hosts (PyTorch's TCPStore), for
 * testing the torchrun-style rendezvous (kernels/cpu/comm_tcp.c) where
 * PyTorch is not installed: listens on 127.0.0.1:PORT and serves the four
 * commands moetune sends, in the store's wire format (a command byte;
 * integers in host order; keys and values as a u64 length and the bytes):
 * VALIDATE (the magic number 0x3C85F7CE), SET, WAIT (answered with one zero
 * byte once every key exists), GET (answered with the value).  Like the
 * real store it requires VALIDATE first and closes a connection that sends
 * anything else.  Runs until killed.  Usage: store_standin PORT */
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAX_CLIENTS = 64, MAX_KEYS = 64, BUF = 4096 };
enum { VALIDATE = 0, SET = 1, GET = 3, WAIT = 6 };

typedef struct {
    int fd;
    int validated;
    char buf[BUF];
    size_t len;
    char waiting[256]; /* the key this client waits for ("" none) */
} client_t;

static struct {
    char key[256];
    char value[512];
    uint64_t value_len;
} keys[MAX_KEYS];
static int nkeys;
static client_t clients[MAX_CLIENTS];

static int find_key(const char *k) {
    for (int i = 0; i < nkeys; i++)
        if (strcmp(keys[i].key, k) == 0) return i;
    return -1;
}

static void drop(client_t *c) {
    close(c->fd);
    c->fd = -1;
}

/* A string (u64 length, bytes) at *at of c's buffer: 0 until it is whole,
 * -1 when malformed. */
static int take_string(client_t *c, size_t *at, char *out, size_t cap, uint64_t *out_len) {
    uint64_t n;
    if (c->len < *at + sizeof n) return 0;
    memcpy(&n, c->buf + *at, sizeof n);
    if (n >= cap) return -1;
    if (c->len < *at + sizeof n + n) return 0;
    memcpy(out, c->buf + *at + sizeof n, n);
    out[n] = '\0';
    if (out_len) *out_len = n;
    *at += sizeof n + n;
    return 1;
}

static void answer_waiters(void) {
    for (int i = 0; i < MAX_CLIENTS; i++) {
        client_t *c = &clients[i];
        if (c->fd < 0 || !c->waiting[0] || find_key(c->waiting) < 0) continue;
        const uint8_t stop = 0;
        if (write(c->fd, &stop, 1) != 1) drop(c);
        c->waiting[0] = '\0';
    }
}

/* Serves every whole command in c's buffer. */
static void serve(client_t *c) {
    for (;;) {
        if (c->len == 0) return;
        const uint8_t cmd = (uint8_t)c->buf[0];
        size_t at = 1;
        char key[256], value[512];
        uint64_t value_len = 0;
        int whole = 1;
        if (!c->validated && cmd != VALIDATE) {
            drop(c);
            return;
        }
        if (cmd == VALIDATE) {
            uint32_t magic;
            if (c->len < at + sizeof magic) return;
            memcpy(&magic, c->buf + at, sizeof magic);
            if (magic != 0x3C85F7CEu) {
                drop(c);
                return;
            }
            at += sizeof magic;
            c->validated = 1;
        } else if (cmd == SET) {
            whole = take_string(c, &at, key, sizeof key, NULL);
            if (whole > 0) whole = take_string(c, &at, value, sizeof value, &value_len);
            if (whole > 0) {
                int k = find_key(key);
                if (k < 0 && nkeys < MAX_KEYS) k = nkeys++;
                if (k >= 0) {
                    strcpy(keys[k].key, key);
                    memcpy(keys[k].value, value, value_len);
                    keys[k].value_len = value_len;
                }
            }
        } else if (cmd == WAIT) {
            uint64_t count;
            if (c->len < at + sizeof count) return;
            memcpy(&count, c->buf + at, sizeof count);
            at += sizeof count;
            whole = count == 1 ? take_string(c, &at, key, sizeof key, NULL) : -1;
            if (whole > 0) strcpy(c->waiting, key);
        } else if (cmd == GET) {
            whole = take_string(c, &at, key, sizeof key, NULL);
            if (whole > 0) {
                const int k = find_key(key);
                const uint64_t n = k >= 0 ? keys[k].value_len : 0;
                if (write(c->fd, &n, sizeof n) != (ssize_t)sizeof n ||
                    (n && write(c->fd, keys[k].value, n) != (ssize_t)n)) {
                    drop(c);
                    return;
                }
            }
        } else {
            whole = -1;
        }
        if (whole < 0) {
            drop(c);
            return;
        }
        if (whole == 0) return;
        memmove(c->buf, c->buf + at, c->len - at);
        c->len -= at;
        answer_waiters();
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: store_standin PORT\n");
        return 2;
    }
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 16) != 0) {
        perror("store_standin: bind");
        return 1;
    }
    for (int i = 0; i < MAX_CLIENTS; i++) clients[i].fd = -1;
    for (;;) {
        struct pollfd p[MAX_CLIENTS + 1];
        p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < MAX_CLIENTS; i++) p[i + 1] = (struct pollfd){.fd = clients[i].fd, .events = POLLIN};
        if (poll(p, MAX_CLIENTS + 1, -1) < 0) continue;
        if (p[0].revents & POLLIN) {
            const int fd = accept(lfd, NULL, NULL);
            for (int i = 0; i < MAX_CLIENTS && fd >= 0; i++)
                if (clients[i].fd < 0) {
                    clients[i] = (client_t){.fd = fd};
                    break;
                }
        }
        for (int i = 0; i < MAX_CLIENTS; i++) {
            client_t *c = &clients[i];
            if (c->fd < 0 || !(p[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            const ssize_t n = read(c->fd, c->buf + c->len, BUF - c->len);
            if (n <= 0) {
                drop(c);
                continue;
            }
            c->len += (size_t)n;
            serve(c);
        }
    }
}
