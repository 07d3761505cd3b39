// Not Go: the tag keeps the go tool from taking this directory's C for cgo.
//go:build ignore

// The benign beacon in C, for the architectures Go does not target (the
// Mirai set: armel, mips, powerpc, sh4, m68k, sparc64, …). It behaves as the
// Go beacon (internal/demo/beacon) does, with the same flags, log lines and
// exit codes (0: at least one check-in answered, 3: none, 2: usage):
// resolves its C2 name, checks in over HTTP on a period with jitter,
// retrying when the C2 does not answer, and runs a short telnet connect
// scan; with -behave DIR it first does what the Go beacon's -behave does
// (behave below), for the behaviour trace's tests. It is harmless by
// construction: the address policy (policy.c) refuses anything outside the
// documentation ranges and the lab, at the command line and again before
// every connection, resolved ones included; -behave writes only under DIR
// (and deletes the beacon's own binary).
//
// It resolves names itself (/etc/hosts, then one A query over UDP to each
// resolv.conf nameserver) because static glibc's getaddrinfo needs NSS
// modules at run time, which a bare guest or a qemu-user run lacks.
#define _POSIX_C_SOURCE 200809L
#include "policy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ADDRS 16

static volatile sig_atomic_t stopping; // SIGINT or SIGTERM: finish up as the Go beacon's context does

static void on_signal(int sig) {
	(void)sig;
	stopping = 1;
}

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void logf_(const char *fmt, ...) {
	char when[32];
	time_t t = time(NULL);
	struct tm tm;
	va_list ap;
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
	printf("%s ", when);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout); // tb-run reads the output as it comes
}

static int listener = -1; // -behave-listen's, non-blocking: see sleep_ns

// sleep_ns waits d or until a signal asks to stop; 0 means stop. With a
// listener open it waits in poll instead, accepting and closing whatever
// connects, as the Go beacon's listener does.
static int sleep_ns(int64_t d) {
	struct timespec ts = {(time_t)(d / 1000000000LL), (long)(d % 1000000000LL)};
	if (listener < 0) {
		while (!stopping && nanosleep(&ts, &ts) == -1 && errno == EINTR)
			;
		return !stopping;
	}
	for (int64_t deadline = now_ns() + d, left; !stopping && (left = deadline - now_ns()) > 0;) {
		struct pollfd p = {listener, POLLIN, 0};
		if (poll(&p, 1, left > 3600000000000LL ? 3600000 : (int)((left + 999999) / 1000000)) > 0) {
			int fd = accept(listener, NULL, NULL);
			if (fd >= 0)
				close(fd);
		}
	}
	return !stopping;
}

// Go's Duration.String, near enough for the log.
static const char *fmt_duration(int64_t d, char *buf, size_t n) {
	if (d < 1000000000LL)
		snprintf(buf, n, d % 1000000 == 0 ? "%lldms" : "%lldns", (long long)(d % 1000000 == 0 ? d / 1000000 : d));
	else if (d < 60000000000LL)
		snprintf(buf, n, "%gs", d / 1e9);
	else if (d < 3600000000000LL)
		snprintf(buf, n, "%lldm%gs", (long long)(d / 60000000000LL), (d % 60000000000LL) / 1e9);
	else
		snprintf(buf, n, "%lldh%lldm%gs", (long long)(d / 3600000000000LL),
			(long long)(d % 3600000000000LL / 60000000000LL), (d % 60000000000LL) / 1e9);
	return buf;
}

