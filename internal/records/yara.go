package records

import "encoding/json"

// ObsYara is the observable of a YARA rule that matched a file Talkbox
// keeps (a sample, a dropped file, a memory dump); its value is
// "NAMESPACE:RULE" and Yara says which file.
const ObsYara = "yara"

// YaraMatch is one rule that matched one file.
type YaraMatch struct {
	Rule      string            `json:"rule"`
	Namespace string            `json:"namespace"`
	Tags      []string          `json:"tags,omitempty"`
	Meta      map[string]string `json:"meta,omitempty"`
	// Strings are the rule's strings that matched, where (the first
	// yarascan.MaxStrings).
	Strings []YaraString `json:"strings,omitempty"`
}

// YaraString is one match of a rule's string in the file.
type YaraString struct {
	ID     string `json:"id"`
	Offset int64  `json:"offset"`
}

// YaraInfo is a yara observable's detail: the match and the file it is in.
type YaraInfo struct {
	YaraMatch
	// Target is what the file is: "sample", "dropped" or "memory".
	Target string `json:"target"`
	SHA256 string `json:"sha256"`
	// Artifact is the file's artifact record, when it has one (drops
	// and memory dumps); Sample its sample record.
	Artifact string `json:"artifact,omitempty"`
	Sample   string `json:"sample,omitempty"`
}

// yara writes a yara observable's detail: rare enough (one per rule and
// file) that encoding/json's speed does.
func (e *jsonAppender) yara(y *YaraInfo) {
	b, err := json.Marshal(y)
	if err != nil {
		return // nothing in YaraInfo fails to encode
	}
	e.key("yara")
	e.b = append(e.b, b...)
}
