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
	if (strcmp(argv[1], "join") == 0) {
		char p[BEHAVE_PATH_MAX];
		for (int i = 2; i + 1 < argc; i += 2)
			printf("%s\n", behave_path(argv[i], argv[i + 1], p, sizeof p) < 0 ? "error" : p);
		return 0;
	}
	return 2;
}
