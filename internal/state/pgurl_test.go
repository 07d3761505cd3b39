package state

import "testing"

// TestTLSDefault: a database reached over the network is verified unless
// the URL says otherwise; a socket or loopback one is left alone.
func TestTLSDefault(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://tb:pw@db.example:5432/talkbox":            "postgres://tb:pw@db.example:5432/talkbox?sslmode=verify-full",
		"postgres://tb:pw@192.0.2.7/talkbox?pool_max_conns=4": "postgres://tb:pw@192.0.2.7/talkbox?pool_max_conns=4&sslmode=verify-full",
		"postgres://tb@[2001:db8::7]:5432/talkbox":            "postgres://tb@[2001:db8::7]:5432/talkbox?sslmode=verify-full",
		"postgres://tb@127.0.0.1,db.example/talkbox":          "postgres://tb@127.0.0.1,db.example/talkbox?sslmode=verify-full",
		"postgres://tb:pw@db.example/talkbox?sslmode=disable": "postgres://tb:pw@db.example/talkbox?sslmode=disable",
		"postgres://tb:pw@localhost:5432/talkbox":             "postgres://tb:pw@localhost:5432/talkbox",
		"postgres://tb:pw@127.0.0.1:5432/talkbox":             "postgres://tb:pw@127.0.0.1:5432/talkbox",
		"postgres://tb@[::1]/talkbox":                         "postgres://tb@[::1]/talkbox",
		"postgres:///talkbox?host=/run/postgresql":            "postgres:///talkbox?host=/run/postgresql",
		"postgres://%2Frun%2Fpostgresql/talkbox":              "postgres://%2Frun%2Fpostgresql/talkbox",
		"postgres:///talkbox":                                 "postgres:///talkbox",
		"postgres://tb@/talkbox?host=db.example":              "postgres://tb@/talkbox?host=db.example&sslmode=verify-full",
	} {
		if got := withTLSDefault(in); got != want {
			t.Errorf("withTLSDefault(%q) = %q, want %q", in, got, want)
		}
	}
}
