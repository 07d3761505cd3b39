// Not Go: the tag keeps the go tool from taking this directory's C for cgo.
//go:build ignore

// The C beacon's command line and address policy, kept apart from its
// networking so that a host test can link this alone and never run the
// sample (see cbeacon_test.go).
#ifndef CBEACON_POLICY_H
#define CBEACON_POLICY_H

#include <stddef.h>
#include <stdint.h>

#define MAX_SCAN 256 // the Go beacon has no limit; a fixed array needs one
#define MAX_TEXT 256 // -c2, -path, -id and -behave (a DNS name is at most 253)

struct config {
	char c2[MAX_TEXT];     // host name or address
	int has_c2addr;        // -c2-addr given: contacted whatever -c2 resolves to
	uint32_t c2addr;       // host byte order, as every address here
	int port;
	char path[MAX_TEXT];
	char id[MAX_TEXT];
	int64_t interval_ns;
	double jitter;         // fraction of interval, 0-1
	long count;            // beacons to send (0: until killed)
	int64_t retry_ns;
	long retries;          // attempts per beacon
	int64_t timeout_ns;    // of one check-in or probe
	uint32_t scan[MAX_SCAN];
	int nscan;
	int scan_port;
	char behave[MAX_TEXT]; // -behave's scratch directory ("": none)
	int behave_listen;     // -behave-listen's port (0: none)
};

// ip_parse reads an IPv4 address as Go's netip.ParseAddr does (dotted
// decimal, no leading zeros), unmapping ::ffff:a.b.c.d. It returns 1 for
// IPv4, 2 for any other IPv6 text (never allowed), 0 for not an address.
int ip_parse(const char *s, uint32_t *out);

int scan_allowed(uint32_t a); // 192.0.2/24, 198.51.100/24, 203.0.113/24, the lab 10.13.37/24
int c2_allowed(uint32_t a);   // scan networks, the sinkhole link 10.13.38/24, loopback
// resolver_allowed: the C2 networks and RFC 1918, never a public address,
// whatever /etc/resolv.conf says.
int resolver_allowed(uint32_t a);

// parse_args mirrors the Go beacon's Parse (same flags, same checks, same
// refusals). It returns 0, or -1 with a one-line reason in err.
int parse_args(int argc, char **argv, struct config *c, char *err, size_t errlen);

// pick_c2 chooses the address a check-in goes to, given what the C2 name
// resolved to (n < 0: the lookup failed): -c2-addr if given, else the first
// allowed address. It returns 1 with *out set, or 0 (refused or unresolved).
int pick_c2(const struct config *c, const uint32_t *resolved, int n, uint32_t *out);

void ip_format(uint32_t a, char buf[16]);

// What -behave does is named as the Go beacon's (internal/demo/beacon,
// behave.go), so that both leave the same trace: the process name it
// renames itself to, the file it drops and the persistence files it writes,
// all under the scratch directory.
#define BEHAVE_NAME "kworker/u:tb"
#define BEHAVE_DROPPED ".tbdrop"
#define BEHAVE_PATH_MAX 1024
extern const char *const behave_persistence[]; // NULL-terminated

// behave_path is Go's filepath.Join(dir, rel) (joined, then cleaned
// lexically) into buf; -1 if it does not fit.
int behave_path(const char *dir, const char *rel, char *buf, size_t n);

#endif