// quote escapes s for the log and the JSON body (as Go's %q would for the
// text this beacon sends).
static const char *quote(const char *s, size_t len, char *buf, size_t n) {
	size_t o = 0;
	for (size_t i = 0; i < len && o + 7 < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\')
			o += (size_t)snprintf(buf + o, n - o, "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			o += (size_t)snprintf(buf + o, n - o, "\\u%04x", ch);
		else
			buf[o++] = (char)ch;
	}
	buf[o] = '\0';
	return buf;
}

static uint64_t rng;

static double rand01(void) {
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; // xorshift64: jitter needs no more
	return (double)(rng >> 11) / 9007199254740992.0;
}

static int remaining_ms(int64_t deadline) {
	int64_t ms = (deadline - now_ns()) / 1000000;
	return ms < 0 ? 0 : ms > 3600000 ? 3600000 : (int)ms;
}

// wait_fd polls fd for ev until deadline; 0 on ready, -1 with errno set.
static int wait_fd(int fd, short ev, int64_t deadline) {
	struct pollfd p = {fd, ev, 0};
	for (;;) {
		int ms = remaining_ms(deadline);
		if (ms == 0 || stopping) {
			errno = ETIMEDOUT;
			return -1;
		}
		int r = poll(&p, 1, ms);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -1;
	}
}

// dial opens a TCP connection to a:port, first asking allowed whether a may
// be contacted: every connection of the beacon goes through here.
static int dial(uint32_t a, int port, int (*allowed)(uint32_t), int64_t deadline, char *err, size_t errlen) {
	char ip[16];
	ip_format(a, ip);
	if (!allowed(a)) {
		snprintf(err, errlen, "refusing %s: outside the documentation ranges and the lab", ip);
		return -1;
	}
	struct sockaddr_in sa = {0};
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); // for the connect timeout
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		socklen_t l = sizeof e;
		if (e == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0)
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
		else if (e == EINPROGRESS)
			e = errno;
		if (e != 0) {
			snprintf(err, errlen, "dial tcp %s:%d: %s", ip, port, strerror(e));
			close(fd);
			return -1;
		}
	}
	return fd;
}

// read_until reads into buf until it holds stop, fills, or the peer closes
// or the deadline passes; it returns the bytes read (NUL-terminated).
static size_t read_until(int fd, char *buf, size_t cap, const char *stop, int64_t deadline) {
	size_t n = 0;
	buf[0] = '\0';
	while (n + 1 < cap && !strstr(buf, stop)) {
		if (wait_fd(fd, POLLIN, deadline) < 0)
			break;
		ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
		buf[n] = '\0';
	}
	return n;
}

// hosts_lookup reads /etc/hosts first, as Go's resolver does.
static int hosts_lookup(const char *name, uint32_t *out, int max) {
	FILE *f = fopen("/etc/hosts", "r");
	char line[512];
	int n = 0;
	if (!f)
		return 0;
	while (n < max && fgets(line, sizeof line, f)) {
		line[strcspn(line, "#\n")] = '\0';
		char *save, *ip = strtok_r(line, " \t", &save), *h;
		uint32_t a;
		if (!ip || ip_parse(ip, &a) != 1)
			continue;
		while (n < max && (h = strtok_r(NULL, " \t", &save)))
			if (strcasecmp(h, name) == 0)
				out[n++] = a;
	}
	fclose(f);
	return n;
}

// skip_name steps over a (possibly compressed) DNS name; -1 if malformed.
static int skip_name(const unsigned char *p, int len, int off) {
	while (off < len) {
		if (p[off] == 0)
			return off + 1;
		if ((p[off] & 0xc0) == 0xc0)
			return off + 2 <= len ? off + 2 : -1;
		off += p[off] + 1;
	}
	return -1;
}

