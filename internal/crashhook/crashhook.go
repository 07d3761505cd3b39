// Package crashhook lets tests kill a tool at a named point of its work, as
// kill -9 or Ctrl-C would, to test what it leaves behind. The hooks exist
// only in binaries built with the talkboxtest build tag (make test builds
// its test binaries so); in every other build At does nothing.
package crashhook
