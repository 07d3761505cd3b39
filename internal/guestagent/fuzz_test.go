package guestagent

import (
	"context"
	"testing"
	"time"
)

// FuzzReplies: the agent is the guest's (root can replace qemu-ga), so
// any reply to any command must leave the client with an error or a
// result within what it asked for, never a panic. The fuzzed reply
// answers one command; the fake agent answers the others as qemu-ga
// would.
func FuzzReplies(f *testing.F) {
	commands := []string{"guest-ping", "guest-exec", "guest-exec-status", "guest-file-open", "guest-file-seek", "guest-file-read", "guest-file-close", "guest-network-get-interfaces", "guest-get-time", "guest-set-time"}
	for i, reply := range []string{
		`{"return":{}}`,
		`{"return":{"pid":7}}`,
		`{"return":{"exited":true,"exitcode":0,"out-data":"aGk=","err-data":""}}`,
		`{"return":1000}`,
		`{"return":1795500967108906000}`,
		`{"return":{"position":10,"eof":false}}`,
		`{"return":{"count":2,"buf-b64":"aGk=","eof":true}}`,
		`{"error":{"class":"GenericError","desc":"no"}}`,
		`{"return":[{"name":"eth0","hardware-address":"52:54:00:00:00:01","ip-addresses":[{"ip-address-type":"ipv4","ip-address":"10.13.37.5","prefix":24}]}]}`,
	} {
		f.Add(uint8(i), reply)
	}
	f.Fuzz(func(t *testing.T, which uint8, reply string) {
		command := commands[int(which)%len(commands)]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fa := newFakeAgent()
		fa.files["/x"] = randomBytes(300)
		fa.reply = func(execute string, _ map[string]any) (string, bool) { return reply, execute == command }
		c := New(fa, "g")
		c.Ping(ctx)
		if pid, err := c.Spawn(ctx, []string{"/bin/true"}, nil, nil); err == nil {
			c.Status(ctx, pid)
		}
		c.Status(ctx, 1)
		for _, max := range []int{1, 100, 1000} {
			if b, err := c.ReadFileAt(ctx, "/x", 10, max); err == nil && len(b) > max {
				t.Fatalf("ReadFileAt of at most %d bytes gave %d", max, len(b))
			}
		}
		c.Interfaces(ctx)
		c.Addresses(ctx)
		c.Clock(ctx)
		c.SetClock(ctx, time.Now())
	})
}
