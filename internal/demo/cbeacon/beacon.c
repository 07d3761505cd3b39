// Not Go: the tag keeps the go tool from taking this directory's C for cgo.
//go:build ignore

// The benign beacon in C, for the architectures Go does not target (the
// Mirai set: armel, mips, powerpc, sh4, m68k, sparc64, …). It behaves as the
// Go beacon (internal/demo/beacon) does, with the same flags, log lines and
// exit codes (0: at least one check-in answered, or -hostile without -c2;
// 3: none; 2: usage):
// resolves its C2 name, checks in over HTTP on a period with jitter,
// retrying when the C2 does not answer, and runs a short telnet connect
// scan; with -c2-proto mirai, gafgyt or irc it keeps one session with its C2
// in that bot protocol instead (run_session, proto.c), and carries out the
// C2's UDP attack orders, against the documentation ranges alone, paced and
// bounded (attack_start); with -behave DIR it first does what the Go beacon's -behave does
// (behave below), for the behaviour trace's tests, and with -hostile MODES
// what the Go beacon's hostile modes do (run_hostile below), for the
// containment battery. It is harmless by construction: the address policy
// (policy.c) refuses anything outside the documentation ranges and the
// lab, at the command line and again before every connection, resolved
// ones included; the hostile modes aim at the documentation ranges and at
// the guest's own lab link only; -behave writes only under DIR (and
// deletes the beacon's own binary).
//
// It resolves names itself (/etc/hosts, then one A query over UDP to each
// resolv.conf nameserver) because static glibc's getaddrinfo needs NSS
// modules at run time, which a bare guest or a qemu-user run lacks.
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE // struct ifreq, for the hostile modes' interface
#include "proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netpacket/packet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
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

// dial_start starts a TCP connection to a:port on a non-blocking socket,
// first asking allowed whether a may be contacted: every TCP connection of
// the beacon starts here. *pending says the connect is still in progress
// (the socket turns writable when it ends: dial_error).
static int dial_start(uint32_t a, int port, int (*allowed)(uint32_t), int *pending, char *err, size_t errlen) {
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
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); // for the connect timeout
	*pending = 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		if (errno != EINPROGRESS) {
			snprintf(err, errlen, "dial tcp %s:%d: %s", ip, port, strerror(errno));
			close(fd);
			return -1;
		}
		*pending = 1;
	}
	return fd;
}

// dial_error is how a pending connect ended: 0 connected, else the errno.
static int dial_error(int fd) {
	int e = 0;
	socklen_t l = sizeof e;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) < 0)
		return errno;
	return e;
}

// dial opens a TCP connection to a:port by deadline (dial_start checks a).
static int dial(uint32_t a, int port, int (*allowed)(uint32_t), int64_t deadline, char *err, size_t errlen) {
	int pending, fd = dial_start(a, port, allowed, &pending, err, errlen);
	if (fd < 0 || !pending)
		return fd;
	int e = wait_fd(fd, POLLOUT, deadline) == 0 ? dial_error(fd) : errno;
	if (e != 0) {
		char ip[16];
		ip_format(a, ip);
		snprintf(err, errlen, "dial tcp %s:%d: %s", ip, port, strerror(e));
		close(fd);
		return -1;
	}
	return fd;
}

static int listener = -1; // -behave-listen's, non-blocking: see wait_io

// The attack a C2's order started (attack_start), paced by wait_io beside
// whatever else the beacon waits for: one at a time, and never more than
// ATTACK_MAX_PACKETS in the beacon's life (attack_budget), however many
// orders a C2 sends.
static struct {
	int fd; // -1: none running
	struct attack_plan p;
	long sent, errors;
	int64_t next, end;
} attack = {-1, {0}, 0, 0, 0, 0};
static long attack_budget = ATTACK_MAX_PACKETS;

