/* kvs_test_redis.h - real redis-server processes for the tests that need
 * them (test_l2_redis, test_multi_wrapper): started on free loopback
 * ports, and stopped (SIGKILL + waitpid) at exit, also when a check fails
 * or a fatal signal arrives. Header-only: a test includes it once. Call
 * kvs_test_redis_init() first; it makes tmpdir and installs the exit and
 * signal handlers. */
#ifndef KVS_TEST_REDIS_H
#define KVS_TEST_REDIS_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

extern char **environ;

#define MAX_SERVERS 8

/* ---------------------------------------------------------------------
 * Servers
 * ------------------------------------------------------------------ */

typedef struct server {
    pid_t pid; /* 0: not running */
    int port;
} server;

static server servers[MAX_SERVERS];
static char tmpdir[64];

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline void kill_server(server *s)
{
    if (s->pid <= 0) return;
    kill(s->pid, SIGKILL);
    while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    s->pid = 0;
}

static inline int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* atexit: every server goes, whatever happened. */
static inline void cleanup(void)
{
    for (int i = 0; i < MAX_SERVERS; i++) kill_server(&servers[i]);
    if (tmpdir[0]) nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fatal signal: kill the servers (kill() is async-signal-safe), then die
 * of the signal. */
static inline void on_fatal(int sig)
{
    for (int i = 0; i < MAX_SERVERS; i++)
        if (servers[i].pid > 0) kill(servers[i].pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* 1 if nothing listens on 127.0.0.1:port (we can bind it). */
static inline int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A free port in [20000, 30000) whose cluster bus port (+10000) is free
 * too, and not one of ours. */
static inline int pick_port(void)
{
    for (;;) {
        int p = 20000 + rand() % 10000;
        int taken = 0;
        for (int i = 0; i < MAX_SERVERS; i++) taken |= servers[i].port == p;
        if (!taken && port_free(p) && port_free(p + 10000)) return p;
    }
}

/* Start redis-server on s->port (pick one if 0). extra: more "--opt",
 * "value" arguments, NULL-terminated. */
static inline int start_server(server *s, int cluster, const char *const *extra)
{
    if (s->port == 0) s->port = pick_port();
    char port[16], logf[128], conf[128];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(logf, sizeof logf, "%s/redis-%d.log", tmpdir, s->port);
    snprintf(conf, sizeof conf, "%s/nodes-%d.conf", tmpdir, s->port);
    const char *argv[40];
    int k = 0;
    const char *base[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--daemonize", "no", "--dir", tmpdir,
                          "--logfile", logf};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) argv[k++] = base[i];
    if (cluster) {
        const char *c[] = {"--cluster-enabled", "yes", "--cluster-config-file", conf,
                           "--cluster-node-timeout", "5000"};
        for (size_t i = 0; i < sizeof c / sizeof *c; i++) argv[k++] = c[i];
    }
    for (size_t i = 0; extra && extra[i]; i++) argv[k++] = extra[i];
    argv[k] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    /* stderr too: a server that outlives a crashed test must not hold the
     * test runner's output pipe open (ctest would wait for its timeout). */
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, "redis-server", &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "cannot start redis-server: %s\n", strerror(rc));
        return -1;
    }
    s->pid = pid;
    /* Up when it answers PING; gone if it exits first. */
    int64_t until = now_ms() + 10000;
    while (now_ms() < until) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            fprintf(stderr, "redis-server on port %d exited at start (see %s)\n", s->port,
                    logf);
            return -1;
        }
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
        if (c && !c->err) {
            redisSetTimeout(c, tv);
            redisReply *r = redisCommand(c, "PING");
            int ok = r && (r->type == REDIS_REPLY_STATUS ||
                           (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0));
            if (r) freeReplyObject(r);
            redisFree(c);
            if (ok) return 0;
        } else if (c) {
            redisFree(c);
        }
        sleep_ms(20);
    }
    fprintf(stderr, "redis-server on port %d does not answer PING\n", s->port);
    return -1;
}

/* A slot in servers[] for a new server. */
static inline server *new_server(void)
{
    for (int i = 0; i < MAX_SERVERS; i++)
        if (servers[i].pid == 0 && servers[i].port == 0) return &servers[i];
    abort();
}

/* Run a program to completion; its exit status, or -1. */
static inline int run_program(const char *const *argv, const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* 1 if `prog` is on PATH. */
static inline int on_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (path == NULL) path = "/usr/local/bin:/usr/bin:/bin";
    char buf[4096];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, prog);
        if (access(buf, X_OK) == 0) return 1;
        p += len;
        if (*p == ':') p++;
    }
    return 0;
}

/* Make tmpdir, and make sure every server goes at exit or on a fatal
 * signal. 0, or -1 with a message. */
static inline int kvs_test_redis_init(void)
{
    srand((unsigned)(getpid() ^ time(NULL)));
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvs_redis_test_XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return -1;
    }
    atexit(cleanup);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_fatal);
    return 0;
}

#endif /* KVS_TEST_REDIS_H */
