// Not Go: the tag keeps the go tool from taking this directory's C for cgo.
//go:build ignore

// The C beacon's command line and address policy: the same flags, checks
// and networks as the Go beacon (internal/demo/beacon), so that one plan's
// arguments drive either. No networking here: a host test links this file
// alone.
#define _POSIX_C_SOURCE 200809L
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct net {
	uint32_t addr, mask;
};

#define NET(a, b, c, d, bits) {((uint32_t)(a) << 24) | ((b) << 16) | ((c) << 8) | (d), (uint32_t)(0xffffffffULL << (32 - (bits)))}

// Fixed in the code so that no argument can widen them. The first four are
// the scan networks: the documentation ranges standing in for the internet
// and the lab's guest network; then the sinkhole link (where a sinkholed
// name points) and loopback, where only the C2 may be.
static const struct net nets[] = {
	NET(192, 0, 2, 0, 24), NET(198, 51, 100, 0, 24), NET(203, 0, 113, 0, 24), NET(10, 13, 37, 0, 24),
	NET(10, 13, 38, 0, 24), NET(127, 0, 0, 0, 8),
	// The resolver may also be on a private network: the guest's
	// resolv.conf names the lab's, which need not be 10.13.37.0/24.
	NET(10, 0, 0, 0, 8), NET(172, 16, 0, 0, 12), NET(192, 168, 0, 0, 16),
};

static int in_nets(uint32_t a, size_t n) {
	for (size_t i = 0; i < n; i++)
		if ((a & nets[i].mask) == nets[i].addr)
			return 1;
	return 0;
}

int scan_allowed(uint32_t a) { return in_nets(a, 4); }
int c2_allowed(uint32_t a) { return in_nets(a, 6); }
int resolver_allowed(uint32_t a) { return in_nets(a, sizeof nets / sizeof nets[0]); }

static int ip4_parse(const char *s, uint32_t *out) {
	uint32_t a = 0;
	for (int i = 0; i < 4; i++) {
		if (i > 0 && *s++ != '.')
			return 0;
		if (!isdigit((unsigned char)*s) || (s[0] == '0' && isdigit((unsigned char)s[1])))
			return 0; // empty, or a leading zero (netip reads neither)
		unsigned v = 0;
		for (int d = 0; isdigit((unsigned char)*s); d++, s++) {
			v = v * 10 + (unsigned)(*s - '0');
			if (d > 2 || v > 255)
				return 0;
		}
		a = a << 8 | v;
	}
	if (*s != '\0')
		return 0;
	*out = a;
	return 1;
}

int ip_parse(const char *s, uint32_t *out) {
	if (ip4_parse(s, out))
		return 1;
	if (strchr(s, ':') == NULL)
		return 0;
	// netip unmaps ::ffff:a.b.c.d to a.b.c.d before checking; any other
	// IPv6 address is outside every allowed network, so it need not be
	// parsed further to be refused.
	if (strncasecmp(s, "::ffff:", 7) == 0 && ip4_parse(s + 7, out))
		return 1;
	return 2;
}

void ip_format(uint32_t a, char buf[16]) {
	snprintf(buf, 16, "%u.%u.%u.%u", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
}

static int fail(char *err, size_t n, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, n, fmt, ap);
	va_end(ap);
	return -1;
}

// parse_duration reads Go's time.ParseDuration syntax ("1.5s", "2m30s",
// "0") into nanoseconds, with Go's arithmetic so that both beacons agree.
static int parse_duration(const char *s, int64_t *out) {
	static const struct {
		const char *unit;
		uint64_t ns;
	} units[] = {{"ns", 1}, {"us", 1000}, {"\xc2\xb5s", 1000}, {"\xce\xbcs", 1000}, {"ms", 1000000},
		{"s", 1000000000ULL}, {"m", 60000000000ULL}, {"h", 3600000000000ULL}};
	const uint64_t max = (uint64_t)INT64_MAX;
	uint64_t total = 0;
	int neg = 0;
	if (*s == '-' || *s == '+')
		neg = *s++ == '-';
	if (strcmp(s, "0") == 0) {
		*out = 0;
		return 0;
	}
	if (*s == '\0')
		return -1;
	while (*s) {
		uint64_t v = 0, f = 0, unit = 0;
		double scale = 1;
		const char *start = s;
		for (; isdigit((unsigned char)*s); s++) {
			if (v > max / 10)
				return -1;
			v = v * 10 + (uint64_t)(*s - '0');
		}
		int digits = s != start;
		if (*s == '.') {
			for (start = ++s; isdigit((unsigned char)*s); s++)
				if (f <= max / 10) // Go drops digits past what fits
					f = f * 10 + (uint64_t)(*s - '0'), scale *= 10;
			digits |= s != start;
		}
		if (!digits)
			return -1;
		size_t ul = 0;
		while (s[ul] && !isdigit((unsigned char)s[ul]) && s[ul] != '.')
			ul++;
		for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
			if (strlen(units[i].unit) == ul && strncmp(s, units[i].unit, ul) == 0)
				unit = units[i].ns;
		if (unit == 0)
			return -1; // missing or unknown unit
		s += ul;
		if (v > max / unit)
			return -1;
		v *= unit;
		if (f > 0)
			v += (uint64_t)((double)f * ((double)unit / scale));
		total += v;
		if (v > max || total > max)
			return -1;
	}
	*out = neg ? -(int64_t)total : (int64_t)total;
	return 0;
}

