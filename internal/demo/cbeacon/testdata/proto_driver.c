// A host driver for the C beacon's bot protocols (proto.c), linked with
// proto.c and policy.c alone: the test compares its bytes with the spec and
// with tb-parse's recognisers, and never runs the beacon itself.
//
//   proto_driver hello PROTO ID       the bytes the bot sends as its session opens, in hex
//   proto_driver keepalive PROTO      the bytes it sends every period on its own, in hex
//   proto_driver feed PROTO HEX...    the C2's bytes, fed chunk by chunk (each HEX one read):
//                                     one line per message (keepalive, ping, welcome, order,
//                                     other, bad), an order with its check and its plan; an
//                                     argument "--" ends a session (and prints "--"): the next
//                                     chunk starts a new one, with a new budget
//   proto_driver task TEXT            an HTTP C2's task, as an order line (or "none")
//   proto_driver order HEX...         each HEX a whole Mirai message, decoded from a buffer of
//                                     exactly its size (AddressSanitizer sees a read past it):
//                                     an order line, or "none"
#define _POSIX_C_SOURCE 200809L
#include "../proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int proto_of(const char *s) {
	for (int i = 0; i < PROTO_COUNT; i++)
		if (strcmp(s, proto_names[i]) == 0)
			return i;
	exit(2);
}

static void hex(const unsigned char *b, size_t n) {
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
}

// print_order prints o, its check and, when it passes, its plan with the
// budget left (which the plan then spends, as the beacon's attacks do).
static void print_order(const struct order *o, long *budget) {
	char ip[16], err[256];
	struct attack_plan p;
	ip_format(o->target, ip);
	printf("order proto=%s vector=%s targets=%d target=%s/%d port=%ld seconds=%lld len=%ld netmask=%ld: ", proto_names[o->proto],
		o->vector, o->targets, ip, o->prefix, o->port, o->has_seconds ? (long long)o->seconds : -1LL, o->len, o->netmask);
	if (order_check(o, err, sizeof err) < 0)
		printf("refused: %s\n", err);
	else if (attack_plan_for(o, *budget, &p) < 0)
		printf("refused: budget spent\n");
	else {
		ip_format(p.target, ip);
		printf("ok to=%s:%d packets=%ld gap_ns=%lld duration_ns=%lld random=%d\n", ip, p.port, p.packets,
			(long long)p.gap_ns, (long long)p.duration_ns, p.random);
		*budget -= p.packets;
	}
}

int main(int argc, char **argv) {
	unsigned char out[MAX_REPLY];
	long budget = ATTACK_MAX_PACKETS;
	if (argc == 4 && strcmp(argv[1], "hello") == 0) {
		size_t n = chan_hello(proto_of(argv[2]), argv[3], out, sizeof out);
		hex(out, n);
		printf("\n");
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "keepalive") == 0) {
		hex(out, chan_keepalive(proto_of(argv[2]), out));
		printf("\n");
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "task") == 0) {
		struct order o;
		if (order_from_task(argv[2], &o) < 0)
			printf("none\n");
		else
			print_order(&o, &budget);
		return 0;
	}
	if (strcmp(argv[1], "order") == 0) {
		for (int i = 2; i < argc; i++) {
			size_t l = strlen(argv[i]) / 2;
			unsigned char *b = malloc(l);
			struct order o;
			for (size_t k = 0; b && k < l; k++) {
				unsigned v;
				if (sscanf(argv[i] + 2 * k, "%2x", &v) != 1)
					return 2;
				b[k] = (unsigned char)v;
			}
			if (!b || l < 2)
				return 2;
			if (mirai_order(b, l, &o) < 0)
				printf("none\n");
			else
				print_order(&o, &budget);
			free(b);
			budget = ATTACK_MAX_PACKETS;
		}
		return 0;
	}
	if (argc < 3 || strcmp(argv[1], "feed") != 0)
		return 2;
	static struct chan c;
	c.proto = proto_of(argv[2]);
	int ended = 0;
	for (int i = 3; i < argc; i++) {
		const char *h = argv[i];
		if (strcmp(h, "--") == 0) {
			printf("--\n");
			memset(&c, 0, sizeof c);
			c.proto = proto_of(argv[2]);
			budget = ATTACK_MAX_PACKETS, ended = 0;
			continue;
		}
		if (ended)
			continue; // the session ended: the beacon reads no more of it
		size_t left = strlen(h) / 2;
		for (;;) {
			// Read what fits, as the beacon's recv does, then every message.
			size_t room = chan_room(&c), k;
			for (k = 0; k < left && k < room; k++) {
				unsigned v;
				if (sscanf(h + 2 * k, "%2x", &v) != 1)
					return 2;
				c.buf[c.n + k] = (unsigned char)v;
			}
			c.n += k, h += 2 * k, left -= k;
			for (;;) {
				struct order o;
				size_t rlen;
				char why[128];
				int ev = chan_next(&c, &o, out, &rlen, why, sizeof why);
				if (ev == EV_NEED) {
					if (chan_room(&c) == 0) {
						printf("stuck\n"); // the beacon could read no more
						return 1;
					}
					break;
				}
				switch (ev) {
				case EV_KEEPALIVE: printf("keepalive\n"); break;
				case EV_PING: printf("ping reply="), hex(out, rlen), printf("\n"); break;
				case EV_WELCOME: printf("welcome reply="), hex(out, rlen), printf("\n"); break;
				case EV_ORDER: print_order(&o, &budget); break;
				case EV_OTHER: printf("other: %s\n", why); break;
				case EV_BAD: printf("bad: %s\n", why), ended = 1; break;
				}
				if (ended)
					break;
			}
			if (left == 0 || ended)
				break;
		}
	}
	return 0;
}