// dns_a sends one A query for name to the resolver ns and collects the A
// records of its answer; -1 with err on failure.
static int dns_a(uint32_t ns, const char *name, uint32_t *out, int max, int64_t deadline, char *err, size_t errlen) {
	unsigned char q[300], r[1500];
	char ip[16];
	uint16_t id = (uint16_t)(rand01() * 65536);
	int qlen = 12;
	ip_format(ns, ip);
	if (!resolver_allowed(ns)) {
		snprintf(err, errlen, "refusing resolver %s: not a private, lab or loopback address", ip);
		return -1;
	}
	memset(q, 0, 12);
	q[0] = id >> 8, q[1] = id & 255, q[2] = 0x01 /* RD */, q[5] = 1 /* QDCOUNT */;
	for (const char *l = name; *l;) {
		size_t ll = strcspn(l, ".");
		if (ll == 0 || ll > 63 || qlen + ll + 6 > 12 + 255) {
			snprintf(err, errlen, "lookup %.200s: invalid name", name);
			return -1;
		}
		q[qlen++] = (unsigned char)ll;
		memcpy(q + qlen, l, ll);
		qlen += (int)ll;
		l += ll;
		if (*l == '.')
			l++;
	}
	q[qlen++] = 0;
	q[qlen++] = 0, q[qlen++] = 1; // QTYPE A
	q[qlen++] = 0, q[qlen++] = 1; // QCLASS IN

	struct sockaddr_in sa = {0};
	sa.sin_family = AF_INET;
	sa.sin_port = htons(53);
	sa.sin_addr.s_addr = htonl(ns);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	// connect: only the resolver's own replies are received.
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || send(fd, q, (size_t)qlen, 0) != qlen) {
		snprintf(err, errlen, "lookup %.200s on %s: %s", name, ip, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	for (;;) {
		if (wait_fd(fd, POLLIN, deadline) < 0) {
			snprintf(err, errlen, "lookup %.200s on %s:53: i/o timeout", name, ip);
			break;
		}
		ssize_t len = recv(fd, r, sizeof r, 0);
		if (len < 12 || r[0] != q[0] || r[1] != q[1] || !(r[2] & 0x80))
			continue; // not our answer
		close(fd);
		int rcode = r[3] & 15, qd = r[4] << 8 | r[5], an = r[6] << 8 | r[7], off = 12, n = 0;
		if (rcode == 3) {
			snprintf(err, errlen, "lookup %.200s on %s:53: no such host", name, ip);
			return -1;
		}
		if (rcode != 0 || (r[2] & 0x02)) { // an error, or truncated (no TCP retry here)
			snprintf(err, errlen, "lookup %.200s on %s:53: server misbehaving", name, ip);
			return -1;
		}
		for (int i = 0; i < qd && off >= 0; i++) {
			off = skip_name(r, (int)len, off);
			if (off >= 0)
				off += 4; // QTYPE, QCLASS
		}
		for (int i = 0; i < an && off >= 0 && off + 10 <= len; i++) {
			off = skip_name(r, (int)len, off);
			if (off < 0 || off + 10 > len)
				break;
			int type = r[off] << 8 | r[off + 1], class = r[off + 2] << 8 | r[off + 3];
			int rdlen = r[off + 8] << 8 | r[off + 9];
			off += 10;
			if (off + rdlen > len)
				break;
			// CNAMEs are skipped: a recursive resolver sends their A records too.
			if (type == 1 && class == 1 && rdlen == 4 && n < max)
				out[n++] = (uint32_t)r[off] << 24 | (uint32_t)r[off + 1] << 16 | (uint32_t)r[off + 2] << 8 | r[off + 3];
			off += rdlen;
		}
		if (n == 0)
			snprintf(err, errlen, "lookup %.200s on %s:53: no such host", name, ip);
		return n > 0 ? n : -1;
	}
	close(fd);
	return -1;
}

// lookup resolves name to IPv4 addresses; -1 with err on failure.
static int lookup(const char *name, uint32_t *out, int max, int64_t deadline, char *err, size_t errlen) {
	uint32_t ns[3];
	int nns = 0, n;
	char line[256], fqdn[MAX_TEXT];
	snprintf(fqdn, sizeof fqdn, "%s", name);
	if (fqdn[0] && fqdn[strlen(fqdn) - 1] == '.')
		fqdn[strlen(fqdn) - 1] = '\0';
	if ((n = hosts_lookup(fqdn, out, max)) > 0)
		return n;
	FILE *f = fopen("/etc/resolv.conf", "r");
	while (f && nns < 3 && fgets(line, sizeof line, f)) {
		char *save, *k = strtok_r(line, " \t\n", &save), *v = strtok_r(NULL, " \t\n", &save);
		if (k && v && strcmp(k, "nameserver") == 0 && ip_parse(v, &ns[nns]) == 1)
			nns++;
	}
	if (f)
		fclose(f);
	if (nns == 0)
		ns[nns++] = 0x7f000001; // Go's default too: 127.0.0.1
	for (int i = 0; i < nns; i++) {
		// Each resolver gets its share of what remains of the timeout.
		int64_t share = now_ns() + (deadline - now_ns()) / (nns - i);
		if ((n = dns_a(ns[i], fqdn, out, max, share, err, errlen)) > 0)
			return n;
	}
	return -1;
}

static const char *fmt_addrs(const uint32_t *a, int n, char *buf, size_t cap) {
	size_t o = (size_t)snprintf(buf, cap, "[");
	for (int i = 0; i < n && o + 18 < cap; i++) {
		char ip[16];
		ip_format(a[i], ip);
		o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? " " : "", ip);
	}
	snprintf(buf + o, cap - o, "]");
	return buf;
}

