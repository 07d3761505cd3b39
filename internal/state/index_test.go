package state

import (
	"regexp"
	"testing"
)

func TestValidIndexKeyMatchesPattern(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)
	cases := []string{"", "a", "-a", "a-", ".", "a.b:c_d-e", "a b", "a\n", "é", "A0", "_x", ":x"}
	long := make([]byte, 201)
	for i := range long {
		long[i] = 'a'
	}
	cases = append(cases, string(long), string(long[:200]))
	for c := 0; c < 256; c++ {
		cases = append(cases, "a"+string(rune(c)), string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	for _, k := range cases {
		if validIndexKey(k) != re.MatchString(k) {
			t.Errorf("%q: validIndexKey %v, pattern %v", k, validIndexKey(k), re.MatchString(k))
		}
	}
}
