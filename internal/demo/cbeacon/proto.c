// Not Go: the tag keeps the go tool from taking this directory's C for cgo.
//go:build ignore

// The bot protocols' bytes (proto.h), as the Go beacon, the demo C2 server
// (internal/demo/c2) and tb-parse's recognisers (internal/observe/botproto)
// have them: Mirai's binary hello, keep-alive and length-prefixed orders,
// Gafgyt's text lines, IRC's RFC 1459 lines. No networking here.
#define _POSIX_C_SOURCE 200809L
#include "proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void say(char *why, size_t n, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
}

size_t chan_hello(int proto, const char *id, unsigned char *out, size_t cap) {
	size_t l = strlen(id);
	int n = 0;
	switch (proto) {
	case PROTO_MIRAI:
		// 00 00 00 01 (the hello), then the ID with its one-byte length;
		// parse_args keeps it within MAX_BOT_ID.
		if (l > MAX_BOT_ID || cap < 5 + l)
			return 0;
		memcpy(out, "\0\0\0\1", 4);
		out[4] = (unsigned char)l;
		memcpy(out + 5, id, l);
		return 5 + l;
	case PROTO_GAFGYT:
		n = snprintf((char *)out, cap, "BUILD TALKBOX\n");
		break;
	case PROTO_IRC:
		n = snprintf((char *)out, cap, "NICK %s\r\nUSER %s 0 * :talkbox\r\n", id, id);
		break;
	}
	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

size_t chan_keepalive(int proto, unsigned char *out) {
	if (proto != PROTO_MIRAI)
		return 0;
	out[0] = 0, out[1] = 0;
	return 2;
}

size_t chan_room(const struct chan *c) { return sizeof c->buf - c->n; }

static void consume(struct chan *c, size_t k) {
	memmove(c->buf, c->buf + k, c->n - k);
	c->n -= k;
}

// Mirai's vectors by number, as its operators' console and botproto name them.
static const char *const mirai_vectors[] = {"udp", "vse", "dns", "syn", "ack", "stomp", "greip", "greeth", "proxy", "udpplain", "http"};
#define MIRAI_OPT_LEN 0
#define MIRAI_OPT_DPORT 7

// text copies at most n-1 bytes of s (l long) to out, a '?' for each byte
// outside printable ASCII: the C2's words reach the log only so.
static void text(char *out, size_t n, const unsigned char *s, size_t l) {
	size_t i = 0;
	for (; i < l && i + 1 < n; i++)
		out[i] = s[i] >= ' ' && s[i] < 0x7f ? (char)s[i] : '?';
	out[i] = '\0';
}

// number reads l decimal digits (leading zeros allowed, as strconv's
// ParseUint has them) up to max; -1 for anything else.
static long long number(const unsigned char *s, size_t l, long long max) {
	long long v = 0;
	if (l == 0)
		return -1;
	for (size_t i = 0; i < l; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
		if (v > max)
			return -1;
	}
	return v;
}

static void order_init(struct order *o, int proto) {
	memset(o, 0, sizeof *o);
	o->proto = proto;
	o->port = -1, o->len = -1, o->netmask = -1;
}

int mirai_order(const unsigned char *b, size_t l, struct order *o) {
	const unsigned char *p = b + 2;
	size_t left = l < 2 ? 0 : l - 2;
	int has_port = 0, has_len = 0;
	order_init(o, PROTO_MIRAI);
	if (left < 7)
		return -1;
	o->seconds = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
	o->has_seconds = 1;
	if (p[4] < sizeof mirai_vectors / sizeof mirai_vectors[0])
		snprintf(o->vector, sizeof o->vector, "%s", mirai_vectors[p[4]]);
	else
		snprintf(o->vector, sizeof o->vector, "vector%d", p[4]);
	o->targets = p[5];
	p += 6, left -= 6;
	if (o->targets == 0 || left < (size_t)o->targets * 5 + 1)
		return -1;
	for (int i = 0; i < o->targets; i++, p += 5, left -= 5) {
		if (p[4] > 32)
			return -1;
		if (i == 0) {
			o->target = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
			o->prefix = p[4];
		}
	}
	int opts = p[0];
	p++, left--;
	for (int i = 0; i < opts; i++) {
		if (left < 2 || left < 2 + (size_t)p[1])
			return -1;
		int key = p[0];
		size_t vl = p[1];
		// The first of a repeated option counts, as in Mirai's bot.
		if (key == MIRAI_OPT_DPORT && !has_port) {
			long long v = number(p + 2, vl, 65535);
			o->port = v >= 1 ? (long)v : -1;
			has_port = 1;
		}
		if (key == MIRAI_OPT_LEN && !has_len) {
			o->len = (long)number(p + 2, vl, 65535);
			has_len = 1;
		}
		p += 2 + vl, left -= 2 + vl;
	}
	return left == 0 ? 0 : -1;
}

static int space(unsigned char ch) { return ch == ' ' || ch == '\t' || ch == '\v' || ch == '\f' || ch == '\r' || ch == '\n'; }

// text_order reads an order's words: VECTOR TARGET PORT SECONDS, as IRC's
// "!udp" and the HTTP task have them (exactly four words), or as Gafgyt's
// "!* UDP" (then Bashlite's netmask, packet size and poll interval). The
// vector is kept in lower case, as Mirai's are named. What is missing or
// malformed is said in o->bad.
static void text_order(int proto, const unsigned char *s, size_t l, struct order *o) {
	const unsigned char *w[6];
	size_t wl[6], nw = 0;
	order_init(o, proto);
	for (size_t i = 0; i < l && nw < 6;) {
		if (space(s[i])) {
			i++;
			continue;
		}
		w[nw] = s + i;
		for (wl[nw] = 0; i < l && !space(s[i]); i++)
			wl[nw]++;
		nw++;
	}
	if (nw < 4 || (proto != PROTO_GAFGYT && nw != 4)) {
		say(o->bad, sizeof o->bad, "want VECTOR TARGET PORT SECONDS");
		return;
	}
	text(o->vector, sizeof o->vector, w[0], wl[0]);
	for (char *v = o->vector; *v; v++)
		if (*v >= 'A' && *v <= 'Z')
			*v = (char)(*v - 'A' + 'a');
	char t[64];
	if (wl[1] >= sizeof t) {
		say(o->bad, sizeof o->bad, "target is not an IPv4 address");
		return;
	}
	memcpy(t, w[1], wl[1]);
	t[wl[1]] = '\0';
	if (ip_parse(t, &o->target) != 1) {
		say(o->bad, sizeof o->bad, "target is not an IPv4 address");
		return;
	}
	o->targets = 1, o->prefix = 32;
	long long v = number(w[2], wl[2], 65535);
	if (v < 1) {
		say(o->bad, sizeof o->bad, "port is not 1-65535");
		return;
	}
	o->port = (long)v;
	v = number(w[3], wl[3], 0xffffffffLL);
	if (v < 1) {
		say(o->bad, sizeof o->bad, "duration is not a positive number of seconds");
		return;
	}
	o->seconds = (uint32_t)v, o->has_seconds = 1;
	if (nw > 4)
		o->netmask = (long)number(w[4], wl[4], 32);
}

// mirai_next reads the C2's side of a Mirai session: a two-byte length,
// 0 for the keep-alive's echo, else an order of that many bytes.
static int mirai_next(struct chan *c, struct order *o, char *why, size_t wlen) {
	if (c->n < 2)
		return EV_NEED;
	size_t l = (size_t)c->buf[0] << 8 | c->buf[1];
	if (l == 0) {
		consume(c, 2);
		return EV_KEEPALIVE;
	}
	if (l < 2 || l > sizeof c->buf) {
		say(why, wlen, "mirai message length %zu", l);
		return EV_BAD;
	}
	if (c->n < l)
		return EV_NEED;
	int r = mirai_order(c->buf, l, o);
	consume(c, l);
	if (r < 0) {
		say(why, wlen, "malformed mirai order of %zu bytes", l);
		return EV_OTHER;
	}
	return EV_ORDER;
}

// line_next reads one line of a text protocol into line (NUL-terminated,
// its "\n" and any "\r" before it cut off); EV_NEED, EV_OTHER for a line it
// skips, or EV_ORDER meaning "a line is here". A line of MAX_LINE bytes or
// more is skipped, as the Go beacon's reader skips it.
static int line_next(struct chan *c, unsigned char *line, size_t *ll, char *why, size_t wlen) {
	if (c->skipping) {
		unsigned char *nl = memchr(c->buf, '\n', c->n);
		if (!nl) {
			c->n = 0;
			return EV_NEED;
		}
		consume(c, (size_t)(nl - c->buf) + 1);
		c->skipping = 0;
	}
	unsigned char *nl = memchr(c->buf, '\n', c->n < MAX_LINE ? c->n : MAX_LINE);
	if (!nl) {
		if (c->n < MAX_LINE)
			return EV_NEED;
		consume(c, MAX_LINE);
		c->skipping = 1;
		say(why, wlen, "line of more than %d bytes skipped", MAX_LINE);
		return EV_OTHER;
	}
	size_t l = (size_t)(nl - c->buf);
	memcpy(line, c->buf, l);
	consume(c, l + 1);
	while (l > 0 && line[l - 1] == '\r')
		l--;
	line[l] = '\0';
	if (memchr(line, '\0', l)) {
		say(why, wlen, "a line with a NUL byte");
		return EV_OTHER;
	}
	*ll = l;
	return EV_ORDER;
}

static int gafgyt_line(const unsigned char *line, size_t l, struct order *o, unsigned char *reply, size_t *rlen, char *why, size_t wlen) {
	if (l == 4 && memcmp(line, "PING", 4) == 0) {
		*rlen = (size_t)snprintf((char *)reply, MAX_REPLY, "PONG\n");
		return EV_PING;
	}
	if (l > 3 && memcmp(line, "!* ", 3) == 0) {
		text_order(PROTO_GAFGYT, line + 3, l - 3, o);
		return EV_ORDER;
	}
	say(why, wlen, "gafgyt line not acted on");
	return EV_OTHER;
}

static int printable(const char *s) {
	for (; *s; s++)
		if (*s < ' ' || *s >= 0x7f)
			return 0;
	return 1;
}

// irc_line reads a line as RFC 1459 has it: an optional ":prefix", the
// command, its parameters, the trailing one after " :".
static int irc_line(const unsigned char *line, size_t l, struct order *o, unsigned char *reply, size_t *rlen, char *why, size_t wlen) {
	const char *s = (const char *)line, *end = s + l;
	if (*s == ':') {
		const char *sp = strchr(s, ' ');
		s = sp ? sp + 1 : end;
	}
	const char *colon = strstr(s, " :"), *mid_end = colon ? colon : end;
	const char *trailing = colon ? colon + 2 : NULL;
	while (s < mid_end && space((unsigned char)*s))
		s++;
	size_t vl = 0;
	while (s + vl < mid_end && !space((unsigned char)s[vl]))
		vl++;
	const char *params = s + vl;
	while (params < mid_end && space((unsigned char)*params))
		params++;
	if (vl == 4 && strncasecmp(s, "PING", 4) == 0) {
		// The token goes back as it came, if printable: it is the server's.
		char token[MAX_LINE];
		size_t tl = 0;
		if (trailing)
			tl = (size_t)snprintf(token, sizeof token, "%s", trailing);
		else {
			while (params + tl < mid_end && !space((unsigned char)params[tl]))
				tl++;
			memcpy(token, params, tl);
			token[tl] = '\0';
		}
		if (!printable(token)) {
			say(why, wlen, "PING with an unprintable token");
			return EV_OTHER;
		}
		*rlen = (size_t)snprintf((char *)reply, MAX_REPLY, "PONG :%s\r\n", token);
		return EV_PING;
	}
	if (vl == 3 && memcmp(s, "001", 3) == 0) {
		*rlen = (size_t)snprintf((char *)reply, MAX_REPLY, "JOIN #tb beacon\r\n");
		return EV_WELCOME;
	}
	if (vl == 7 && strncasecmp(s, "PRIVMSG", 7) == 0 && trailing && trailing[0] == '!') {
		text_order(PROTO_IRC, (const unsigned char *)trailing + 1, (size_t)(end - trailing - 1), o);
		return EV_ORDER;
	}
	say(why, wlen, "irc line not acted on");
	return EV_OTHER;
}

int chan_next(struct chan *c, struct order *o, unsigned char *reply, size_t *rlen, char *why, size_t wlen) {
	unsigned char line[CHAN_BUF + 1];
	size_t ll;
	*rlen = 0;
	why[0] = '\0';
	if (c->proto == PROTO_MIRAI)
		return mirai_next(c, o, why, wlen);
	int ev = line_next(c, line, &ll, why, wlen);
	if (ev != EV_ORDER)
		return ev;
	ev = c->proto == PROTO_GAFGYT ? gafgyt_line(line, ll, o, reply, rlen, why, wlen) : irc_line(line, ll, o, reply, rlen, why, wlen);
	if (*rlen >= MAX_REPLY) { // cannot happen for a line that fit the buffer; never send a cut reply
		*rlen = 0;
		say(why, wlen, "reply too long");
		return EV_OTHER;
	}
	return ev;
}

int order_from_task(const char *task, struct order *o) {
	if (task[0] == '\0' || strcmp(task, "sleep") == 0)
		return -1;
	text_order(PROTO_HTTP, (const unsigned char *)task, strlen(task), o);
	return 0;
}

int order_check(const struct order *o, char *err, size_t errlen) {
	char ip[16];
	ip_format(o->target, ip);
	if (o->bad[0] != '\0')
		return say(err, errlen, "%s", o->bad), -1;
	// The UDP floods alone; Gafgyt's bot has only UDP.
	if (strcmp(o->vector, "udp") != 0 && (o->proto == PROTO_GAFGYT || strcmp(o->vector, "udpplain") != 0))
		return say(err, errlen, "vector %s not carried out", o->vector), -1;
	if (o->targets != 1 || o->prefix != 32)
		return say(err, errlen, "%d targets of /%d: one address only", o->targets, o->prefix), -1;
	if (o->netmask != -1 && o->netmask != 32)
		return say(err, errlen, "netmask %ld: one address only", o->netmask), -1;
	if (!attack_allowed(o->target))
		return say(err, errlen, "target %s outside 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24", ip), -1;
	if (o->port < 1 || o->port > 65535)
		return say(err, errlen, "no destination port"), -1;
	if (!o->has_seconds || o->seconds == 0)
		return say(err, errlen, "no duration"), -1;
	return 0;
}

int attack_plan_for(const struct order *o, long budget, struct attack_plan *p) {
	int64_t seconds = o->seconds < ATTACK_MAX_SECONDS ? o->seconds : ATTACK_MAX_SECONDS;
	if (budget <= 0)
		return -1;
	memset(p, 0, sizeof *p);
	p->target = o->target;
	p->port = (int)o->port;
	p->packets = seconds * ATTACK_PPS;
	if (p->packets > budget)
		p->packets = budget;
	if (p->packets > ATTACK_MAX_PACKETS)
		p->packets = ATTACK_MAX_PACKETS;
	p->gap_ns = 1000000000LL / ATTACK_PPS;
	p->duration_ns = seconds * 1000000000LL;
	p->random = strcmp(o->vector, "udp") == 0;
	return 0;
}
