package records

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a time.Duration written as Go duration text ("90s", "1h0m0s"),
// which is what people type in profiles and flags.
type Duration time.Duration

// D converts to time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n float64
		if json.Unmarshal(b, &n) == nil {
			*d = Duration(time.Duration(n * float64(time.Second)))
			return nil
		}
		return fmt.Errorf("duration must be a string like \"90s\" or a number of seconds")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q", s)
	}
	*d = Duration(v)
	return nil
}
