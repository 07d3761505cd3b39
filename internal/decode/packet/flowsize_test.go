package packet

import (
	"testing"
	"unsafe"
)

// The flow table is most of tb-parse's live heap on a capture of many
// small conversations: a flow past 512 bytes is allocated in the 576-byte
// size class, 64 bytes more for every connection held.
func TestFlowFitsIn512Bytes(t *testing.T) {
	if n := unsafe.Sizeof(flow{}); n > 512 {
		t.Errorf("a flow is %d bytes, more than 512", n)
	}
}
