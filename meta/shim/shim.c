/*
 * plexus: the CNI binary a container runtime execs.
 *
 * It forwards the call (the CNI_* environment and stdin) to the Plexus node daemon
 * over a unix socket and prints the daemon's answer, so each call costs a process
 * start of well under a millisecond instead of a Python interpreter's ~25 ms.
 * Without a daemon socket it execs `plexus-thin` next to itself, which runs the
 * engine in-process. Wire format: meta/daemon/protocol.py.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAGIC "PXS1"
#define MAX_STDIN (8u << 20)
#define DEFAULT_SOCKET_DIR "/run/plexus"
#define SOCKET_NAME "plexus.sock"

extern char **environ;

/* The config's cniVersion once stdin is read (errors are reported in it, as the spec asks). */
static const char *version = "1.0.0";

static void fail(int code, const char *msg, const char *details) {
    /* A CNI error on stdout; messages here never contain JSON specials. */
    printf("{\"cniVersion\":\"%s\",\"code\":%d,\"msg\":\"%s\",\"details\":\"%s\"}\n",
           version, code, msg, details);
    exit(1);
}

static char *top_level_string(const char *json, size_t len, const char *key);

/* Take the config's cniVersion for errors if it looks like one (digits and dots). */
static void use_config_version(const char *json, size_t len) {
    char *v = top_level_string(json, len, "cniVersion");
    if (!v || !*v || strlen(v) > 16 || strspn(v, "0123456789.") != strlen(v)) {
        free(v);
        return;
    }
    version = v;
}

static char *read_stdin(size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) fail(5, "plexus shim: out of memory", "");
        ssize_t r = read(0, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(5, "plexus shim: cannot read stdin", strerror(errno));
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) {
            if (cap >= MAX_STDIN) {
                use_config_version(buf, n);
                fail(6, "plexus shim: config on stdin is too large", "");
            }
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The string value of a top-level key of a JSON object, or NULL. Escapes are not
 * decoded: a socket path has none. */
static char *top_level_string(const char *json, size_t len, const char *key) {
    size_t klen = strlen(key);
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (c == '{' || c == '[') { depth++; continue; }
        if (c == '}' || c == ']') { depth--; continue; }
        if (c != '"') continue;
        size_t start = ++i;
        while (i < len && json[i] != '"') i += (json[i] == '\\') ? 2 : 1;
        if (i >= len) return NULL;
        if (depth != 1 || i - start != klen || strncmp(json + start, key, klen) != 0) continue;
        size_t j = i + 1;
        while (j < len && (json[j] == ' ' || json[j] == '\t' || json[j] == '\n' || json[j] == '\r')) j++;
        if (j >= len || json[j] != ':') continue;
        j++;
        while (j < len && (json[j] == ' ' || json[j] == '\t' || json[j] == '\n' || json[j] == '\r')) j++;
        if (j >= len || json[j] != '"') return NULL;
        size_t vstart = ++j;
        while (j < len && json[j] != '"') j += (json[j] == '\\') ? 2 : 1;
        if (j >= len) return NULL;
        return strndup(json + vstart, j - vstart);
    }
    return NULL;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static uint32_t get_u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w; len -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r; len -= (size_t)r;
    }
    return 0;
}

/* No daemon: hand stdin to the in-process fallback beside this binary. */
static void exec_thin(const char *input, size_t len, const char *why) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 32);
    if (n < 0) fail(5, "plexus shim: no daemon and cannot locate plexus-thin", why);
    self[n] = '\0';
    char thin[PATH_MAX];
    snprintf(thin, sizeof thin, "%s/plexus-thin", dirname(self));
    int fd = memfd_create("plexus-stdin", 0);
    if (fd < 0 || write_all(fd, input, len) < 0 || lseek(fd, 0, SEEK_SET) < 0 || dup2(fd, 0) < 0)
        fail(5, "plexus shim: cannot pass stdin to plexus-thin", strerror(errno));
    char *argv[] = {thin, NULL};
    execv(thin, argv);
    fail(50, "plexus daemon unavailable and plexus-thin cannot run", why);
}

int main(void) {
    size_t in_len;
    char *input = read_stdin(&in_len);
    use_config_version(input, in_len);
    char *dir = top_level_string(input, in_len, "socketDir");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int plen = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s",
                        dir && *dir ? dir : DEFAULT_SOCKET_DIR, SOCKET_NAME);
    if (plen < 0 || (size_t)plen >= sizeof addr.sun_path)
        fail(7, "plexus shim: socketDir is too long for a unix socket path", "");

    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) fail(5, "plexus shim: cannot create a socket", strerror(errno));
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno == ENOENT || errno == ECONNREFUSED) exec_thin(input, in_len, addr.sun_path);
        fail(11, "plexus shim: cannot connect to the plexus daemon", strerror(errno));
    }

    size_t env_len = 0;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "CNI_", 4) == 0) env_len += strlen(*e) + 1;
    size_t frame_len = 4 + 4 + env_len + 4 + in_len;
    unsigned char *frame = malloc(frame_len), *p = frame;
    if (!frame) fail(5, "plexus shim: out of memory", "");
    memcpy(p, MAGIC, 4); p += 4;
    put_u32(p, (uint32_t)env_len); p += 4;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "CNI_", 4) != 0) continue;
        size_t l = strlen(*e) + 1;
        memcpy(p, *e, l); p += l;
    }
    put_u32(p, (uint32_t)in_len); p += 4;
    memcpy(p, input, in_len);
    if (write_all(sock, frame, frame_len) < 0)
        fail(11, "plexus shim: the plexus daemon closed the connection", strerror(errno));
    shutdown(sock, SHUT_WR);

    unsigned char head[12];
    if (read_all(sock, head, sizeof head) < 0 || memcmp(head, MAGIC, 4) != 0)
        fail(11, "plexus shim: no answer from the plexus daemon (it may have restarted)",
             "the runtime will retry");
    uint32_t code = get_u32(head + 4), out_len = get_u32(head + 8);
    char *out = malloc((size_t)out_len + 1);
    if (!out || read_all(sock, out, out_len) < 0)
        fail(11, "plexus shim: truncated answer from the plexus daemon", "the runtime will retry");
    if (write_all(1, out, out_len) < 0) return 1;
    return (int)code;
}