// parse_int reads what Go's flag.Int accepts (strconv base 0: 0x…, 0…, decimal).
static int parse_int(const char *s, long min, long max, long *out) {
	char *end;
	if (*s == '\0' || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	long long v = strtoll(s, &end, 0);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return -1;
	*out = (long)v;
	return 0;
}

static int set_text(char *dst, const char *v) {
	if (strlen(v) >= MAX_TEXT)
		return -1;
	strcpy(dst, v);
	return 0;
}

static const char usage[] =
	"usage: beacon -c2 NAME [-c2-addr IP] [-port 80] [-path /gate] [-id tb-beacon]\n"
	"  [-c2-proto http|mirai|gafgyt|irc]\n"
	"  [-interval 5s] [-jitter 0.2] [-count 0] [-retry 1s] [-retries 3] [-timeout 3s]\n"
	"  [-scan IP,IP...] [-scan-port 23] [-behave DIR [-behave-listen PORT]]\n"
	"  [-hostile names,spoof,arp,aim,spray [-iface IF] [-gateway IP] [-gateway-mac MAC]\n"
	"   [-neighbour IP] [-neighbour-mac MAC] [-neighbour-c2 IP:PORT] [-hostile-http IP:PORT]\n"
	"   [-hostile-aim IP:PORT] [-hostile-aim-count 6] [-hostile-aim-interval 2s]\n"
	"   [-hostile-spray IP] [-hostile-spray-ports 128] [-hostile-dns 100]\n"
	"   [-hostile-dns-domain spray.example]]\n"
	"Contacts only the C2 and the scan targets given, within 192.0.2.0/24,\n"
	"198.51.100.0/24, 203.0.113.0/24 and the lab (the C2 also on the sinkhole\n"
	"link 10.13.38.0/24 or loopback); the hostile modes only the documentation\n"
	"ranges and the guest's own link inside 10.0.0.0/8; a C2's attack order only\n"
	"the documentation ranges, at most 1,000 packets in all.\n";

const char *const proto_names[PROTO_COUNT] = {"http", "mirai", "gafgyt", "irc"};

const char *const hostile_mode_names[HOSTILE_MODES] = {"names", "spoof", "arp", "aim", "spray"};
const char *const unresolved_hosts[] = {"com", "a/b#c", "bad name.example", "cdn-update.example", NULL};
const char *const spoof_variants[SPOOF_VARIANTS] = {"ip", "mac", "ip+mac", "ipv6", "0.0.0.0"};

// The hostile modes' networks: the documentation ranges, then the lab.
static const struct net doc_nets[] = {NET(192, 0, 2, 0, 24), NET(198, 51, 100, 0, 24), NET(203, 0, 113, 0, 24)};
static const struct net lab_range = NET(10, 0, 0, 0, 8);
#define DOC_NETS "192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24"
#define LAB_RANGE "10.0.0.0/8"

int hostile_doc_allowed(uint32_t a) {
	for (size_t i = 0; i < sizeof doc_nets / sizeof doc_nets[0]; i++)
		if ((a & doc_nets[i].mask) == doc_nets[i].addr)
			return 1;
	return 0;
}

int hostile_lab_allowed(uint32_t a) { return (a & lab_range.mask) == lab_range.addr; }

int attack_allowed(uint32_t a) { return hostile_doc_allowed(a); }

void mac_format(const unsigned char m[6], char buf[18]) {
	snprintf(buf, 18, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
}

int hostile_link_check(const struct hostile *h, uint32_t ip, int bits, char *err, size_t errlen) {
	char a[16], n[16];
	uint32_t mask = bits <= 0 ? 0 : (uint32_t)(0xffffffffULL << (32 - bits));
	ip_format(ip, a);
	ip_format(ip & mask, n);
	if (bits < 8 || bits > 32 || !hostile_lab_allowed(ip))
		return fail(err, errlen, "refusing raw frames on %s/%d: not a network inside " LAB_RANGE, a, bits);
	const uint32_t on[] = {h->gateway, h->neighbour};
	const int given[] = {h->has_gateway, h->has_neighbour};
	for (int i = 0; i < 2; i++)
		if (given[i] && (on[i] & mask) != (ip & mask)) {
			ip_format(on[i], a);
			return fail(err, errlen, "refusing %s: not on the guest's link %s/%d", a, n, bits);
		}
	return 0;
}

static int hex(char ch) {
	if (isdigit((unsigned char)ch))
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

// mac_parse reads a MAC as Go's net.ParseMAC does (aa:bb:…, aa-bb-…,
// aabb.ccdd.eeff), of the 6-byte length only; 0 on success.
static int mac_parse(const char *s, unsigned char out[6]) {
	size_t n = strlen(s);
	if (n == 17 && (s[2] == ':' || s[2] == '-')) {
		for (int i = 0; i < 6; i++) {
			int hi = hex(s[3 * i]), lo = hex(s[3 * i + 1]);
			if (hi < 0 || lo < 0 || (i < 5 && s[3 * i + 2] != s[2]))
				return -1;
			out[i] = (unsigned char)(hi << 4 | lo);
		}
		return 0;
	}
	if (n == 14 && s[4] == '.' && s[9] == '.') {
		for (int i = 0; i < 6; i++) {
			const char *g = s + 5 * (i / 2) + 2 * (i % 2);
			int hi = hex(g[0]), lo = hex(g[1]);
			if (hi < 0 || lo < 0)
				return -1;
			out[i] = (unsigned char)(hi << 4 | lo);
		}
		return 0;
	}
	return -1;
}

// addr_port_parse reads IPv4:PORT as Go's netip.ParseAddrPort does, of
// IPv4 only; 0 on success (port 1-65535).
static int addr_port_parse(const char *s, uint32_t *a, int *port) {
	const char *colon = strrchr(s, ':');
	char host[64];
	if (!colon || (size_t)(colon - s) >= sizeof host || colon[1] == '\0')
		return -1;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	if (!ip4_parse(host, a))
		return -1;
	long p = 0;
	for (const char *d = colon + 1; *d; d++) {
		if (!isdigit((unsigned char)*d))
			return -1;
		p = p * 10 + (*d - '0');
		if (p > 65535)
			return -1;
	}
	if (p == 0)
		return -1;
	*port = (int)p;
	return 0;
}

static uint16_t checksum(const unsigned char *p, size_t n, uint32_t sum) {
	for (size_t i = 0; i + 1 < n; i += 2)
		sum += (uint32_t)p[i] << 8 | p[i + 1];
	if (n & 1)
		sum += (uint32_t)p[n - 1] << 8;
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

static unsigned char *put16(unsigned char *p, uint32_t v) {
	p[0] = (unsigned char)(v >> 8), p[1] = (unsigned char)v;
	return p + 2;
}

static unsigned char *put32(unsigned char *p, uint32_t v) {
	return put16(put16(p, v >> 16), v & 0xffff);
}

// doc_ipv6 writes a in the last 32 bits of the IPv6 documentation prefix
// 2001:db8::/32 (the Go beacon's DocIPv6).
static void doc_ipv6(unsigned char out[16], uint32_t a) {
	static const unsigned char prefix[4] = {0x20, 0x01, 0x0d, 0xb8};
	memset(out, 0, 16);
	memcpy(out, prefix, 4);
	put32(out + 12, a);
}

// The checksums are computed here, as a kernel would: the frames are sent
// whole from a packet socket.
int spoof_frames(const struct hostile *h, const struct hostile_link *l, const unsigned char gw_mac[6],
	struct frame frames[SPOOF_VARIANTS], char *err, size_t errlen) {
	if (!hostile_doc_allowed(h->neighbour_c2)) {
		char ip[16];
		ip_format(h->neighbour_c2, ip);
		snprintf(err, errlen, "refusing %s: outside " DOC_NETS, ip);
		return -1;
	}
	if (hostile_link_check(h, l->ip, l->bits, err, errlen) < 0)
		return -1;
	const unsigned char *macs[SPOOF_VARIANTS] = {l->mac, h->neighbour_mac, h->neighbour_mac, l->mac, l->mac};
	const uint32_t srcs[SPOOF_VARIANTS] = {h->neighbour, l->ip, h->neighbour, h->neighbour, 0};
	for (int i = 0; i < SPOOF_VARIANTS; i++) {
		int v6 = strcmp(spoof_variants[i], "ipv6") == 0;
		unsigned char *f = frames[i].b, *ip = f + 14, *tcp = ip + (v6 ? 40 : 20);
		uint32_t sum = 0;
		memset(f, 0, MAX_FRAME);
		memcpy(f, gw_mac, 6);
		memcpy(f + 6, macs[i], 6);
		if (v6) {
			put16(f + 12, 0x86dd);
			ip[0] = 6 << 4;
			put16(ip + 4, 20); // payload length
			ip[6] = 6, ip[7] = 64; // TCP; hop limit
			doc_ipv6(ip + 8, srcs[i]);
			doc_ipv6(ip + 24, h->neighbour_c2);
			for (int j = 8; j < 40; j += 2) // the pseudo-header's addresses
				sum += (uint32_t)ip[j] << 8 | ip[j + 1];
			frames[i].len = 14 + 40 + 20;
		} else {
			put16(f + 12, 0x0800);
			ip[0] = 0x45, ip[8] = 64, ip[9] = 6; // IPv4, 20-byte header; TTL; TCP
			put16(ip + 2, 40);
			put32(ip + 12, srcs[i]);
			put32(ip + 16, h->neighbour_c2);
			put16(ip + 10, checksum(ip, 20, 0));
			for (int j = 12; j < 20; j += 2)
				sum += (uint32_t)ip[j] << 8 | ip[j + 1];
			frames[i].len = 60;
		}
		sum += 6 + 20; // the pseudo-header's protocol and TCP length
		put16(tcp, 47000 + (uint32_t)i);
		put16(tcp + 2, (uint32_t)h->neighbour_c2_port);
		put32(tcp + 4, SPOOF_SEQ + (uint32_t)i);
		tcp[12] = 5 << 4, tcp[13] = 0x02; // 20-byte header; SYN
		put16(tcp + 14, 64240);
		put16(tcp + 16, checksum(tcp, 20, sum));
	}
	return 0;
}

int arp_frames(const struct hostile *h, const struct hostile_link *l, struct frame frames[ARP_FRAMES], char *err, size_t errlen) {
	static const unsigned char bcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	if (hostile_link_check(h, l->ip, l->bits, err, errlen) < 0)
		return -1;
	const uint32_t claimed[ARP_FRAMES] = {h->gateway, h->gateway, h->neighbour}, target[ARP_FRAMES] = {h->gateway, h->neighbour, h->neighbour};
	const unsigned char *dst[ARP_FRAMES] = {bcast, h->neighbour_mac, bcast};
	for (int i = 0; i < ARP_FRAMES; i++) {
		unsigned char *f = frames[i].b, *arp = f + 14;
		memset(f, 0, MAX_FRAME);
		frames[i].len = 60;
		memcpy(f, dst[i], 6);
		memcpy(f + 6, l->mac, 6);
		put16(f + 12, 0x0806);
		put16(put16(arp, 1), 0x0800); // Ethernet, IPv4
		arp[4] = 6, arp[5] = 4;
		put16(arp + 6, 2); // reply
		memcpy(arp + 8, l->mac, 6);
		put32(arp + 14, claimed[i]);
		memcpy(arp + 18, dst[i], 6);
		put32(arp + 24, target[i]);
	}
	return 0;
}

// The -hostile flags' text, read once the flags are parsed, as the Go
// beacon's hostileFlags reads them.
struct hostile_text {
	char modes[MAX_TEXT], gateway[MAX_TEXT], gateway_mac[MAX_TEXT], neighbour[MAX_TEXT], neighbour_mac[MAX_TEXT];
	char neighbour_c2[MAX_TEXT], http[MAX_TEXT], aim[MAX_TEXT], spray[MAX_TEXT];
};

static int hostile_addr(const char *flag, const char *v, int lab, int *has, uint32_t *out, char *err, size_t errlen) {
	if (*v == '\0')
		return 0;
	if (!ip4_parse(v, out))
		return fail(err, errlen, "-%s \"%s\" is not an IPv4 address", flag, v);
	if (lab ? !hostile_lab_allowed(*out) : !hostile_doc_allowed(*out)) {
		char ip[16];
		ip_format(*out, ip);
		return fail(err, errlen, "refusing -%s %s: outside %s", flag, ip, lab ? LAB_RANGE : DOC_NETS);
	}
	*has = 1;
	return 0;
}

static int hostile_addr_port(const char *flag, const char *v, int *has, uint32_t *out, int *port, char *err, size_t errlen) {
	if (*v == '\0')
		return 0;
	if (addr_port_parse(v, out, port) < 0)
		return fail(err, errlen, "-%s \"%s\" is not an IPv4 ADDR:PORT", flag, v);
	if (!hostile_doc_allowed(*out)) {
		char ip[16];
		ip_format(*out, ip);
		return fail(err, errlen, "refusing -%s %s: outside " DOC_NETS, flag, ip);
	}
	*has = 1;
	return 0;
}

static int hostile_mac(const char *flag, const char *v, int *has, unsigned char out[6], char *err, size_t errlen) {
	if (*v == '\0')
		return 0;
	if (mac_parse(v, out) < 0)
		return fail(err, errlen, "-%s \"%s\" is not an Ethernet MAC", flag, v);
	*has = 1;
	return 0;
}

// hostile_parse is the Go beacon's hostileFlags reader and validate: the
// modes, then every target refused outside the documentation ranges and
// the lab, then what each mode needs.
static int hostile_parse(struct hostile *h, const struct hostile_text *t, char *err, size_t errlen) {
	char modes[MAX_TEXT];
	strcpy(modes, t->modes);
	for (char *m = modes, *next;; m = next + 1) {
		next = strchr(m, ',');
		if (next)
			*next = '\0';
		while (isspace((unsigned char)*m))
			m++;
		for (size_t l = strlen(m); l > 0 && isspace((unsigned char)m[l - 1]); l--)
			m[l - 1] = '\0';
		int k = -1;
		for (int i = 0; i < HOSTILE_MODES; i++)
			if (strcmp(m, hostile_mode_names[i]) == 0)
				k = i;
		if (k < 0)
			return fail(err, errlen, "-hostile: unknown mode \"%s\" (want names,spoof,arp,aim,spray)", m);
		if (!(h->modes & 1 << k))
			h->modes |= 1 << k, h->order[h->norder++] = k;
		if (!next)
			break;
	}
	if (hostile_addr("gateway", t->gateway, 1, &h->has_gateway, &h->gateway, err, errlen) < 0 ||
		hostile_addr("neighbour", t->neighbour, 1, &h->has_neighbour, &h->neighbour, err, errlen) < 0 ||
		hostile_addr("hostile-spray", t->spray, 0, &h->has_spray, &h->spray, err, errlen) < 0 ||
		hostile_mac("gateway-mac", t->gateway_mac, &h->has_gateway_mac, h->gateway_mac, err, errlen) < 0 ||
		hostile_mac("neighbour-mac", t->neighbour_mac, &h->has_neighbour_mac, h->neighbour_mac, err, errlen) < 0 ||
		hostile_addr_port("neighbour-c2", t->neighbour_c2, &h->has_neighbour_c2, &h->neighbour_c2, &h->neighbour_c2_port, err, errlen) < 0 ||
		hostile_addr_port("hostile-http", t->http, &h->has_http, &h->http, &h->http_port, err, errlen) < 0 ||
		hostile_addr_port("hostile-aim", t->aim, &h->has_aim, &h->aim, &h->aim_port, err, errlen) < 0)
		return -1;
	for (int i = 0; i < h->norder; i++) {
		switch (1 << h->order[i]) {
		case HOSTILE_NAMES:
			if (!h->has_http)
				return fail(err, errlen, "-hostile names needs -hostile-http");
			break;
		case HOSTILE_SPOOF:
			if (!h->has_gateway || !h->has_neighbour || !h->has_neighbour_mac || !h->has_neighbour_c2)
				return fail(err, errlen, "-hostile spoof needs -gateway, -neighbour, -neighbour-mac, -neighbour-c2");
			break;
		case HOSTILE_ARP:
			if (!h->has_gateway || !h->has_neighbour || !h->has_neighbour_mac)
				return fail(err, errlen, "-hostile arp needs -gateway, -neighbour, -neighbour-mac");
			break;
		case HOSTILE_AIM:
			if (!h->has_aim || h->aim_count < 1 || h->aim_count > MAX_AIM_COUNT || h->aim_interval_ns < MIN_AIM_INTERVAL_NS)
				return fail(err, errlen, "-hostile aim needs -hostile-aim, -hostile-aim-count within 1-%d and -hostile-aim-interval at least 500ms", MAX_AIM_COUNT);
			break;
		case HOSTILE_SPRAY:
			if (!h->has_spray || h->spray_ports < 1 || h->spray_ports > MAX_SPRAY_PORTS || h->dns_burst < 0 || h->dns_burst > MAX_DNS_BURST)
				return fail(err, errlen, "-hostile spray needs -hostile-spray, -hostile-spray-ports within 1-%d and -hostile-dns within 0-%d", MAX_SPRAY_PORTS, MAX_DNS_BURST);
			if (h->dns_burst > 0 && (!h->has_gateway || strpbrk(h->dns_domain, " /#\r\n") || h->dns_domain[0] == '\0'))
				return fail(err, errlen, "-hostile spray needs -gateway and a -hostile-dns-domain name for its DNS burst");
			break;
		}
	}
	return 0;
}

int parse_args(int argc, char **argv, struct config *c, char *err, size_t errlen) {
	const char *scan[MAX_SCAN * 2];
	int nscan = 0;
	char c2addr[MAX_TEXT] = "";
	static struct hostile_text ht;
	struct hostile *h = &c->hostile;
	char scanbuf[8192];
	size_t scanlen = 0;

	memset(c, 0, sizeof *c);
	c->port = 80;
	strcpy(c->path, "/gate");
	strcpy(c->id, "tb-beacon");
	c->interval_ns = 5000000000LL;
	c->jitter = 0.2;
	c->retry_ns = 1000000000LL;
	c->retries = 3;
	c->timeout_ns = 3000000000LL;
	c->scan_port = 23;
	memset(&ht, 0, sizeof ht);
	strcpy(ht.http, "192.0.2.80:80");
	strcpy(ht.aim, "203.0.113.77:8443");
	strcpy(ht.spray, "192.0.2.81");
	h->aim_count = 6;
	h->aim_interval_ns = 2000000000LL;
	h->spray_ports = 128;
	h->dns_burst = 100;
	strcpy(h->dns_domain, "spray.example");

	// Go's flag package: -name value, -name=value, one or two dashes;
	// the first non-flag argument or "--" ends the flags.
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (a[0] != '-' || a[1] == '\0')
			break;
		a++;
		if (*a == '-') {
			a++;
			if (*a == '\0')
				break; // "--"
		}
		if (*a == '-' || *a == '=')
			return fail(err, errlen, "bad flag syntax: %s", argv[i]);
		char name[32];
		const char *eq = strchr(a, '='), *v;
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		if (nl >= sizeof name)
			nl = sizeof name - 1;
		memcpy(name, a, nl);
		name[nl] = '\0';
		if (strcmp(name, "h") == 0 || strcmp(name, "help") == 0) {
			fputs(usage, stderr);
			return fail(err, errlen, "flag: help requested");
		}
		static const char *const known[] = {"c2", "c2-addr", "port", "path", "id", "interval", "jitter",
			"count", "retry", "retries", "timeout", "scan", "scan-port", "behave", "behave-listen",
			"hostile", "iface", "gateway", "gateway-mac", "neighbour", "neighbour-mac", "neighbour-c2", "hostile-http",
			"hostile-aim", "hostile-aim-count", "hostile-aim-interval", "hostile-spray", "hostile-spray-ports",
			"hostile-dns", "hostile-dns-domain", "c2-proto"};
		int k = -1;
		for (size_t j = 0; j < sizeof known / sizeof known[0]; j++)
			if (strcmp(name, known[j]) == 0)
				k = (int)j;
		if (k < 0) {
			fputs(usage, stderr);
			return fail(err, errlen, "flag provided but not defined: -%s", name);
		}
		if (eq)
			v = eq + 1;
		else if (i + 1 < argc)
			v = argv[++i];
		else
			return fail(err, errlen, "flag needs an argument: -%s", name);
		long n;
		int bad = 0;
		switch (k) {
		case 0: bad = set_text(c->c2, v); break;
		case 1: bad = set_text(c2addr, v); break;
		case 2: bad = parse_int(v, INT_MIN, INT_MAX, &n); c->port = (int)n; break;
		case 3: bad = set_text(c->path, v); break;
		case 4: bad = set_text(c->id, v); break;
		case 5: bad = parse_duration(v, &c->interval_ns); break;
		case 6: {
			char *end;
			c->jitter = strtod(v, &end);
			bad = *v == '\0' || isspace((unsigned char)*v) || *end != '\0' || isnan(c->jitter);
			break;
		}
		case 7: bad = parse_int(v, LONG_MIN, LONG_MAX, &c->count); break;
		case 8: bad = parse_duration(v, &c->retry_ns); break;
		case 9: bad = parse_int(v, LONG_MIN, LONG_MAX, &c->retries); break;
		case 10: bad = parse_duration(v, &c->timeout_ns); break;
		case 11: {
			// Repeated and comma-separated targets accumulate, as in Go.
			size_t l = strlen(v);
			if (scanlen + l + 1 > sizeof scanbuf)
				return fail(err, errlen, "too many scan targets (at most %d)", MAX_SCAN);
			char *p = memcpy(scanbuf + scanlen, v, l + 1);
			scanlen += l + 1;
			for (char *tok = p;; tok++) {
				char *comma = strchr(tok, ',');
				if (comma)
					*comma = '\0';
				if (nscan == MAX_SCAN * 2)
					return fail(err, errlen, "too many scan targets (at most %d)", MAX_SCAN);
				scan[nscan++] = tok;
				if (!comma)
					break;
				tok = comma;
			}
			break;
		}
		case 12: bad = parse_int(v, INT_MIN, INT_MAX, &n); c->scan_port = (int)n; break;
		case 13: bad = set_text(c->behave, v); break;
		case 14: bad = parse_int(v, INT_MIN, INT_MAX, &n); c->behave_listen = (int)n; break;
		case 15: bad = set_text(ht.modes, v); break;
		case 16: bad = set_text(h->iface, v); break;
		case 17: bad = set_text(ht.gateway, v); break;
		case 18: bad = set_text(ht.gateway_mac, v); break;
		case 19: bad = set_text(ht.neighbour, v); break;
		case 20: bad = set_text(ht.neighbour_mac, v); break;
		case 21: bad = set_text(ht.neighbour_c2, v); break;
		case 22: bad = set_text(ht.http, v); break;
		case 23: bad = set_text(ht.aim, v); break;
		case 24: bad = parse_int(v, INT_MIN, INT_MAX, &h->aim_count); break;
		case 25: bad = parse_duration(v, &h->aim_interval_ns); break;
		case 26: bad = set_text(ht.spray, v); break;
		case 27: bad = parse_int(v, INT_MIN, INT_MAX, &h->spray_ports); break;
		case 28: bad = parse_int(v, INT_MIN, INT_MAX, &h->dns_burst); break;
		case 29: bad = set_text(h->dns_domain, v); break;
		case 30:
			bad = 1;
			for (int j = 0; j < PROTO_COUNT; j++)
				if (strcmp(v, proto_names[j]) == 0)
					c->proto = j, bad = 0;
			break;
		}
		if (bad) {
			fputs(usage, stderr);
			return fail(err, errlen, "invalid value \"%s\" for flag -%s", v, name);
		}
	}

	uint32_t a;
	if (ht.modes[0] != '\0' && hostile_parse(h, &ht, err, errlen) < 0)
		return -1;
	if (c->c2[0] == '\0' && h->modes == 0)
		return fail(err, errlen, "-c2 is required (unless -hostile is given)");
	if (c->port < 1 || c->port > 65535 || c->scan_port < 1 || c->scan_port > 65535)
		return fail(err, errlen, "ports must be 1-65535");
	if (c->interval_ns <= 0 || c->jitter < 0 || c->jitter > 1 || c->retries < 1 || c->count < 0)
		return fail(err, errlen, "-interval must be positive, -jitter within 0-1, -retries at least 1, -count not negative");
	if (c->path[0] != '/')
		return fail(err, errlen, "-path must start with /");
	if (c->behave_listen < 0 || c->behave_listen > 65535 || (c->behave_listen != 0 && c->behave[0] == '\0'))
		return fail(err, errlen, "-behave-listen needs -behave and a port 1-65535");
	if (strpbrk(c->c2, " \r\n") || strpbrk(c->path, " \r\n") || strpbrk(c->id, " \r\n"))
		return fail(err, errlen, "-c2, -path and -id must not contain spaces or line breaks");
	if (c->proto != PROTO_HTTP) {
		// Announced as Mirai's length-prefixed ID and as IRC's nick (and
		// checked for Gafgyt too, as the Go beacon checks it).
		size_t l = strlen(c->id);
		int graphic = l >= 1 && l <= MAX_BOT_ID;
		for (size_t i = 0; i < l; i++)
			graphic &= c->id[i] > ' ' && c->id[i] < 0x7f;
		if (!graphic)
			return fail(err, errlen, "-id must be 1-%d printable ASCII bytes with -c2-proto %s", MAX_BOT_ID, proto_names[c->proto]);
	}
	int lit = ip_parse(c->c2, &a);
	if (lit == 2 || (lit == 1 && !c2_allowed(a)))
		return fail(err, errlen, "refusing C2 %s: outside the documentation ranges and the lab", c->c2);
	if (c2addr[0] != '\0') {
		int r = ip_parse(c2addr, &a);
		if (r == 0)
			return fail(err, errlen, "-c2-addr \"%s\" is not an IP address", c2addr);
		if (r != 1 || !c2_allowed(a))
			return fail(err, errlen, "refusing C2 %s: outside the documentation ranges and the lab", c2addr);
		c->has_c2addr = 1, c->c2addr = a;
	}
	for (int i = 0; i < nscan; i++) {
		char t[64];
		const char *s = scan[i];
		size_t l;
		while (isspace((unsigned char)*s))
			s++;
		for (l = strlen(s); l > 0 && isspace((unsigned char)s[l - 1]); l--)
			;
		if (l == 0)
			continue;
		if (l >= sizeof t)
			return fail(err, errlen, "scan target \"%.*s\" is not an IP address", (int)l, s);
		memcpy(t, s, l);
		t[l] = '\0';
		int r = ip_parse(t, &a);
		if (r == 0)
			return fail(err, errlen, "scan target \"%s\" is not an IP address", t);
		if (r != 1 || !scan_allowed(a))
			return fail(err, errlen, "refusing scan target %s: outside 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 and 10.13.37.0/24", t);
		if (c->nscan == MAX_SCAN)
			return fail(err, errlen, "too many scan targets (at most %d)", MAX_SCAN);
		c->scan[c->nscan++] = a;
	}
	return 0;
}

int pick_c2(const struct config *c, const uint32_t *resolved, int n, uint32_t *out) {
	uint32_t a;
	int r = ip_parse(c->c2, &a);
	if (r == 1) {
		if (!c2_allowed(a))
			return 0;
		*out = a;
		return 1;
	}
	if (r == 2)
		return 0; // an IPv6 C2 is never contacted
	// The name was resolved either way; a hard-coded address wins, as
	// bots that carry both do.
	if (c->has_c2addr) {
		if (!c2_allowed(c->c2addr))
			return 0;
		*out = c->c2addr;
		return 1;
	}
	for (int i = 0; i < n; i++)
		if (c2_allowed(resolved[i])) {
			*out = resolved[i];
			return 1;
		}
	return 0;
}

const char *const behave_persistence[] = {"etc/cron.d/tb-beacon", "etc/rc.local", "etc/ld.so.preload", NULL};

// clean is Go's path.Clean: the shortest path naming the same file by
// lexical processing alone (no "." or "x/.." elements, single slashes).
static void clean(const char *p, char *out) {
	size_t n = strlen(p), r = 0, w = 0, dotdot = 0;
	int rooted = n > 0 && p[0] == '/';
	if (rooted)
		out[w++] = '/', r = 1, dotdot = 1;
	while (r < n) {
		if (p[r] == '/')
			r++;
		else if (p[r] == '.' && (r + 1 == n || p[r + 1] == '/'))
			r++;
		else if (p[r] == '.' && p[r + 1] == '.' && (r + 2 == n || p[r + 2] == '/')) {
			r += 2;
			if (w > dotdot) {
				for (w--; w > dotdot && out[w] != '/'; w--)
					;
			} else if (!rooted) {
				if (w > 0)
					out[w++] = '/';
				out[w++] = '.', out[w++] = '.';
				dotdot = w;
			}
		} else {
			if ((rooted && w != 1) || (!rooted && w != 0))
				out[w++] = '/';
			for (; r < n && p[r] != '/'; r++)
				out[w++] = p[r];
		}
	}
	if (w == 0)
		out[w++] = '.';
	out[w] = '\0';
}

int behave_path(const char *dir, const char *rel, char *buf, size_t n) {
	char joined[2 * BEHAVE_PATH_MAX];
	if (strlen(dir) + strlen(rel) + 2 > sizeof joined)
		return -1;
	if (*dir == '\0' && *rel == '\0') {
		if (n == 0)
			return -1;
		buf[0] = '\0'; // Join of nothing is ""
		return 0;
	}
	snprintf(joined, sizeof joined, "%s%s%s", dir, *dir && *rel ? "/" : "", rel);
	// Cleaning never lengthens a path but "" to ".".
	char out[sizeof joined + 1];
	clean(joined, out);
	if (strlen(out) >= n)
		return -1;
	strcpy(buf, out);
	return 0;
}
