// A host driver for the C beacon's policy (policy.c), linked with that
// file alone: the test asks it what the beacon would accept and contact,
// and never runs the beacon itself.
//
//   policy_driver addr TEXT...              one line per TEXT: kind scan c2 resolver ip
//   policy_driver args ARG...               the beacon's parse_args on ARG...
//   policy_driver pick RESOLVED|fail ARG... pick_c2 after parse_args, RESOLVED comma-separated
//   policy_driver behave DIR...             per DIR, what -behave DIR names: its process name,
//                                           the dropped file, the persistence files
//   policy_driver join DIR REL...           per pair, behave_path(DIR, REL) (or "error")
//   policy_driver frames spoof|arp MAC IP/BITS GWMAC ARG...
//                                           the hostile frames, in hex one a line, from a
//                                           link with MAC and IP/BITS, after parse_args on ARG...
#define _POSIX_C_SOURCE 200809L
#include "../policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_config(const struct config *c) {
	char ip[16];
	printf("c2=%s port=%d path=%s id=%s interval=%lld jitter=%g count=%ld retry=%lld retries=%ld timeout=%lld scan_port=%d",
		c->c2, c->port, c->path, c->id, (long long)c->interval_ns, c->jitter, c->count, (long long)c->retry_ns,
		c->retries, (long long)c->timeout_ns, c->scan_port);
	ip_format(c->c2addr, ip);
	printf(" behave=%s behave_listen=%d", c->behave, c->behave_listen);
	printf(" c2addr=%s scan=", c->has_c2addr ? ip : "");
	for (int i = 0; i < c->nscan; i++) {
		ip_format(c->scan[i], ip);
		printf("%s%s", i ? "," : "", ip);
	}
	const struct hostile *h = &c->hostile;
	printf(" hostile=");
	if (h->modes != 0) {
		char mac[18], ap[3][24];
		for (int i = 0; i < h->norder; i++)
			printf("%s%s", i ? "," : "", hostile_mode_names[h->order[i]]);
		printf(" iface=%s", h->iface);
		ip_format(h->gateway, ip);
		printf(" gw=%s", h->has_gateway ? ip : "");
		mac_format(h->gateway_mac, mac);
		printf(" gwmac=%s", h->has_gateway_mac ? mac : "");
		ip_format(h->neighbour, ip);
		printf(" nb=%s", h->has_neighbour ? ip : "");
		mac_format(h->neighbour_mac, mac);
		printf(" nbmac=%s", h->has_neighbour_mac ? mac : "");
		const uint32_t a[3] = {h->neighbour_c2, h->http, h->aim};
		const int port[3] = {h->neighbour_c2_port, h->http_port, h->aim_port}, has[3] = {h->has_neighbour_c2, h->has_http, h->has_aim};
		for (int i = 0; i < 3; i++) {
			ip_format(a[i], ip);
			snprintf(ap[i], sizeof ap[i], "%s:%d", ip, port[i]);
			if (!has[i])
				ap[i][0] = '\0';
		}
		ip_format(h->spray, ip);
		printf(" nbc2=%s http=%s aim=%s aimcount=%ld aiminterval=%lld spray=%s sprayports=%ld dns=%ld dnsdomain=%s",
			ap[0], ap[1], ap[2], h->aim_count, (long long)h->aim_interval_ns, h->has_spray ? ip : "", h->spray_ports,
			h->dns_burst, h->dns_domain);
	}
	// Only a session protocol is printed: the HTTP line is the Go beacon's.
	if (c->proto != PROTO_HTTP)
		printf(" proto=%s", proto_names[c->proto]);
	printf("\n");
}

int main(int argc, char **argv) {
	static struct config c;
	char err[512], ip[16];
	if (argc < 2)
		return 2;
	if (strcmp(argv[1], "addr") == 0) {
		for (int i = 2; i < argc; i++) {
			uint32_t a = 0;
			int k = ip_parse(argv[i], &a);
			ip_format(a, ip);
			printf("%d %d %d %d %s\n", k, k == 1 && scan_allowed(a), k == 1 && c2_allowed(a), k == 1 && resolver_allowed(a), ip);
		}
		return 0;
	}
	if (strcmp(argv[1], "args") == 0) {
		argv[1] = "beacon";
		if (parse_args(argc - 1, argv + 1, &c, err, sizeof err) < 0) {
			printf("error: %s\n", err);
			return 0;
		}
		print_config(&c);
		return 0;
	}
	if (strcmp(argv[1], "pick") == 0 && argc > 2) {
		uint32_t got[64], out;
		int n = 0;
		if (strcmp(argv[2], "fail") == 0)
			n = -1;
		else
			for (char *s = strtok(argv[2], ","); s && n < 64; s = strtok(NULL, ","))
				if (ip_parse(s, &got[n]) == 1)
					n++;
		argv[2] = "beacon";
		if (parse_args(argc - 2, argv + 2, &c, err, sizeof err) < 0) {
			printf("error: %s\n", err);
			return 0;
		}
		if (!pick_c2(&c, got, n, &out)) {
			printf("refused\n");
			return 0;
		}
		ip_format(out, ip);
		printf("%s\n", ip);
		return 0;
	}
	if (strcmp(argv[1], "behave") == 0) {
		char p[BEHAVE_PATH_MAX];
		for (int i = 2; i < argc; i++) {
			printf("%s", BEHAVE_NAME);
			behave_path(argv[i], BEHAVE_DROPPED, p, sizeof p);
			printf(" %s", p);
			for (int j = 0; behave_persistence[j]; j++) {
				behave_path(argv[i], behave_persistence[j], p, sizeof p);
				printf(" %s", p);
			}
			printf("\n");
		}
		return 0;
	}
	if (strcmp(argv[1], "frames") == 0 && argc > 6) {
		struct hostile_link l = {2, {0}, 0, 0};
		unsigned char gw[6];
		struct frame frames[SPOOF_VARIANTS > ARP_FRAMES ? SPOOF_VARIANTS : ARP_FRAMES];
		unsigned m[6];
		char *slash = strchr(argv[4], '/');
		if (!slash || sscanf(argv[3], "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6)
			return 2;
		for (int i = 0; i < 6; i++)
			l.mac[i] = (unsigned char)m[i];
		*slash = '\0';
		l.bits = atoi(slash + 1);
		if (ip_parse(argv[4], &l.ip) != 1 || sscanf(argv[5], "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6)
			return 2;
		for (int i = 0; i < 6; i++)
			gw[i] = (unsigned char)m[i];
		int spoof = strcmp(argv[2], "spoof") == 0;
		argv[5] = "beacon";
		if (parse_args(argc - 5, argv + 5, &c, err, sizeof err) < 0 ||
			(spoof ? spoof_frames(&c.hostile, &l, gw, frames, err, sizeof err) : arp_frames(&c.hostile, &l, frames, err, sizeof err)) < 0) {
			printf("error: %s\n", err);
			return 0;
		}
		for (int i = 0; i < (spoof ? SPOOF_VARIANTS : ARP_FRAMES); i++) {
			for (size_t j = 0; j < frames[i].len; j++)
				printf("%02x", frames[i].b[j]);
			printf("\n");
		}
		return 0;
	}
	if (strcmp(argv[1], "join") == 0) {
		char p[BEHAVE_PATH_MAX];
		for (int i = 2; i + 1 < argc; i += 2)
			printf("%s\n", behave_path(argv[i], argv[i + 1], p, sizeof p) < 0 ? "error" : p);
		return 0;
	}
	return 2;
}
