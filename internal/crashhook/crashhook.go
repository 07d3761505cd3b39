// Package crashhook lets tests kill a tool at a named point of its work, as
// kill -9 or Ctrl-C would, to test what it leaves behind, or make it panic
// there, as a bug reached by hostile input would. The hooks exist only in
// binaries built with the talkboxtest build tag (make test builds its test
// binaries so); in every other build At and Panic do nothing.
package crashhook
