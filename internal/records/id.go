package records

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
)

// Crockford's base32: sorts like the numbers it encodes and has no I, L, O, U.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// NewID returns "<kind>_<26 chars>": 48 bits of Unix milliseconds followed by
// 80 random bits, so IDs of one kind sort by creation time.
func NewID(kind string, now time.Time) string {
	var raw [16]byte
	ms := uint64(now.UnixMilli())
	binary.BigEndian.PutUint16(raw[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(raw[2:6], uint32(ms))
	if _, err := rand.Read(raw[6:]); err != nil {
		panic("records: crypto/rand failed: " + err.Error())
	}
	return kind + "_" + encodeULID(raw)
}

func encodeULID(raw [16]byte) string {
	hi := binary.BigEndian.Uint64(raw[0:8])
	lo := binary.BigEndian.Uint64(raw[8:16])
	var out [26]byte
	// 128 bits in 26 base32 digits: the first digit carries the top 3 bits.
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// KindOf returns the kind prefix of an ID ("plan" for "plan_01J…").
func KindOf(id string) string {
	i := strings.LastIndexByte(id, '_')
	if i < 0 {
		return ""
	}
	return id[:i]
}

// CheckID reports whether id has the form <kind>_<26 Crockford digits>. IDs
// become file names, so nothing else is accepted.
func CheckID(id string) error {
	i := strings.LastIndexByte(id, '_')
	if i <= 0 || len(id)-i-1 != 26 || !ValidKind(id[:i]) {
		return fmt.Errorf("malformed id %q (want <kind>_<26 base32 chars>)", id)
	}
	for _, c := range []byte(id[i+1:]) {
		if !isCrockford(c) {
			return fmt.Errorf("malformed id %q (bad character %q)", id, c)
		}
	}
	return nil
}

// isCrockford reports whether c is one of crockford's characters.
func isCrockford(c byte) bool {
	switch {
	case '0' <= c && c <= '9', 'A' <= c && c <= 'H', 'P' <= c && c <= 'T', 'V' <= c && c <= 'Z':
		return true
	}
	return c == 'J' || c == 'K' || c == 'M' || c == 'N'
}

// ValidKind reports whether k is a lower-case snake_case kind name.
func ValidKind(k string) bool {
	if k == "" || len(k) > 32 || k[0] == '_' || k[len(k)-1] == '_' {
		return false
	}
	for _, c := range k {
		if (c < 'a' || c > 'z') && c != '_' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
