//go:build !talkboxtest

package crashhook

import "context"

// Enabled reports whether this binary was built with the hooks.
const Enabled = false

// At does nothing: this binary was built without the talkboxtest tag.
func At(context.Context, string, string) {}

// Panic does nothing: this binary was built without the talkboxtest tag.
func Panic(string, string) {}