// attack_open opens a UDP socket connected to a:port, first checking that
// a may be attacked: every attack packet leaves by one of these.
static int attack_open(uint32_t a, int port, char *err, size_t errlen) {
	char ip[16];
	ip_format(a, ip);
	if (!attack_allowed(a)) {
		snprintf(err, errlen, "refusing attack on %s: outside the documentation ranges", ip);
		return -1;
	}
	struct sockaddr_in sa = {0};
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(a);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		snprintf(err, errlen, "dial udp %s:%d: %s", ip, port, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static void attack_stop(void) {
	char ip[16];
	ip_format(attack.p.target, ip);
	logf_("attack %s %s:%d sent=%ld errors=%ld", attack.p.random ? "udp" : "udpplain", ip, attack.p.port, attack.sent, attack.errors);
	close(attack.fd);
	attack.fd = -1;
}

// attack_start carries out a C2's order if the policy lets it: order_check,
// no attack running, the budget. Its log lines are the Go beacon's.
static void attack_start(const struct order *o) {
	char err[256], ip[16], text[80];
	struct attack_plan p;
	if (o->bad[0] != '\0') {
		logf_("order ignored: %s", o->bad);
		return;
	}
	ip_format(o->target, ip);
	snprintf(text, sizeof text, "%s %s %ld %lu", o->vector, ip, o->port, (unsigned long)o->seconds);
	if (order_check(o, err, sizeof err) < 0) {
		logf_("order \"%s\" refused: %s", text, err);
		return;
	}
	if (attack.fd >= 0) {
		logf_("order \"%s\" refused: an attack is running", text);
		return;
	}
	if (attack_plan_for(o, attack_budget, &p) < 0) {
		logf_("order \"%s\" refused: the %d-packet budget is spent", text, ATTACK_MAX_PACKETS);
		return;
	}
	int fd = attack_open(p.target, p.port, err, sizeof err);
	if (fd < 0) {
		logf_("order \"%s\" refused: %s", text, err);
		return;
	}
	attack_budget -= p.packets;
	attack.fd = fd, attack.p = p, attack.sent = 0, attack.errors = 0;
	attack.next = now_ns(), attack.end = attack.next + p.duration_ns;
	logf_("order \"%s\": attack %s:%d, %ld packets", text, ip, p.port, p.packets);
}

// attack_step sends the attack's packets that are due and returns when the
// next one is (INT64_MAX: none running).
static int64_t attack_step(void) {
	if (attack.fd < 0)
		return INT64_MAX;
	int64_t now = now_ns();
	// A stall longer than a tenth of a second is not made up, so the pace
	// never bursts far past ATTACK_PPS.
	if (attack.next < now - 100000000LL)
		attack.next = now;
	while (attack.fd >= 0 && attack.next <= now) {
		if (now >= attack.end) {
			attack_stop();
			break;
		}
		unsigned char b[ATTACK_PAYLOAD];
		for (size_t i = 0; i < sizeof b; i++)
			b[i] = attack.p.random ? (unsigned char)(rand01() * 256) : (unsigned char)('A' + i % 26);
		// The lab drops or sinkholes the flood: a refusal it sends back
		// fails a send, which is counted and not retried.
		if (send(attack.fd, b, sizeof b, 0) < 0)
			attack.errors++;
		attack.sent++;
		attack.next += attack.p.gap_ns;
		if (attack.sent == attack.p.packets)
			attack_stop();
	}
	return attack.fd >= 0 ? attack.next : INT64_MAX;
}

// wait_io waits until deadline (0), until fd, when not -1, is readable (1)
// or until a signal asks to stop (-1); meanwhile it paces the attack and
// accepts and closes whatever connects to -behave-listen's listener, as the
// Go beacon's does.
static int wait_io(int fd, int64_t deadline) {
	while (!stopping) {
		int64_t wake = attack_step(), now = now_ns();
		if (now >= deadline)
			return 0;
		if (wake > deadline)
			wake = deadline;
		struct pollfd p[2];
		nfds_t n = 0;
		if (fd >= 0)
			p[n++] = (struct pollfd){fd, POLLIN, 0};
		if (listener >= 0)
			p[n++] = (struct pollfd){listener, POLLIN, 0};
		int64_t left = wake - now;
		int ms = left <= 0 ? 0 : left > 3600000000000LL ? 3600000 : (int)((left + 999999) / 1000000);
		if (poll(p, n, ms) <= 0)
			continue; // the time, or a signal: both checked above
		if (fd >= 0 && p[0].revents != 0)
			return 1;
		if (listener >= 0 && p[n - 1].revents != 0) {
			int a = accept(listener, NULL, NULL);
			if (a >= 0)
				close(a);
		}
	}
	return -1;
}

// sleep_ns waits d or until a signal asks to stop; 0 means stop.
static int sleep_ns(int64_t d) { return wait_io(-1, now_ns() + d) == 0; }

// send_all sends n bytes of b on fd by deadline; 0, or -1 with err.
static int send_all(int fd, const void *b, size_t n, int64_t deadline, char *err, size_t errlen) {
	for (size_t o = 0; o < n;) {
		ssize_t w = wait_fd(fd, POLLOUT, deadline) < 0 ? -1 : send(fd, (const char *)b + o, n - o, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			snprintf(err, errlen, "write: %s", strerror(errno));
			return -1;
		}
		o += (size_t)w;
	}
	return 0;
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

// dns_query writes an A query for name, recursion desired, into q (300
// bytes); its length, or -1 for a name DNS cannot carry.
static int dns_query(uint16_t id, const char *name, unsigned char *q) {
	int qlen = 12;
	memset(q, 0, 12);
	q[0] = id >> 8, q[1] = id & 255, q[2] = 0x01 /* RD */, q[5] = 1 /* QDCOUNT */;
	for (const char *l = name; *l;) {
		size_t ll = strcspn(l, ".");
		if (ll == 0 || ll > 63 || qlen + ll + 6 > 12 + 255)
			return -1;
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
	return qlen;
}

// udp_open opens a UDP socket connected to the resolver ns, port 53, first
// checking that ns may be asked: every datagram of the beacon leaves by
// one of these. Connected, it receives only the resolver's own replies.
static int udp_open(uint32_t ns, char *err, size_t errlen) {
	char ip[16];
	ip_format(ns, ip);
	if (!resolver_allowed(ns)) {
		snprintf(err, errlen, "refusing resolver %s: not a private, lab or loopback address", ip);
		return -1;
	}
	struct sockaddr_in sa = {0};
	sa.sin_family = AF_INET;
	sa.sin_port = htons(53);
	sa.sin_addr.s_addr = htonl(ns);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		snprintf(err, errlen, "dial udp %s:53: %s", ip, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

// dns_a sends one A query for name to the resolver ns and collects the A
// records of its answer; -1 with err on failure.
static int dns_a(uint32_t ns, const char *name, uint32_t *out, int max, int64_t deadline, char *err, size_t errlen) {
	unsigned char q[300], r[1500];
	char ip[16];
	uint16_t id = (uint16_t)(rand01() * 65536);
	int qlen = dns_query(id, name, q);
	ip_format(ns, ip);
	if (qlen < 0) {
		snprintf(err, errlen, "lookup %.200s: invalid name", name);
		return -1;
	}
	int fd = udp_open(ns, err, errlen);
	if (fd < 0)
		return -1;
	if (send(fd, q, (size_t)qlen, 0) != qlen) {
		snprintf(err, errlen, "lookup %.200s on %s: %s", name, ip, strerror(errno));
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

#define MAX_TASK 4096 // the answer body read for a task, as the Go beacon's maxTask

// post sends one request to the C2 carrying body (JSON) on fd, keeping the
// connection open unless last; 0, or -1 with err.
static int post(int fd, const struct config *c, const char *body, int last, int64_t deadline, char *err, size_t errlen) {
	static char req[MAX_TASK * 6 + MAX_TEXT * 10 + 512];
	int rl = snprintf(req, sizeof req,
		"POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tb-beacon/1\r\nContent-Type: application/json\r\n"
		"Content-Length: %d\r\nConnection: %s\r\n\r\n%s",
		c->path, c->c2, (int)strlen(body), last ? "close" : "keep-alive", body);
	return send_all(fd, req, (size_t)rl, deadline, err, errlen);
}

// read_head reads an HTTP response's status line and headers from fd: the
// status, the Server header and the Content-Length (-1 when there is none).
// What came of the body with them is copied to body (*blen bytes). It
// returns 0, or -1 with err.
static int read_head(int fd, int64_t deadline, int *status, char *server, size_t slen, long *length,
	char *body, size_t bcap, size_t *blen, char *err, size_t errlen) {
	char resp[4096];
	errno = 0;
	size_t n = read_until(fd, resp, sizeof resp, "\r\n\r\n", deadline);
	int e = errno;
	char *head_end = strstr(resp, "\r\n\r\n");
	*blen = 0;
	if (head_end) {
		size_t off = (size_t)(head_end + 4 - resp);
		*blen = n - off < bcap ? n - off : bcap;
		memcpy(body, head_end + 4, *blen);
	}
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
	*length = -1;
	for (char *h = eol + 1; *h && *h != '\r' && *h != '\n';) {
		char *next = strchr(h, '\n');
		if (next)
			*next = '\0';
		h[strcspn(h, "\r")] = '\0';
		char *colon = strchr(h, ':');
		if (colon) {
			size_t kl = (size_t)(colon - h);
			char *v = colon + 1 + strspn(colon + 1, " \t");
			size_t l = strlen(v);
			while (l > 0 && (v[l - 1] == ' ' || v[l - 1] == '\t'))
				l--;
			v[l] = '\0';
			if (kl == 6 && strncasecmp(h, "Server", 6) == 0)
				snprintf(server, slen, "%s", v);
			if (kl == 14 && strncasecmp(h, "Content-Length", 14) == 0) {
				errno = 0;
				long cl = strtol(v, &end, 10);
				if (*v != '\0' && *end == '\0' && errno == 0 && cl >= 0)
					*length = cl;
			}
		}
		if (!next)
			break;
		h = next + 1;
	}
	return 0;
}

// read_task reads an answer's body of length bytes (got: what came with
// the headers) and copies the task it carries ({"task":"..."}) to task;
// "" when it carries none.
static void read_task(int fd, long length, const char *got, size_t glen, int64_t deadline, char *task, size_t tcap) {
	char body[MAX_TASK + 1];
	size_t n = glen;
	task[0] = '\0';
	if (length <= 0 || length > MAX_TASK || n > (size_t)length)
		return;
	memcpy(body, got, n);
	while (n < (size_t)length) {
		if (wait_fd(fd, POLLIN, deadline) < 0)
			return;
		ssize_t r = recv(fd, body + n, (size_t)length - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return;
		n += (size_t)r;
	}
	body[n] = '\0';
	// The "task" member's string, as the Go beacon's json.Unmarshal takes
	// it from the C2's {"task":"..."}; escapes as JSON has them (\u
	// beyond ASCII is kept as written).
	const char *p = strstr(body, "\"task\"");
	if (!p)
		return;
	p += 6;
	p += strspn(p, " \t\r\n");
	if (*p++ != ':')
		return;
	p += strspn(p, " \t\r\n");
	if (*p++ != '"')
		return;
	size_t o = 0;
	for (; *p && *p != '"' && o + 1 < tcap; p++) {
		char ch = *p;
		if (ch == '\\' && p[1]) {
			static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
			const char *k = strchr(from, *++p);
			if (k)
				ch = to[k - from];
			else if (*p == 'u' && strspn(p + 1, "0123456789abcdefABCDEF") >= 4 && strncmp(p + 1, "00", 2) == 0 && p[3] < '8') {
				ch = (char)strtol((char[]){p[3], p[4], '\0'}, NULL, 16);
				p += 4;
			} else {
				task[0] = '\0'; // not JSON: no task
				return;
			}
		}
		task[o++] = ch;
	}
	task[*p == '"' ? o : 0] = '\0';
}

// check_in posts one check-in the way the Go beacon does (the C2 logs the
// JSON body's id as the bot); 0 with the status and Server header, or -1.
// When the answer is a task (the C2's, not a sinkhole's page), the beacon
// reports it done on the same connection, as a bot answers its C2: that
// turn is what confirms a C2 on probation (tb-allow(1)).
static int check_in(const struct config *c, long seq, long attempt, int *status, char *server, size_t slen, char *err, size_t errlen) {
	int64_t deadline = now_ns() + c->timeout_ns;
	uint32_t addr;
	static char body[MAX_TASK * 6 + MAX_TEXT * 6 + 128], id[MAX_TEXT * 6], task[MAX_TASK + 1], qtask[MAX_TASK * 6 + 8];
	char got[MAX_TASK], ignored[256];
	size_t glen;
	long length;
	if (resolve(c, deadline, &addr, err, errlen) < 0)
		return -1;
	int fd = dial(addr, c->port, c2_allowed, deadline, err, errlen);
	if (fd < 0)
		return -1;
	quote(c->id, strlen(c->id), id, sizeof id);
	snprintf(body, sizeof body, "{\"id\":\"%s\",\"seq\":%ld,\"attempt\":%ld}", id, seq, attempt);
	if (post(fd, c, body, 0, deadline, err, errlen) < 0 ||
		read_head(fd, deadline, status, server, slen, &length, got, sizeof got, &glen, err, errlen) < 0) {
		close(fd);
		return -1;
	}
	read_task(fd, length, got, glen, deadline, task, sizeof task);
	if (task[0] != '\0') {
		snprintf(body, sizeof body, "{\"id\":\"%s\",\"seq\":%ld,\"attempt\":%ld,\"done\":\"%s\"}", id, seq, attempt,
			quote(task, strlen(task), qtask, sizeof qtask));
		// The report's own answer does not change the check-in's outcome.
		int st;
		char sv[8];
		if (post(fd, c, body, 1, deadline, ignored, sizeof ignored) == 0)
			read_head(fd, deadline, &st, sv, sizeof sv, &length, got, sizeof got, &glen, ignored, sizeof ignored);
	}
	close(fd);
	struct order o;
	if (task[0] != '\0' && order_from_task(task, &o) == 0)
		attack_start(&o); // paced while the beacon sleeps
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

// session_open resolves and dials the C2 as a check-in does (retrying
// the same way) and opens a bot session with the bot's hello; the socket,
// or -1.
static int session_open(const struct config *c, long seq, struct chan *ch) {
	for (long attempt = 1; attempt <= c->retries; attempt++) {
		char err[512] = "", ip[16];
		unsigned char hello[MAX_REPLY];
		int64_t deadline = now_ns() + c->timeout_ns;
		uint32_t addr;
		int fd = -1;
		if (resolve(c, deadline, &addr, err, sizeof err) == 0 && (fd = dial(addr, c->port, c2_allowed, deadline, err, sizeof err)) >= 0 &&
			send_all(fd, hello, chan_hello(c->proto, c->id, hello, sizeof hello), deadline, err, sizeof err) == 0) {
			memset(ch, 0, sizeof *ch);
			ch->proto = c->proto;
			ip_format(addr, ip);
			logf_("session seq=%ld attempt=%ld proto=%s to %s:%d", seq, attempt, proto_names[c->proto], ip, c->port);
			return fd;
		}
		if (fd >= 0)
			close(fd);
		logf_("session seq=%ld attempt=%ld failed: %s", seq, attempt, err);
		if (attempt < c->retries && !sleep_ns(c->retry_ns))
			break;
	}
	return -1;
}

// What one session reads of a C2's noise: at most MAX_NOISE_LOGGED
// messages it does not act on are logged, at most MAX_ORDERS orders are
// read (each logged); a C2's bytes must not flood the log.
#define MAX_NOISE_LOGGED 16
#define MAX_ORDERS 16
struct noise {
	int ignored, orders;
};

// session_period runs one period of a bot session until until: the bot's
// keep-alive, then the C2's messages as they come (answers, orders). It
// returns 1 when a keep-alive of the C2 came in the period (Mirai's echo,
// a PING), as the Go beacon counts an answer, else 0; when the session
// ended, *fd is closed and -1.
static int session_period(const struct config *c, int *fd, struct chan *ch, int64_t until, struct noise *noise) {
	unsigned char out[MAX_REPLY];
	char err[256] = "", why[128];
	int heard = 0;
	size_t n = chan_keepalive(c->proto, out);
	if (n > 0 && send_all(*fd, out, n, now_ns() + c->timeout_ns, err, sizeof err) < 0)
		goto end;
	for (;;) {
		int r = wait_io(*fd, until);
		if (r <= 0)
			return heard;
		ssize_t got = recv(*fd, ch->buf + ch->n, chan_room(ch), 0);
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (got <= 0) {
			snprintf(err, sizeof err, "%s", got == 0 ? "closed by the C2" : strerror(errno));
			goto end;
		}
		ch->n += (size_t)got;
		for (;;) {
			struct order o;
			size_t rlen;
			int ev = chan_next(ch, &o, out, &rlen, why, sizeof why);
			if (ev == EV_NEED)
				break;
			if (ev == EV_BAD) {
				snprintf(err, sizeof err, "%s", why);
				goto end;
			}
			if (ev == EV_OTHER) {
				if (noise->ignored < MAX_NOISE_LOGGED) {
					noise->ignored++;
					logf_("session ignored: %s%s", why, noise->ignored == MAX_NOISE_LOGGED ? " (no more logged)" : "");
				}
				continue;
			}
			heard |= ev == EV_KEEPALIVE || ev == EV_PING;
			if (ev == EV_ORDER && noise->orders < MAX_ORDERS) {
				attack_start(&o);
				if (++noise->orders == MAX_ORDERS)
					logf_("session ignores further orders (%d read)", MAX_ORDERS);
			}
			if (rlen > 0 && send_all(*fd, out, rlen, now_ns() + c->timeout_ns, err, sizeof err) < 0)
				goto end;
		}
	}
end:
	logf_("session ended: %s", err);
	close(*fd);
	*fd = -1;
	return heard;
}

// run_session is the beacon of -c2-proto mirai, gafgyt or irc, as the Go
// beacon's runChannel: one session kept open (opened again, a period
// later, when it ends), a period per -count. It returns the number of
// answered periods.
static long run_session(const struct config *c, long *sent, long *failed) {
	struct chan ch;
	long answered = 0;
	int fd = -1;
	struct noise noise = {0, 0};
	for (long seq = 1; c->count == 0 || seq <= c->count; seq++) {
		(*sent)++;
		if (fd < 0) {
			fd = session_open(c, seq, &ch);
			noise = (struct noise){0, 0};
		}
		double j = (double)c->interval_ns * c->jitter;
		int64_t until = now_ns() + c->interval_ns + (int64_t)((rand01() * 2 - 1) * j);
		int ok = fd >= 0 && session_period(c, &fd, &ch, until, &noise);
		logf_("beacon seq=%ld proto=%s answered=%s", seq, proto_names[c->proto], ok ? "yes" : "no");
		if (ok)
			answered++;
		else
			(*failed)++;
		// A session that ended waits out its period before the next.
		if (stopping || (c->count != 0 && seq == c->count) || !sleep_ns(until - now_ns()))
			break;
	}
	if (fd >= 0)
		close(fd);
	return answered;
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
	// A telnet server sends its banner at once; the lab's sinkhole accepts
	// every port and says nothing (the Go beacon's bannerWait).
	int64_t banner_deadline = now_ns() + 500 * 1000000LL;
	if (banner_deadline > deadline)
		banner_deadline = deadline;
	size_t n = read_until(fd, banner, sizeof banner, "\n", banner_deadline);
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
		snprintf(err, errlen, "chmod %.400s: %s", drop, strerror(errno));
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
		snprintf(err, errlen, "deleting its own binary: remove %.400s: %s", self, strerror(errno));
		if (listener >= 0)
			close(listener);
		listener = -1;
		return -1;
	}
	logf_("behave deleted=%s", self);
	return 0;
}

// The hostile modes (-hostile), the Go beacon's (internal/demo/beacon,
// hostile.go) with its flags, bounds and log lines: what a sample with root
// in its guest tries against the lab's containment. Their TCP goes through
// dial_start with hostile_doc_allowed (the documentation ranges only), their
// DNS through udp_open to the lab's gateway, and their raw frames out of the
// guest's own lab link only (hostile_link_check), to the gateway's and the
// neighbour's addresses on it.
#define SPOOF_REPEATS 100           // five seconds: long enough to overlap the neighbour's beacons
#define SPOOF_GAP_NS 50000000LL     // 20 frames a second per variant
#define ARP_REPEATS 10
#define ARP_GAP_NS 100000000LL
#define SPRAY_PARALLEL 16
#define SPRAY_GAP_NS 5000000LL      // at most 200 new flows a second
#define HOSTILE_TIMEOUT_NS 2000000000LL
#define GATEWAY_MAC_WAIT_NS 3000000000LL
#define GATEWAY_MAC_PROBE_NS 100000000LL


// find_link picks the interface named -iface, or the one whose IPv4
// network holds the gateway, and checks it with hostile_link_check.
static int find_link(const struct hostile *h, struct hostile_link *l, char *err, size_t errlen) {
	struct ifreq reqs[32];
	struct ifconf ifc = {0};
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), found = 0;
	ifc.ifc_len = sizeof reqs;
	ifc.ifc_req = reqs;
	if (fd < 0 || ioctl(fd, SIOCGIFCONF, &ifc) < 0) {
		snprintf(err, errlen, "listing interfaces: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	for (size_t i = 0; !found && i < (size_t)ifc.ifc_len / sizeof reqs[0]; i++) {
		struct ifreq r = reqs[i];
		if (r.ifr_addr.sa_family != AF_INET || (h->iface[0] != '\0' && strcmp(r.ifr_name, h->iface) != 0))
			continue;
		uint32_t ip = ntohl(((struct sockaddr_in *)&r.ifr_addr)->sin_addr.s_addr), mask;
		if (ioctl(fd, SIOCGIFFLAGS, &r) < 0 || (r.ifr_flags & IFF_LOOPBACK))
			continue;
		if (ioctl(fd, SIOCGIFNETMASK, &r) < 0)
			continue;
		mask = ntohl(((struct sockaddr_in *)&r.ifr_netmask)->sin_addr.s_addr);
		if (h->iface[0] == '\0' && (h->gateway & mask) != (ip & mask))
			continue;
		if (ioctl(fd, SIOCGIFHWADDR, &r) < 0)
			continue;
		memcpy(l->mac, r.ifr_hwaddr.sa_data, 6);
		if (ioctl(fd, SIOCGIFINDEX, &r) < 0)
			continue;
		l->index = r.ifr_ifindex;
		l->ip = ip;
		for (l->bits = 0; l->bits < 32 && (mask & (0x80000000u >> l->bits)); l->bits++)
			;
		found = 1;
	}
	close(fd);
	if (!found) {
		char gw[16];
		ip_format(h->gateway, gw);
		snprintf(err, errlen, "no interface with an IPv4 address on the gateway %s's link", gw);
		return -1;
	}
	return hostile_link_check(h, l->ip, l->bits, err, errlen);
}

// send_frames sends every frame repeats times, one round every gap, from a
// packet socket bound to the guest's lab link (protocol 0: it receives
// nothing).
static int send_frames(const struct hostile_link *l, const struct frame *frames, int n, int repeats, int64_t gap, char *err, size_t errlen) {
	struct sockaddr_ll sll = {0};
	int pkt = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0), sent = 0;
	sll.sll_family = AF_PACKET;
	sll.sll_ifindex = l->index;
	if (pkt < 0 || bind(pkt, (struct sockaddr *)&sll, sizeof sll) < 0) {
		snprintf(err, errlen, "packet socket: %s", strerror(errno));
		if (pkt >= 0)
			close(pkt);
		return -1;
	}
	for (int r = 0; r < repeats; r++) {
		for (int i = 0; i < n; i++) {
			if (send(pkt, frames[i].b, frames[i].len, 0) != (ssize_t)frames[i].len) {
				snprintf(err, errlen, "sending on interface %d: %s", l->index, strerror(errno));
				close(pkt);
				return -1;
			}
			sent++;
		}
		if (r < repeats - 1 && !sleep_ns(gap))
			break;
	}
	close(pkt);
	logf_("hostile frames sent=%d", sent);
	return 0;
}

// arp_table_mac reads a's MAC from /proc/net/arp; 0 when complete there.
static int arp_table_mac(uint32_t a, unsigned char mac[6]) {
	char want[16], line[256], ip[64], hw[64], flags[64], addr[64];
	int found = 0;
	FILE *f = fopen("/proc/net/arp", "r");
	ip_format(a, want);
	while (f && !found && fgets(line, sizeof line, f)) {
		unsigned m[6];
		if (sscanf(line, "%63s %63s %63s %63s", ip, hw, flags, addr) == 4 && strcmp(ip, want) == 0 && strcmp(flags, "0x2") == 0 &&
			sscanf(addr, "%2x:%2x:%2x:%2x:%2x:%2x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) == 6) {
			for (int i = 0; i < 6; i++)
				mac[i] = (unsigned char)m[i];
			found = 1;
		}
	}
	if (f)
		fclose(f);
	return found ? 0 : -1;
}

// gateway_mac learns the gateway's MAC from the guest's ARP table, after a
// DNS datagram to the gateway has made the kernel resolve it.
static int gateway_mac(const struct hostile *h, unsigned char mac[6], char *err, size_t errlen) {
	unsigned char q[300];
	int qlen = dns_query(1, "gateway.example", q), fd = udp_open(h->gateway, err, errlen);
	if (fd >= 0) {
		send(fd, q, (size_t)qlen, 0); // only to make the kernel ask for the gateway's MAC: no answer is awaited
		close(fd);
	}
	for (int64_t deadline = now_ns() + GATEWAY_MAC_WAIT_NS;;) {
		if (arp_table_mac(h->gateway, mac) == 0)
			return 0;
		if (now_ns() > deadline || !sleep_ns(GATEWAY_MAC_PROBE_NS)) {
			char gw[16];
			ip_format(h->gateway, gw);
			snprintf(err, errlen, "the gateway %s is not in the ARP table", gw);
			return -1;
		}
	}
}

static int hostile_spoof(const struct hostile *h, char *err, size_t errlen) {
	struct hostile_link l;
	unsigned char gw_mac[6];
	struct frame frames[SPOOF_VARIANTS];
	char c2[16];
	if (find_link(h, &l, err, errlen) < 0)
		return -1;
	if (h->has_gateway_mac)
		memcpy(gw_mac, h->gateway_mac, 6);
	else if (gateway_mac(h, gw_mac, err, errlen) < 0)
		return -1;
	if (spoof_frames(h, &l, gw_mac, frames, err, errlen) < 0)
		return -1;
	ip_format(h->neighbour_c2, c2);
	for (int i = 0; i < SPOOF_VARIANTS; i++)
		logf_("hostile spoof variant=%s to=%s:%d seq=%#x", spoof_variants[i], c2, h->neighbour_c2_port, SPOOF_SEQ + (unsigned)i);
	return send_frames(&l, frames, SPOOF_VARIANTS, SPOOF_REPEATS, SPOOF_GAP_NS, err, errlen);
}

static int hostile_arp(const struct hostile *h, char *err, size_t errlen) {
	struct hostile_link l;
	struct frame frames[ARP_FRAMES];
	char gw[16], nb[16], mac[18];
	if (find_link(h, &l, err, errlen) < 0 || arp_frames(h, &l, frames, err, errlen) < 0)
		return -1;
	ip_format(h->gateway, gw);
	ip_format(h->neighbour, nb);
	mac_format(l.mac, mac);
	logf_("hostile arp claiming %s and %s as %s", gw, nb, mac);
	return send_frames(&l, frames, ARP_FRAMES, ARP_REPEATS, ARP_GAP_NS, err, errlen);
}

// request sends one raw HTTP request for host to -hostile-http and reads
// the status line; 0, or -1 with err (status holds what came).
static int request(const struct hostile *h, const char *host, char *status, size_t slen, char *err, size_t errlen) {
	int64_t deadline = now_ns() + HOSTILE_TIMEOUT_NS;
	char req[MAX_TEXT + 128], resp[512];
	status[0] = '\0';
	int fd = dial(h->http, h->http_port, hostile_doc_allowed, deadline, err, errlen);
	if (fd < 0)
		return -1;
	int rl = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: tb-beacon/1\r\nConnection: close\r\n\r\n", host);
	if (send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
		snprintf(err, errlen, "write: %s", strerror(errno));
		close(fd);
		return -1;
	}
	errno = 0;
	size_t n = read_until(fd, resp, sizeof resp, "\n", deadline);
	int e = errno;
	close(fd);
	char *eol = strchr(resp, '\n');
	if (eol)
		n = (size_t)(eol - resp);
	while (n > 0 && strchr(" \t\r\n", resp[n - 1]))
		n--;
	size_t skip = strspn(resp, " \t\r\n");
	quote(resp + skip, n > skip ? n - skip : 0, status, slen);
	if (!eol) {
		snprintf(err, errlen, "%s", e && e != EINTR ? strerror(e) : "EOF");
		return -1;
	}
	return 0;
}

static int hostile_names(const struct hostile *h, char *err, size_t errlen) {
	char to[24], status[512], q[1600], rerr[256];
	int answered = 0;
	if (!hostile_doc_allowed(h->http)) {
		ip_format(h->http, to);
		snprintf(err, errlen, "refusing %s:%d", to, h->http_port);
		return -1;
	}
	ip_format(h->http, to);
	snprintf(to + strlen(to), sizeof to - strlen(to), ":%d", h->http_port);
	for (int r = 0; r < HOSTILE_REPEATS && !stopping; r++)
		for (int i = 0; unresolved_hosts[i]; i++) {
			int ok = request(h, unresolved_hosts[i], status, sizeof status, rerr, sizeof rerr) == 0;
			logf_("hostile names host=\"%s\" to=%s status=\"%s\" err=%s", quote(unresolved_hosts[i], strlen(unresolved_hosts[i]), q, sizeof q),
				to, status, ok ? "<nil>" : rerr);
			answered += ok;
		}
	logf_("hostile names done answered=%d", answered);
	return 0;
}

static int hostile_aim(const struct hostile *h, char *err, size_t errlen) {
	char to[24];
	ip_format(h->aim, to);
	if (!hostile_doc_allowed(h->aim)) {
		snprintf(err, errlen, "refusing %s:%d", to, h->aim_port);
		return -1;
	}
	snprintf(to + strlen(to), sizeof to - strlen(to), ":%d", h->aim_port);
	// On a fixed period from the start, as a ticker: a slow connection
	// does not push the later ones back.
	int64_t start = now_ns();
	for (long i = 1; i <= h->aim_count; i++) {
		char derr[256];
		int fd = dial(h->aim, h->aim_port, hostile_doc_allowed, now_ns() + HOSTILE_TIMEOUT_NS, derr, sizeof derr);
		if (fd >= 0)
			close(fd);
		logf_("hostile aim seq=%ld to=%s err=%s", i, to, fd >= 0 ? "<nil>" : derr);
		if (i == h->aim_count)
			break;
		int64_t next = start + i * h->aim_interval_ns, now = now_ns();
		while (next < now)
			next += h->aim_interval_ns;
		if (!sleep_ns(next - now))
			break;
	}
	return 0;
}

// A paced batch: start(i) opens what item i sends on (a non-blocking
// socket, or -1 when it could not), done(fd, i) says whether it succeeded
// once fd shows events; each gets HOSTILE_TIMEOUT_NS.
struct paced_job {
	const struct hostile *h;
	char (*names)[80];
	int (*start)(const struct paced_job *, int i);
	int (*done)(const struct paced_job *, int fd, int i);
	short events;
};

// paced runs items 0..n-1 with at most SPRAY_PARALLEL in flight, one start
// every SPRAY_GAP_NS, and returns how many succeeded.
static int paced(const struct paced_job *j, int n) {
	struct pollfd fds[SPRAY_PARALLEL];
	int item[SPRAY_PARALLEL], used = 0, next = 0, ok = 0;
	int64_t deadline[SPRAY_PARALLEL], next_start = now_ns() + SPRAY_GAP_NS;
	while (!stopping && (next < n || used > 0)) {
		int64_t now = now_ns(), wake = now + HOSTILE_TIMEOUT_NS;
		if (next < n && used < SPRAY_PARALLEL && now >= next_start) {
			int fd = j->start(j, next);
			if (fd >= 0) {
				fds[used] = (struct pollfd){fd, j->events, 0};
				item[used] = next, deadline[used] = now + HOSTILE_TIMEOUT_NS;
				used++;
			}
			next++;
			next_start = now + SPRAY_GAP_NS;
			continue;
		}
		if (next < n && used < SPRAY_PARALLEL)
			wake = next_start;
		for (int k = 0; k < used; k++)
			if (deadline[k] < wake)
				wake = deadline[k];
		int ms = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
		if (poll(fds, (nfds_t)used, ms) < 0 && errno != EINTR)
			break;
		now = now_ns();
		for (int k = 0; k < used;) {
			if (fds[k].revents == 0 && deadline[k] > now) {
				k++;
				continue;
			}
			if (fds[k].revents != 0)
				ok += j->done(j, fds[k].fd, item[k]);
			close(fds[k].fd);
			used--;
			fds[k] = fds[used], item[k] = item[used], deadline[k] = deadline[used];
		}
	}
	for (int k = 0; k < used; k++)
		close(fds[k].fd);
	return ok;
}

static int spray_start(const struct paced_job *j, int i) {
	char err[256];
	int pending;
	return dial_start(j->h->spray, i + 1, hostile_doc_allowed, &pending, err, sizeof err);
}

static int spray_done(const struct paced_job *j, int fd, int i) {
	(void)j, (void)i;
	return dial_error(fd) == 0;
}

static int dns_start(const struct paced_job *j, int i) {
	unsigned char q[300];
	char err[256];
	int qlen = dns_query((uint16_t)i, j->names[i], q);
	int fd = qlen < 0 ? -1 : udp_open(j->h->gateway, err, sizeof err);
	if (fd < 0)
		return -1;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	if (send(fd, q, (size_t)qlen, 0) != qlen) {
		close(fd);
		return -1;
	}
	return fd;
}

static int dns_done(const struct paced_job *j, int fd, int i) {
	unsigned char r[512];
	(void)j;
	ssize_t n = recv(fd, r, sizeof r, 0);
	return n >= 2 && r[0] == (unsigned char)(i >> 8) && r[1] == (unsigned char)i;
}

static int hostile_spray(const struct hostile *h, char *err, size_t errlen) {
	static char names[MAX_DNS_BURST][80];
	char to[16], gw[16];
	ip_format(h->spray, to);
	ip_format(h->gateway, gw);
	if (!hostile_doc_allowed(h->spray) || (h->dns_burst > 0 && !hostile_lab_allowed(h->gateway))) {
		snprintf(err, errlen, "refusing %s or %s", to, gw);
		return -1;
	}
	struct paced_job spray = {h, NULL, spray_start, spray_done, POLLOUT};
	int open_ = paced(&spray, (int)h->spray_ports);
	logf_("hostile spray to=%s ports=1-%ld open=%d", to, h->spray_ports, open_);
	for (long i = 0; i < h->dns_burst; i++)
		snprintf(names[i], sizeof names[i], "%08x.%.60s", (unsigned)(rand01() * 4294967296.0), h->dns_domain);
	struct paced_job dns = {h, names, dns_start, dns_done, POLLIN};
	int answered = paced(&dns, (int)h->dns_burst);
	logf_("hostile dns to=%s:53 queries=%ld answered=%d", gw, h->dns_burst, answered);
	return 0;
}

// run_hostile runs each mode in the order given; a mode that fails is
// logged and the others still run. failed names each failed mode, on one
// line ("" when none did).
static void run_hostile(const struct hostile *h, char *failed, size_t flen) {
	size_t o = 0;
	failed[0] = '\0';
	for (int i = 0; i < h->norder && !stopping; i++) {
		char err[512] = "";
		int r = 0, mode = h->order[i];
		switch (1 << mode) {
		case HOSTILE_NAMES: r = hostile_names(h, err, sizeof err); break;
		case HOSTILE_SPOOF: r = hostile_spoof(h, err, sizeof err); break;
		case HOSTILE_ARP: r = hostile_arp(h, err, sizeof err); break;
		case HOSTILE_AIM: r = hostile_aim(h, err, sizeof err); break;
		case HOSTILE_SPRAY: r = hostile_spray(h, err, sizeof err); break;
		}
		if (r < 0) {
			logf_("hostile %s failed: %s", hostile_mode_names[mode], err);
			if (o < flen)
				o += (size_t)snprintf(failed + o, flen - o, "%s%s: %s", o ? "; " : "", hostile_mode_names[mode], err);
		}
	}
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

	if (c.hostile.modes != 0) {
		// A hostile mode's failure is in the log; the beacon still beacons.
		char failed_modes[2048];
		run_hostile(&c.hostile, failed_modes, sizeof failed_modes);
		if (failed_modes[0] != '\0')
			fprintf(stderr, "beacon: %s\n", failed_modes);
		if (c.c2[0] == '\0')
			return 0;
	}

	long sent = 0, answered = 0, failed = 0, scanned = 0, open_ = 0;
	logf_("start c2=%s port=%d proto=%s interval=%s jitter=%.2f scan=%d", c.c2, c.port, proto_names[c.proto],
		fmt_duration(c.interval_ns, d, sizeof d), c.jitter, c.nscan);
	for (int i = 0; i < c.nscan; i++) {
		scanned++;
		open_ += probe(&c, c.scan[i]);
	}
	if (c.proto != PROTO_HTTP)
		answered = run_session(&c, &sent, &failed);
	for (long seq = 1; c.proto == PROTO_HTTP && (c.count == 0 || seq <= c.count); seq++) {
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
	// An attack the C2 ordered runs to its end, as the Go beacon waits for it.
	while (attack.fd >= 0 && wait_io(-1, attack.next) >= 0)
		;
	logf_("done sent=%ld answered=%ld failed=%ld scanned=%ld open=%ld", sent, answered, failed, scanned, open_);
	return answered == 0 ? 3 : 0;
}
