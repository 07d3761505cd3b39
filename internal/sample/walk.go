package sample

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/talkbox-sandbox/talkbox/internal/fault"
)

type dirKey struct{ dev, ino uint64 }

// Walk calls fn for every regular file under root, in lexical order,
// following symbolic links. A link back to a directory on the current path
// is reported as a loop (and not followed); other errors are reported per
// entry and the walk goes on.
func Walk(ctx context.Context, root string, fn func(path string), report func(error)) {
	walk(ctx, root, nil, fn, report)
}

func walk(ctx context.Context, path string, ancestors map[dirKey]string, fn func(string), report func(error)) {
	if ctx.Err() != nil {
		return
	}
	st, err := os.Stat(path)
	if err != nil {
		report(fault.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err))))
		return
	}
	if !st.IsDir() {
		if st.Mode().IsRegular() {
			fn(path)
		} else {
			report(fault.Failure(fmt.Errorf("%s: not a regular file", path)))
		}
		return
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		report(fault.Failure(fmt.Errorf("%s: cannot identify directory", path)))
		return
	}
	key := dirKey{uint64(sys.Dev), sys.Ino}
	if first, loop := ancestors[key]; loop {
		report(fault.Failure(fmt.Errorf("%s: directory loop (same directory as %s)", path, first)))
		return
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		report(fault.Failure(fmt.Errorf("%s: %w", path, unwrapPathErr(err))))
		return
	}
	next := make(map[dirKey]string, len(ancestors)+1)
	for k, v := range ancestors {
		next[k] = v
	}
	next[key] = path
	for _, e := range ents {
		if e.Type().IsRegular() {
			// Known from the directory entry: no stat (Prepare checks the
			// file it opens anyway).
			if ctx.Err() == nil {
				fn(filepath.Join(path, e.Name()))
			}
			continue
		}
		walk(ctx, filepath.Join(path, e.Name()), next, fn, report)
	}
}
