/*
 * comm/socket.c - TCP socket helpers with deadlines for the bootstrap:
 * listen, connect, accept, read/write exactly n bytes.  Every socket is
 * non-blocking from birth and every wait is a poll() bounded by a deadline,
 * retried on EINTR.  Also the data-path tuning (TCP_NODELAY, no SIGPIPE).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm_wire.h"

int tp_sock_send_flags(void)
{
#ifdef MSG_NOSIGNAL
    return MSG_NOSIGNAL;
#else
    return 0;
#endif
}

void tp_sock_close(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0) return -1;
    if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

static void no_sigpipe(int fd)
{
#ifdef SO_NOSIGPIPE
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#else
    (void)fd;
#endif
}

/* Milliseconds left before deadline for poll(), at least 0. */
static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = tp_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > 1000000u ? 1000000 : (int)ms;
}

static enum tp_status wait_fd(int fd, short ev, uint64_t deadline_ns, struct tp_error *err, const char *what)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = ev, .revents = 0};
        int left = ms_left(deadline_ns);
        int r = poll(&p, 1, left);
        if (r > 0) return TP_OK;
        if (r == 0 || left == 0) return tp_error_set(err, TP_ERR_TIMEOUT, "timed out while %s", what);
        if (errno != EINTR) return tp_error_set(err, TP_ERR_IO, "poll failed while %s: %s", what, strerror(errno));
    }
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    return getaddrinfo(host && *host ? host : NULL, ps, &hints, res);
}

/* All interfaces: an IPv6 dual-stack socket (IPv4 peers arrive v4-mapped)
 * where the system has IPv6, else plain IPv4. */
static int socket_any(int port, int *fd_out)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd >= 0) {
        int zero = 0, one = 1;
        struct sockaddr_in6 a6;
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)port);
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0 &&
            bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0) {
            *fd_out = fd;
            return 0;
        }
        int e = errno;
        close(fd);
        if (e == EADDRINUSE) {
            errno = e;
            return -1;
        }
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int one = 1;
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *fd_out = fd;
    return 0;
}

int tp_sock_adopt_listener(int fd, int port)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int type = 0;
    socklen_t tl = sizeof type;
    if (fd < 3 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return -1;
    int bound = ss.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                : ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : -1;
    if (bound != port || listen(fd, 64) != 0 || set_nonblock(fd) != 0) return -1;
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    return 0;
}

enum tp_status tp_comm_hold_loopback_ports(int n, int *ports, int *fds, struct tp_error *err)
{
    for (int i = 0; i < n; i++) fds[i] = -1;
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        /* SO_REUSEADDR like every comm listener: connections accepted on it inherit the flag, so after
         * the rank dies (or re-forms its group) its port can be bound again at once despite TIME_WAIT */
        int one = 1;
        if (fds[i] < 0 || setsockopt(fds[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            fcntl(fds[i], F_SETFD, FD_CLOEXEC) != 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            listen(fds[i], 64) != 0 || getsockname(fds[i], (struct sockaddr *)&a, &al) != 0) {
            const int e = errno;
            for (int k = 0; k <= i; k++) tp_sock_close(&fds[k]);
            return tp_error_set(err, TP_ERR_IO, "cannot hold a free port on 127.0.0.1: %s", strerror(e));
        }
        ports[i] = ntohs(a.sin_port);
    }
    return TP_OK;
}

enum tp_status tp_sock_listen(const char *host, int port, int *fd_out, int *port_out, struct tp_error *err)
{
    *fd_out = -1;
    int fd = -1;
    if (!host || !*host) {
        if (socket_any(port, &fd) != 0) {
            int e = errno;
            if (e == EADDRINUSE)
                return tp_error_set(err, TP_ERR_IO,
                                    "port %d is already in use (another process listens there): stop it or pick a "
                                    "free port in the hostfile / TP_COORDINATOR",
                                    port);
            return tp_error_set(err, TP_ERR_IO, "cannot bind port %d: %s", port, strerror(e));
        }
    } else {
        struct addrinfo *res = NULL;
        int gr = resolve(host, port, 1, &res);
        if (gr != 0)
            return tp_error_set(err, TP_ERR_INVALID_ARG, "cannot resolve listen address '%s': %s", host,
                                gai_strerror(gr));
        fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
        if (fd < 0) {
            freeaddrinfo(res);
            return tp_error_set(err, TP_ERR_IO, "socket() failed: %s", strerror(errno));
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
            int e = errno;
            freeaddrinfo(res);
            close(fd);
            if (e == EADDRINUSE)
                return tp_error_set(err, TP_ERR_IO,
                                    "port %d is already in use (another process listens there): stop it or pick a "
                                    "free port in the hostfile / TP_COORDINATOR",
                                    port);
            if (e == EADDRNOTAVAIL)
                return tp_error_set(err, TP_ERR_IO,
                                    "cannot listen on %s port %d: that is not an address of this machine (a rank "
                                    "listens only on its own hostfile / coordinator address: put this host's address "
                                    "there)",
                                    host, port);
            return tp_error_set(err, TP_ERR_IO, "cannot bind %s port %d: %s", host, port, strerror(e));
        }
        freeaddrinfo(res);
    }
    if (listen(fd, 64) != 0 || set_nonblock(fd) != 0) {
        int e = errno;
        close(fd);
        return tp_error_set(err, TP_ERR_IO, "listen on port %d failed: %s", port, strerror(e));
    }
    if (port_out) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        *port_out = port;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            if (ss.ss_family == AF_INET) *port_out = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            else if (ss.ss_family == AF_INET6) *port_out = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    *fd_out = fd;
    return TP_OK;
}

enum tp_status tp_sock_connect(const char *host, int port, uint64_t deadline_ns, int *fd_out, int *refused,
                               struct tp_error *err)
{
    *fd_out = -1;
    *refused = 0;
    struct addrinfo *res = NULL;
    int gr = resolve(host, port, 0, &res);
    if (gr != 0)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "cannot resolve '%s': %s (fix the address in the hostfile)",
                            host, gai_strerror(gr));
    enum tp_status st = TP_OK;
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd < 0 || set_nonblock(fd) != 0) {
        st = tp_error_set(err, TP_ERR_IO, "socket() failed: %s", strerror(errno));
        goto out;
    }
    no_sigpipe(fd);
    int r;
    do {
        r = connect(fd, res->ai_addr, res->ai_addrlen);
    } while (r != 0 && errno == EINTR);
    if (r != 0 && errno != EINPROGRESS) {
        *refused = errno == ECONNREFUSED || errno == ENETUNREACH || errno == EHOSTUNREACH;
        st = tp_error_set(err, TP_ERR_IO, "connect to %s:%d failed: %s", host, port, strerror(errno));
        goto out;
    }
    if (r != 0) {
        st = wait_fd(fd, POLLOUT, deadline_ns, err, "connecting");
        if (st != TP_OK) goto out;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
        if (soerr != 0) {
            *refused = soerr == ECONNREFUSED || soerr == ENETUNREACH || soerr == EHOSTUNREACH || soerr == ETIMEDOUT;
            st = tp_error_set(err, TP_ERR_IO, "connect to %s:%d failed: %s", host, port, strerror(soerr));
            goto out;
        }
    }
    *fd_out = fd;
    fd = -1;