static int resolve(const struct config *c, int64_t deadline, uint32_t *addr, char *err, size_t errlen) {
	uint32_t got[MAX_ADDRS];
	char lerr[256] = "", list[MAX_ADDRS * 17 + 3], ip[16];
	int r = ip_parse(c->c2, addr);
	if (r != 0) {
		if (r == 1 && c2_allowed(*addr))
			return 0;
		snprintf(err, errlen, "refusing C2 %s", c->c2);
		return -1;
	}
	int n = lookup(c->c2, got, MAX_ADDRS, deadline, lerr, sizeof lerr);
	if (c->has_c2addr) {
		ip_format(c->c2addr, ip);
		if (!pick_c2(c, got, n, addr)) {
			snprintf(err, errlen, "refusing C2 %s", ip);
			return -1;
		}
		logf_("resolved %s to %s (%s); using %s", c->c2, fmt_addrs(got, n, list, sizeof list), n < 0 ? lerr : "<nil>", ip);
		return 0;
	}
	if (n < 0) {
		snprintf(err, errlen, "resolving %.200s: %.280s", c->c2, lerr);
		return -1;
	}
	if (!pick_c2(c, got, n, addr)) {
		snprintf(err, errlen, "refusing C2 %s: resolves to %s, outside the documentation ranges and the lab", c->c2, fmt_addrs(got, n, list, sizeof list));
		return -1;
	}
	ip_format(*addr, ip);
	logf_("resolved %s to %s", c->c2, ip);
	return 0;
}

// check_in posts one check-in the way the Go beacon does (the C2 logs the
// JSON body's id as the bot); 0 with the status and Server header, or -1.
static int check_in(const struct config *c, long seq, long attempt, int *status, char *server, size_t slen, char *err, size_t errlen) {
	int64_t deadline = now_ns() + c->timeout_ns;
	uint32_t addr;
	char body[MAX_TEXT * 6 + 64], req[sizeof body + MAX_TEXT * 2 + 256], resp[4096], id[MAX_TEXT * 6];
	if (resolve(c, deadline, &addr, err, errlen) < 0)
		return -1;
	int fd = dial(addr, c->port, c2_allowed, deadline, err, errlen);
	if (fd < 0)
		return -1;
	int bl = snprintf(body, sizeof body, "{\"id\":\"%s\",\"seq\":%ld,\"attempt\":%ld}", quote(c->id, strlen(c->id), id, sizeof id), seq, attempt);
	int rl = snprintf(req, sizeof req,
		"POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tb-beacon/1\r\nContent-Type: application/json\r\n"
		"Content-Length: %d\r\nConnection: close\r\n\r\n%s",
		c->path, c->c2, bl, body);
	for (int o = 0; o < rl;) {
		ssize_t w = wait_fd(fd, POLLOUT, deadline) < 0 ? -1 : send(fd, req + o, (size_t)(rl - o), MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			snprintf(err, errlen, "write: %s", strerror(errno));
			close(fd);
			return -1;
		}
		o += (int)w;
	}
	errno = 0;
	read_until(fd, resp, sizeof resp, "\r\n\r\n", deadline);
	int e = errno;
	close(fd);
	char *eol = strchr(resp, '\n');
	if (!eol) {
		snprintf(err, errlen, "no answer: %s", e && e != EINTR ? strerror(e) : "EOF");
		return -1;
	}
	*eol = '\0';
	char proto[16] = "", code[16] = "", *end;
	sscanf(resp, "%15s %15s", proto, code);
	long st = strtol(code, &end, 10);
	if (strncmp(proto, "HTTP/", 5) != 0 || code[0] == '\0' || *end != '\0') {
		resp[strcspn(resp, "\r")] = '\0';
		snprintf(err, errlen, "not HTTP: \"%.64s\"", resp);
		return -1;
	}
	*status = (int)st;
	server[0] = '\0';
	for (char *h = eol + 1; *h && *h != '\r' && *h != '\n';) {
		char *next = strchr(h, '\n');
		if (next)
			*next = '\0';
		h[strcspn(h, "\r")] = '\0';
		char *colon = strchr(h, ':');
		if (colon && (size_t)(colon - h) == 6 && strncasecmp(h, "Server", 6) == 0) {
			colon += 1 + strspn(colon + 1, " \t");
			size_t l = strlen(colon);
			while (l > 0 && (colon[l - 1] == ' ' || colon[l - 1] == '\t'))
				l--;
			snprintf(server, slen, "%.*s", (int)l, colon);
		}
		if (!next)
			break;
		h = next + 1;
	}
	return 0;
}

