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

// The hostile modes (-hostile), as the Go beacon's (internal/demo/beacon,
// hostile.go): what a sample with root in its guest tries against the
// lab's containment. Each aims only at the documentation ranges and at
// addresses on the guest's own link inside 10.0.0.0/8, and stays small.
#define HOSTILE_NAMES 1 // Host:-only HTTP requests naming what nothing resolved
#define HOSTILE_SPOOF 2 // TCP SYNs with the neighbour's IPv4 source, MAC, or both
#define HOSTILE_ARP 4   // ARP replies claiming the gateway's and the neighbour's addresses
#define HOSTILE_AIM 8   // periodic connections to an address it never resolved
#define HOSTILE_SPRAY 16 // a port spray at one address and a burst of DNS queries
#define HOSTILE_MODES 5
extern const char *const hostile_mode_names[HOSTILE_MODES]; // the Go beacon's names, in its order

// The Go beacon's bounds and markers (hostile.go), which the tests share.
#define HOSTILE_REPEATS 3 // times -hostile names sends each name
#define SPOOF_SEQ 0x54420000u // "TB": the first spoofed SYN's sequence number
#define MAX_SPRAY_PORTS 256
#define MAX_DNS_BURST 256
#define MAX_AIM_COUNT 60
#define MIN_AIM_INTERVAL_NS 500000000LL
extern const char *const unresolved_hosts[]; // NULL-terminated: the names -hostile names sends
#define SPOOF_VARIANTS 5
extern const char *const spoof_variants[SPOOF_VARIANTS];

struct hostile {
	int modes;             // HOSTILE_* bits; 0: no -hostile
	int order[HOSTILE_MODES]; // the modes' indices in the order given
	int norder;
	char iface[MAX_TEXT];  // "": the interface on the gateway's link
	int has_gateway, has_gateway_mac, has_neighbour, has_neighbour_mac, has_neighbour_c2;
	uint32_t gateway, neighbour;
	unsigned char gateway_mac[6], neighbour_mac[6];
	uint32_t neighbour_c2;
	int neighbour_c2_port;
	int has_http, has_aim, has_spray;
	uint32_t http, aim, spray;
	int http_port, aim_port;
	long aim_count;
	int64_t aim_interval_ns;
	long spray_ports, dns_burst;
	char dns_domain[MAX_TEXT];
};

// The C2 protocols of -c2-proto, as the Go beacon and the demo C2 server
// (internal/demo/c2) speak them: HTTP check-ins, or one long-lived session
// speaking Mirai's, Gafgyt's or IRC's command channel (proto.h).
enum c2_proto { PROTO_HTTP, PROTO_MIRAI, PROTO_GAFGYT, PROTO_IRC, PROTO_COUNT };
extern const char *const proto_names[PROTO_COUNT];
#define MAX_BOT_ID 32 // Mirai's ID and IRC's nick: at most this many graphic bytes

struct config {
	char c2[MAX_TEXT];     // host name or address
	int proto;             // enum c2_proto
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
	struct hostile hostile;
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
void mac_format(const unsigned char mac[6], char buf[18]);

// hostile_doc_allowed: the documentation ranges, the only "internet" a
// hostile mode aims at; hostile_lab_allowed: the lab's range 10.0.0.0/8,
// where the gateway and the neighbour must be.
int hostile_doc_allowed(uint32_t a);
int hostile_lab_allowed(uint32_t a);
// attack_allowed: the documentation ranges alone, the only targets of an
// attack order the beacon carries out (never the lab, the sinkhole link or
// loopback).
int attack_allowed(uint32_t a);
// hostile_link_check is the Go beacon's checkLink: raw frames go out only
// on a link whose IPv4 network (own address ip, prefix length bits) is
// inside 10.0.0.0/8 and holds the gateway and the neighbour (where given).
// It returns 0, or -1 with the reason in err.
int hostile_link_check(const struct hostile *h, uint32_t ip, int bits, char *err, size_t errlen);

// hostile_link is the guest's own interface as the raw modes use it.
struct hostile_link {
	int index;
	unsigned char mac[6];
	uint32_t ip;
	int bits; // of its IPv4 network
};

// The raw modes' frames, built here so that a host test can decode them
// (the beacon sends them): spoof_frames the TCP SYNs -hostile spoof sends
// to the neighbour's C2 through the gateway, one per spoof_variants: with
// the neighbour's IPv4 source, with its MAC, with both; from the guest's
// MAC with an IPv6 source in the documentation prefix 2001:db8::/32 (the
// neighbour's IPv4 address in its last 32 bits, to the C2's likewise) and
// with 0.0.0.0; sequence numbers SPOOF_SEQ on; arp_frames the ARP replies
// -hostile arp sends from the guest's MAC: a gratuitous one claiming the
// gateway's address, one sent to the neighbour claiming the gateway's, a
// gratuitous one claiming the neighbour's. An IPv4 or ARP frame is padded
// to Ethernet's minimum, 60 bytes, as the Go beacon's (gopacket) are. Each
// returns 0, or -1 with err when a target is outside what a hostile mode
// may aim at or the link is not the lab's (hostile_link_check).
#define MAX_FRAME 80
#define ARP_FRAMES 3
struct frame {
	unsigned char b[MAX_FRAME];
	size_t len;
};
int spoof_frames(const struct hostile *h, const struct hostile_link *l, const unsigned char gw_mac[6],
	struct frame frames[SPOOF_VARIANTS], char *err, size_t errlen);
int arp_frames(const struct hostile *h, const struct hostile_link *l, struct frame frames[ARP_FRAMES], char *err, size_t errlen);

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