out:
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return st;
}

enum tp_status tp_sock_accept(int lfd, uint64_t deadline_ns, int *fd_out, struct tp_error *err)
{
    *fd_out = -1;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd >= 0) {
            if (set_nonblock(fd) != 0) {
                close(fd);
                return tp_error_set(err, TP_ERR_IO, "fcntl on accepted socket: %s", strerror(errno));
            }
            no_sigpipe(fd);
            *fd_out = fd;
            return TP_OK;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return tp_error_set(err, TP_ERR_IO, "accept failed: %s", strerror(errno));
        enum tp_status st = wait_fd(lfd, POLLIN, deadline_ns, err, "waiting for peers to connect");
        if (st != TP_OK) return st;
    }
}

enum tp_status tp_sock_read_full(int fd, void *buf, size_t n, uint64_t deadline_ns, struct tp_error *err)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = recv(fd, p + done, n - done, 0);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r == 0) return tp_error_set(err, TP_ERR_PEER, "peer closed the connection");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return tp_error_set(err, TP_ERR_PEER, "read failed: %s", strerror(errno));
        enum tp_status st = wait_fd(fd, POLLIN, deadline_ns, err, "reading from a peer");
        if (st != TP_OK) return st;
    }
    return TP_OK;
}

enum tp_status tp_sock_write_full(int fd, const void *buf, size_t n, uint64_t deadline_ns, struct tp_error *err)
{
    const unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = send(fd, p + done, n - done, tp_sock_send_flags());
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return tp_error_set(err, TP_ERR_PEER, "write failed: %s", strerror(errno));
        enum tp_status st = wait_fd(fd, POLLOUT, deadline_ns, err, "writing to a peer");
        if (st != TP_OK) return st;
    }
    return TP_OK;
}

enum tp_status tp_sock_tune(int fd, struct tp_error *err)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        return tp_error_set(err, TP_ERR_IO, "TCP_NODELAY failed: %s", strerror(errno));
    no_sigpipe(fd);
    if (set_nonblock(fd) != 0) return tp_error_set(err, TP_ERR_IO, "fcntl failed: %s", strerror(errno));
    return TP_OK;
}

void tp_sock_peer_ip(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    out[0] = '\0';
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return;
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)cap);
    else if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) /* a v4 peer on a dual-stack socket: give the plain IPv4 form */
            inet_ntop(AF_INET, &a6->s6_addr[12], out, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, a6, out, (socklen_t)cap);
    }
}

static void addr_str(const struct sockaddr_storage *ss, char *out, size_t cap, int *port)
{
    out[0] = '\0';
    *port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a4->sin_addr, out, (socklen_t)cap);
        *port = ntohs(a4->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr))
            inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], out, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, &a6->sin6_addr, out, (socklen_t)cap);
        *port = ntohs(a6->sin6_port);
    }
}

void tp_sock_local_ip(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int port;
    out[0] = '\0';
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) addr_str(&ss, out, cap, &port);
}

void tp_sock_peer_str(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) addr_str(&ss, ip, sizeof ip, &port);
    snprintf(out, cap, "%s:%d", ip[0] ? ip : "?", port);
}

int tp_sock_is_loopback(const char *host)
{
    struct addrinfo *res = NULL;
    if (!host || !*host || resolve(host, 0, 0, &res) != 0 || !res) return 0;
    int all = 1;
    for (const struct addrinfo *ai = res; ai && all; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            uint32_t a = ntohl(((const struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr);
            all = (a >> 24) == 127;
        } else if (ai->ai_family == AF_INET6) {
            const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
            all = IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
        } else {
            all = 0;
        }
    }
    freeaddrinfo(res);
    return all;
}