// beacon sends check-in seq, retrying; 1 when the C2 answered.
static int beacon(const struct config *c, long seq) {
	for (long attempt = 1; attempt <= c->retries; attempt++) {
		char err[512] = "", server[256], q[1600];
		int status;
		if (check_in(c, seq, attempt, &status, server, sizeof server, err, sizeof err) == 0) {
			logf_("beacon seq=%ld attempt=%ld status=%d server=\"%s\"", seq, attempt, status, quote(server, strlen(server), q, sizeof q));
			return 1;
		}
		logf_("beacon seq=%ld attempt=%ld failed: %s", seq, attempt, err);
		if (attempt < c->retries && !sleep_ns(c->retry_ns))
			return 0;
	}
	return 0;
}

// probe connects to the scan port of a target and reads a banner line, as a
// telnet scanner does; it sends nothing.
static int probe(const struct config *c, uint32_t a) {
	char ip[16], err[256], banner[256], q[1600];
	ip_format(a, ip);
	if (!scan_allowed(a)) { // parse_args checked already; checked again where it counts
		logf_("scan %s refused", ip);
		return 0;
	}
	int64_t deadline = now_ns() + c->timeout_ns;
	int fd = dial(a, c->scan_port, scan_allowed, deadline, err, sizeof err);
	if (fd < 0) {
		logf_("scan %s:%d closed: %s", ip, c->scan_port, err);
		return 0;
	}
	size_t n = read_until(fd, banner, sizeof banner, "\n", deadline);
	close(fd);
	while (n > 0 && strchr(" \t\r\n", banner[n - 1]))
		n--;
	size_t skip = strspn(banner, " \t\r\n");
	logf_("scan %s:%d open banner=\"%s\"", ip, c->scan_port, quote(banner + skip, n > skip ? n - skip : 0, q, sizeof q));
	return 1;
}

