// Package lint holds checks of the source tree that go vet does not make.
package lint

import (
	"fmt"
	"go/ast"
	"go/types"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// TestWriteErrorsChecked fails for a discarded error of a write to a
// record stream or to a command's stdout: any Flush() error,
// records.Writer's Write and Line, and any write whose writer is named
// Stdout (env.Stdout, a sink's Stdout, os.Stdout): fmt.Fprint*, io.Copy*,
// io.WriteString, json.NewEncoder(...).Encode, a Write* or Encode method.
// Under cmd/, any call of the command's own that returns an error counts
// (its helpers print), and anywhere, a call of Talkbox's own that takes an
// io.Writer and returns an error (cycle.Summary.Text). Discarded is a bare call, a deferred or go call, or
// an assignment of every result to _. A tool whose stdout is a pipe learns that the reader
// went away, or that the disk filled, only from these errors; dropping
// them turns a truncated stream into exit 0. Writes to a *bufio.Writer
// are not checked: its error sticks and its Flush is.
func TestWriteErrorsChecked(t *testing.T) {
	cfg := &packages.Config{
		Mode:       packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:        "../..",
		BuildFlags: []string{"-tags", "talkboxtest"},
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		t.Fatal("the tree does not type-check")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			name := p.Fset.File(f.Pos()).Name()
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			rel, err := filepath.Rel(root, name)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					call := discarded(n)
					if call == nil {
						return true
					}
					what := discardsWriteError(p.TypesInfo, call)
					if what == "" && strings.HasPrefix(rel, "cmd"+string(filepath.Separator)) && ownCall(p.TypesInfo, call) {
						what = "an error of the command's own function"
					}
					if what == "" && writesTo(p.TypesInfo, call) {
						what = "an error of Talkbox's own function that writes to an io.Writer"
					}
					if what != "" {
						found = append(found, fmt.Sprintf("%s: %s", p.Fset.Position(call.Pos()), what))
					}
					return true
				})
			}
		}
	}
	if len(found) > 0 {
		t.Errorf("write errors discarded (return or check them):\n%s", strings.Join(found, "\n"))
	}
}

const stdoutWrite = "a write to stdout"

// ownCall reports whether call is to a function of the command's own
// (package main) that returns an error: a command's helpers print
// (printRecords), so their errors are write errors too.
func ownCall(info *types.Info, call *ast.CallExpr) bool {
	var fn *types.Func
	switch f := call.Fun.(type) {
	case *ast.SelectorExpr:
		fn, _ = info.Uses[f.Sel].(*types.Func)
	case *ast.Ident:
		fn, _ = info.Uses[f].(*types.Func)
	}
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Name() != "main" {
		return false
	}
	res := fn.Type().(*types.Signature).Results()
	return res.Len() > 0 && isError(res.At(res.Len()-1).Type())
}

// writesTo reports whether call is to a function of Talkbox's own that
// takes an io.Writer and returns an error (a report's Text, an export):
// its error is the writer's.
func writesTo(info *types.Info, call *ast.CallExpr) bool {
	var fn *types.Func
	switch f := call.Fun.(type) {
	case *ast.SelectorExpr:
		fn, _ = info.Uses[f.Sel].(*types.Func)
	case *ast.Ident:
		fn, _ = info.Uses[f].(*types.Func)
	}
	if fn == nil || fn.Pkg() == nil || !strings.HasPrefix(fn.Pkg().Path(), "github.com/talkbox-sandbox/talkbox/") {
		return false
	}
	sig := fn.Type().(*types.Signature)
	if res := sig.Results(); res.Len() == 0 || !isError(res.At(res.Len()-1).Type()) {
		return false
	}
	for i := range sig.Params().Len() {
		if n, ok := sig.Params().At(i).Type().(*types.Named); ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "io" && n.Obj().Name() == "Writer" {
			return true
		}
	}
	return false
}

// discarded is the call whose results statement n throws away: a bare,
// deferred or go call, or one whose every result is assigned to _.
func discarded(n ast.Node) *ast.CallExpr {
	switch s := n.(type) {
	case *ast.ExprStmt:
		c, _ := s.X.(*ast.CallExpr)
		return c
	case *ast.DeferStmt:
		return s.Call
	case *ast.GoStmt:
		return s.Call
	case *ast.AssignStmt:
		if len(s.Rhs) != 1 {
			return nil
		}
		for _, l := range s.Lhs {
			if id, ok := l.(*ast.Ident); !ok || id.Name != "_" {
				return nil
			}
		}
		c, _ := s.Rhs[0].(*ast.CallExpr)
		return c
	}
	return nil
}

// discardsWriteError says what call is when it is one of the checked
// writes (which, for the failure message), "" when it is not.
func discardsWriteError(info *types.Info, call *ast.CallExpr) string {
	var fn *types.Func
	var recv ast.Expr
	switch f := call.Fun.(type) {
	case *ast.SelectorExpr:
		fn, _ = info.Uses[f.Sel].(*types.Func)
		recv = f.X
	case *ast.Ident:
		fn, _ = info.Uses[f].(*types.Func)
	}
	if fn == nil {
		return ""
	}
	sig := fn.Type().(*types.Signature)
	if n := sig.Results().Len(); n == 0 || !isError(sig.Results().At(n-1).Type()) {
		return ""
	}
	if sig.Recv() == nil {
		switch fn.FullName() {
		case "fmt.Fprint", "fmt.Fprintf", "fmt.Fprintln", "io.Copy", "io.CopyN", "io.CopyBuffer", "io.WriteString":
			if isStdout(call.Args[0]) {
				return stdoutWrite
			}
		}
		return ""
	}
	switch fn.Name() {
	case "Flush":
		if sig.Params().Len() == 0 {
			return "a Flush"
		}
	case "Line":
		if recvIs(sig.Recv().Type(), "internal/records", "Writer") {
			return "a records.Writer write"
		}
	case "Write":
		if recvIs(sig.Recv().Type(), "internal/records", "Writer") {
			return "a records.Writer write"
		}
	}
	switch fn.Name() {
	case "Write", "WriteString", "WriteByte", "WriteRune", "Encode":
		if recvIs(sig.Recv().Type(), "bufio", "Writer") {
			return ""
		}
		if isStdout(recv) {
			return stdoutWrite
		}
		// json.NewEncoder(os.Stdout).Encode(v)
		if c, ok := recv.(*ast.CallExpr); ok && len(c.Args) == 1 && isStdout(c.Args[0]) {
			return stdoutWrite
		}
	}
	return ""
}

// isStdout reports whether e names a command's stdout: an identifier or
// a field called Stdout or stdout.
func isStdout(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.Ident:
		return strings.EqualFold(x.Name, "stdout")
	case *ast.SelectorExpr:
		return strings.EqualFold(x.Sel.Name, "stdout")
	case *ast.ParenExpr:
		return isStdout(x.X)
	}
	return false
}

func isError(t types.Type) bool {
	return types.Identical(t, types.Universe.Lookup("error").Type())
}

func recvIs(t types.Type, pkgSuffix, name string) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return false
	}
	return n.Obj().Name() == name && strings.HasSuffix(n.Obj().Pkg().Path(), pkgSuffix)
}
