// Not Go: the tag keeps the go tool from taking this directory's C for cgo.
//go:build ignore

// The bot protocols of -c2-proto: what the beacon sends on its session with
// the C2 and how it reads what the C2 sends, orders included. No
// networking here, so that a host test can link this file (with policy.c)
// and compare its bytes with the protocols' recognisers
// (internal/observe/botproto) without running the beacon. Every byte from
// the C2 is hostile: it is read into one fixed buffer, and no length it
// claims is trusted past the bytes that came.
#ifndef CBEACON_PROTO_H
#define CBEACON_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "policy.h"

// The C2's bytes not yet read. A Mirai order longer than CHAN_BUF (its bot
// refuses one over 1,024 bytes, length included) ends the session; a text
// line of MAX_LINE bytes or more (RFC 1459's 512, "\r\n" included) is
// skipped.
#define CHAN_BUF 1024
#define MAX_LINE 512

// chan is one session's reading side; zero it, then set proto.
struct chan {
	int proto;                  // enum c2_proto, not PROTO_HTTP
	unsigned char buf[CHAN_BUF]; // buf[0:n] is unread
	size_t n;
	int skipping; // text: discarding the rest of an over-long line
};

// What chan_next found in the C2's bytes.
enum chan_event {
	EV_NEED,      // nothing complete: read more (chan_room is never 0 then)
	EV_KEEPALIVE, // Mirai's echoed keep-alive
	EV_PING,      // a keep-alive to answer: the reply is set
	EV_WELCOME,   // IRC's 001: the reply (JOIN) is set
	EV_ORDER,     // an order, decoded into *o (order_check says whether to carry it out)
	EV_OTHER,     // a message the beacon does not act on (why says which)
	EV_BAD,       // the framing is lost: the session must end (why says how)
};

// The replies chan_next may set (and the bot's hello): at most a text line.
#define MAX_REPLY (MAX_LINE + 16)

// An order as the C2 sent it. Text fields are the C2's bytes, kept only as
// far as they are printable (the log prints them).
struct order {
	int proto;
	char vector[24]; // Mirai's by name ("udp", "udpplain", "vector42"), a text order's first word in lower case
	int targets;     // how many targets the order names (Mirai: its count)
	uint32_t target; // the first one
	int prefix;      // its prefix length (a text order's address: 32)
	long port;       // -1: none given, or not a number 1-65535
	uint32_t seconds;
	int has_seconds;
	long len;       // Mirai's len option, -1 when absent
	long netmask;   // Gafgyt's netmask word, -1 when absent or not a number 0-32
	char bad[64];   // "": well formed; else what is wrong with the order's words
};

// chan_hello writes what the bot sends as the session opens (Mirai's hello
// and ID, Gafgyt's BUILD line, IRC's NICK and USER) and returns its length.
size_t chan_hello(int proto, const char *id, unsigned char *out, size_t cap);

// chan_keepalive writes what the bot sends every period on its own (Mirai's
// 00 00; the text protocols answer the C2's PING instead) and returns its
// length, 0 when none.
size_t chan_keepalive(int proto, unsigned char *out);

// chan_room is how many more bytes c->buf takes (read them to buf + n).
size_t chan_room(const struct chan *c);

// chan_next takes the next complete message out of c->buf. reply (at
// least MAX_REPLY bytes) gets what to send back, *rlen its length (0: no
// reply); why gets a reason for EV_OTHER and EV_BAD.
int chan_next(struct chan *c, struct order *o, unsigned char *reply, size_t *rlen, char *why, size_t wlen);

// mirai_order decodes one order of l bytes, its length
// included: duration, vector, targets (address, prefix length), options
// (key, length, value). As Mirai's bot (and botproto) read it, an order
// whose parts do not add up to l exactly is not one: 0 decoded, -1 not an
// order. It reads nothing past b[l-1], whatever the order claims.
int mirai_order(const unsigned char *b, size_t l, struct order *o);

// order_from_task decodes the task of an HTTP C2's answer ("udp TARGET
// PORT SECONDS"); 0, or -1 when the task is no order ("sleep", or none).
int order_from_task(const char *task, struct order *o);

// The attack an order may start: UDP to one documentation address, paced
// at ATTACK_PPS, for at most ATTACK_MAX_SECONDS, and never more than
// ATTACK_MAX_PACKETS in the beacon's life, whatever the C2 orders.
#define ATTACK_PPS 200
#define ATTACK_MAX_SECONDS 5
#define ATTACK_MAX_PACKETS 1000
#define ATTACK_PAYLOAD 64

struct attack_plan {
	uint32_t target;
	int port;
	long packets;
	int64_t gap_ns, duration_ns;
	int random; // udp: a random payload; udpplain: the fixed one the Go beacon sends ("ABC…")
};


// order_check returns 0 when the beacon carries o out, or -1 with the
// reason: a well-formed order, of the UDP vectors (udp, udpplain; Gafgyt's
// udp alone), one IPv4 target in a documentation range (attack_allowed), a
// port and a duration.
int order_check(const struct order *o, char *err, size_t errlen);

// attack_plan_for plans a checked order's attack with budget packets left
// of ATTACK_MAX_PACKETS; 0, or -1 when the budget is spent.
int attack_plan_for(const struct order *o, long budget, struct attack_plan *p);

#endif