// mkdir_all is Go's os.MkdirAll(path, 0755); 0, or -1 with err.
static int mkdir_all(const char *path, char *err, size_t errlen) {
	struct stat st;
	char parent[BEHAVE_PATH_MAX];
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return 0;
		snprintf(err, errlen, "mkdir %s: not a directory", path);
		return -1;
	}
	size_t l = strlen(path);
	while (l > 0 && path[l - 1] == '/')
		l--;
	while (l > 0 && path[l - 1] != '/')
		l--;
	while (l > 1 && path[l - 1] == '/')
		l--;
	if (l > 0 && l < sizeof parent) {
		memcpy(parent, path, l);
		parent[l] = '\0';
		if (mkdir_all(parent, err, errlen) < 0)
			return -1;
	}
	if (mkdir(path, 0755) < 0 && !(errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
		snprintf(err, errlen, "mkdir %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

// write_file is Go's os.WriteFile(path, data, 0644).
static int write_file(const char *path, const char *data, char *err, size_t errlen) {
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		snprintf(err, errlen, "open %s: %s", path, strerror(errno));
		return -1;
	}
	for (size_t o = 0, n = strlen(data); o < n;) {
		ssize_t w = write(fd, data + o, n - o);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			snprintf(err, errlen, "write %s: %s", path, strerror(errno));
			close(fd);
			return -1;
		}
		o += (size_t)w;
	}
	if (close(fd) < 0) {
		snprintf(err, errlen, "close %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

// read_file reads path into buf (NUL-terminated, the rest read and
// dropped), as a bot reads what tells it a sandbox; errors are ignored, as
// the Go beacon ignores them.
static void read_file(const char *path, char *buf, size_t cap) {
	char sink[4096];
	size_t n = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	buf[0] = '\0';
	if (fd < 0)
		return;
	for (;;) {
		char *into = n + 1 < cap ? buf + n : sink;
		size_t room = n + 1 < cap ? cap - 1 - n : sizeof sink;
		ssize_t r = read(fd, into, room);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (into == buf + n) {
			n += (size_t)r;
			buf[n] = '\0';
		}
	}
	close(fd);
}

// behave does what the Go beacon's Behaviour.Do does, in its order and with
// its log lines: each thing the behaviour trace must see, done harmlessly
// inside c->behave and on the lab network. self is the beacon's binary,
// argv0 its argv[0], which it overwrites with the new name as Mirai does.
// It returns 0, or -1 with err (the listener closed).
static int behave(const struct config *c, const char *self, char *argv0, char *err, size_t errlen) {
	if (prctl(PR_SET_NAME, (unsigned long)BEHAVE_NAME, 0UL, 0UL, 0UL) < 0) {
		snprintf(err, errlen, "renaming the process: %s", strerror(errno));
		return -1;
	}
	// The argv[0] rewrite shows in ps and /proc/PID/cmdline only: no
	// system call makes it. The child below is started under the name too,
	// which the trace does see (the exec's argv[0]).
	size_t l = strlen(argv0);
	memset(argv0, 0, l);
	memcpy(argv0, BEHAVE_NAME, l < sizeof BEHAVE_NAME - 1 ? l : sizeof BEHAVE_NAME - 1);
	logf_("behave renamed=%s", BEHAVE_NAME);

	// A child process: the beacon's binary again, which only exits.
	pid_t pid = fork();
	if (pid == 0) {
		char *args[] = {BEHAVE_NAME, "-behave-child", NULL};
		execv(self, args);
		_exit(127);
	}
	int status;
	if (pid < 0 || waitpid(pid, &status, 0) < 0) {
		snprintf(err, errlen, "running a child: %s", strerror(errno));
		return -1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(err, errlen, WIFEXITED(status) ? "running a child: exit status %d" : "running a child: signal %d",
			WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		return -1;
	}
	logf_("behave child=%d", (int)pid);

	char drop[BEHAVE_PATH_MAX], path[BEHAVE_PATH_MAX], text[BEHAVE_PATH_MAX + 64];
	if (behave_path(c->behave, BEHAVE_DROPPED, drop, sizeof drop) < 0) {
		snprintf(err, errlen, "-behave %.200s: too long", c->behave);
		return -1;
	}
	if (mkdir_all(c->behave, err, errlen) < 0 ||
		write_file(drop, "#!/bin/sh\n# dropped by the Talkbox test beacon: does nothing\nexit 0\n", err, errlen) < 0)
		return -1;
	if (chmod(drop, 0755) < 0) {
		snprintf(err, errlen, "chmod %s: %s", drop, strerror(errno));
		return -1;
	}
	logf_("behave dropped=%s", drop);
	snprintf(text, sizeof text, "# written by the Talkbox test beacon: %s\n", drop);
	for (int i = 0; behave_persistence[i]; i++) {
		char dir[BEHAVE_PATH_MAX];
		if (behave_path(c->behave, behave_persistence[i], path, sizeof path) < 0 ||
			behave_path(path, "..", dir, sizeof dir) < 0) {
			snprintf(err, errlen, "-behave %.200s: too long", c->behave);
			return -1;
		}
		if (mkdir_all(dir, err, errlen) < 0 || write_file(path, text, err, errlen) < 0)
			return -1;
		logf_("behave persistence=%s", path);
	}

	// What bots read to tell a sandbox or a debugger: harmless reads.
	char status_text[8192], cpuinfo[1];
	int traced = 0;
	read_file("/proc/self/status", status_text, sizeof status_text);
	for (char *line = status_text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
		if (strncmp(line, "TracerPid:", 10) == 0) {
			char *v = line + 10;
			v += strspn(v, " \t");
			traced = !(v[0] == '0' && (v[1] == '\n' || v[1] == '\0' || v[1] == ' ' || v[1] == '\t'));
		}
	read_file("/proc/cpuinfo", cpuinfo, sizeof cpuinfo);
	logf_("behave traced=%s", traced ? "true" : "false");

	if (c->behave_listen != 0) {
		// As Go's net.Listen("tcp4", ":PORT"): every address of the guest,
		// which is on the lab only. A listener contacts nothing.
		struct sockaddr_in sa = {0};
		int one = 1;
		sa.sin_family = AF_INET;
		sa.sin_port = htons((uint16_t)c->behave_listen);
		sa.sin_addr.s_addr = htonl(INADDR_ANY);
		listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (listener < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
			bind(listener, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(listener, 128) < 0) {
			snprintf(err, errlen, "listening: listen tcp4 :%d: %s", c->behave_listen, strerror(errno));
			if (listener >= 0)
				close(listener);
			listener = -1;
			return -1;
		}
		logf_("behave listen=0.0.0.0:%d", c->behave_listen);
	}
	if (unlink(self) < 0 && errno != ENOENT) {
		snprintf(err, errlen, "deleting its own binary: remove %s: %s", self, strerror(errno));
		if (listener >= 0)
			close(listener);
		listener = -1;
		return -1;
	}
	logf_("behave deleted=%s", self);
	return 0;
}

int main(int argc, char **argv) {
	static struct config c;
	char err[512], d[32];
	if (argc == 2 && strcmp(argv[1], "-behave-child") == 0)
		return 0; // the child process of -behave: it only exists
	if (parse_args(argc, argv, &c, err, sizeof err) < 0) {
		fprintf(stderr, "beacon: %s\n", err);
		return 2;
	}
	struct sigaction sa = {0};
	sa.sa_handler = on_signal; // no SA_RESTART: a blocked wait returns at once
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	int fd = open("/dev/urandom", O_RDONLY);
	if (fd < 0 || read(fd, &rng, sizeof rng) != (ssize_t)sizeof rng)
		rng = (uint64_t)now_ns() ^ (uint64_t)getpid() << 32;
	if (fd >= 0)
		close(fd);
	rng |= 1; // xorshift's one fixed point is zero
	if (c.behave[0] != '\0') {
		// The binary, as Go's os.Executable finds it (under qemu-user
		// the emulator answers with the sample's path).
		char self[BEHAVE_PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		if (n < 0) {
			fprintf(stderr, "beacon: readlink /proc/self/exe: %s\n", strerror(errno));
			return 1;
		}
		self[n] = '\0';
		if (behave(&c, self, argv[0], err, sizeof err) < 0) {
			fprintf(stderr, "beacon: %s\n", err);
			return 1;
		}
	}

	long sent = 0, answered = 0, failed = 0, scanned = 0, open_ = 0;
	logf_("start c2=%s port=%d interval=%s jitter=%.2f scan=%d", c.c2, c.port, fmt_duration(c.interval_ns, d, sizeof d), c.jitter, c.nscan);
	for (int i = 0; i < c.nscan; i++) {
		scanned++;
		open_ += probe(&c, c.scan[i]);
	}
	for (long seq = 1; c.count == 0 || seq <= c.count; seq++) {
		sent++;
		if (beacon(&c, seq))
			answered++;
		else
			failed++;
		if (stopping || (c.count != 0 && seq == c.count))
			break;
		double j = (double)c.interval_ns * c.jitter;
		if (!sleep_ns(c.interval_ns + (int64_t)((rand01() * 2 - 1) * j)))
			break;
	}
	logf_("done sent=%ld answered=%ld failed=%ld scanned=%ld open=%ld", sent, answered, failed, scanned, open_);
	return answered == 0 ? 3 : 0;
}
